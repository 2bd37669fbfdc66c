# SPDX-License-Identifier: Apache-2.0
"""``insitu swift up|down|status|once``: a single-node OpenStack Swift cluster whose
devices are XFS file systems on insitu namespaces, for tests, demos and first tries.

``up DIR --ec K+M`` makes K+M devices (``d0`` ... ``d{K+M-1}``; one per URL when target
URLs are given), each an insitu namespace attached with ``insitu attach --format xfs`` at
``DIR/node/dN``, writes ``swift.conf``, the rings and the servers' configuration into DIR,
and starts memcached and the account, container, object and proxy servers on 127.0.0.1
under a supervisor in a private mount namespace where DIR is bind-mounted over
``/etc/swift`` (Swift always reads ``/etc/swift/swift.conf``; the real one is never
touched). ``down DIR`` stops everything and detaches the devices; the data stays (the
embedded images in ``DIR/images``, the rings, the hash path secrets), so ``up DIR`` again
brings back the same cluster with its objects.

``DIR/swift.json`` holds the cluster's state: the document ``up --json`` prints plus a
``private`` part (pids, mount namespace, embedded targets) that ``down`` and ``status``
use. Layout and rationale: ``docs/swift.md``.

This module does the work of each command (:func:`up`, :func:`down`, :func:`status`,
:func:`once`); their command line is :mod:`insitu.swift.cli`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

from . import _conf, _host, client
from ._host import ClusterError
from .._units import parse_size

#: The interpreter that has Swift and PyECLib (Debian's python3-swift).
SYSTEM_PYTHON = "/usr/bin/python3"
HERE = Path(__file__).resolve().parent
SUPERVISOR = HERE / "_supervisor.py"
RINGS = HERE / "_rings.py"
STATE = "swift.json"
#: XFS refuses file systems of 300 MB or less (xfsprogs 5.19 and later).
MIN_SIZE = 300 << 20
DEFAULT_SIZE = "512M"
#: Object daemons `once` runs, by the short name users give.
DAEMONS = {
    "auditor": "/usr/bin/swift-object-auditor",
    "reconstructor": "/usr/bin/swift-object-reconstructor",
    "replicator": "/usr/bin/swift-object-replicator",
    "updater": "/usr/bin/swift-object-updater",
}
NQN_PREFIX = "nqn.2024-01.io.insitu:swift-"
#: A clean environment for Swift's programs: the system Python's, not this package's.
SWIFT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def _load(dir: Path) -> Optional[dict]:
    try:
        return json.loads((dir / STATE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise ClusterError(f"{dir / STATE} cannot be read ({e}); it is insitu swift's state file") from None


def _save(dir: Path, doc: dict) -> None:
    tmp = dir / (STATE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, dir / STATE)


def public(doc: dict) -> dict:
    """The document ``--json`` prints: the state file without its private part."""
    return {k: v for k, v in doc.items() if k != "private"}


def _supervisor_state(dir: Path) -> dict:
    try:
        return json.loads((dir / "run" / "supervisor.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _target_alive(t: dict) -> bool:
    """Whether an embedded target (a `private.targets` entry) still runs: its pid, with
    its image on the command line (a pid is reused once its process is gone)."""
    return _host.proc_alive(t.get("pid"), t.get("image", ""))


def _supervisor_pid(dir: Path, doc: dict) -> Optional[int]:
    """The running supervisor of DIR's cluster, if any: recorded, or found by its command
    line (an `up` killed before it recorded the pid)."""
    marker = f"{SUPERVISOR.name} {dir} "  # /proc's cmdline ends with a NUL, read as a space
    pid = doc.get("private", {}).get("supervisor") or _supervisor_state(dir).get("pid")
    if _host.proc_alive(pid, marker):
        return pid
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and _host.proc_alive(int(d.name), marker):
            return int(d.name)
    return None


# --------------------------------------------------------------------------- up


def _check_environment() -> None:
    if os.geteuid() != 0:
        raise ClusterError("insitu swift needs root: it attaches namespaces, mounts XFS and makes a mount namespace")
    missing = [p for p in [SYSTEM_PYTHON, *(f"/usr/bin/swift-{s}-server" for s in _conf.SERVERS), "/usr/bin/memcached"] if not os.access(p, os.X_OK)]
    missing += [t for t in ("unshare", "nsenter", "mkfs.xfs", "mount") if not shutil.which(t)]
    if missing:
        raise ClusterError(
            "missing " + ", ".join(missing) + ": install Swift, memcached and xfsprogs "
            "(Debian: apt-get install swift swift-proxy swift-account swift-container swift-object "
            "memcached python3-pyeclib xfsprogs)"
        )
    if not Path("/etc/swift").is_dir():
        raise ClusterError(
            "/etc/swift is missing: the cluster's configuration is bind-mounted over it in a private mount "
            "namespace; reinstall the swift package, which creates it"
        )


def _ec_types() -> List[str]:
    """The erasure code backends PyECLib can load in the system Python."""
    code = "import json, pyeclib.ec_iface as e; print(json.dumps(e.VALID_EC_TYPES))"
    p = subprocess.run([SYSTEM_PYTHON, "-I", "-c", code], capture_output=True, text=True, env=SWIFT_ENV)
    if p.returncode != 0:
        raise ClusterError(f"PyECLib does not load in {SYSTEM_PYTHON}: {p.stderr.strip().splitlines()[-1:]}; install python3-pyeclib and liberasurecode1")
    return json.loads(p.stdout)


def _pick_ec_type(wanted: Optional[str], ec: _conf.Ec) -> str:
    valid = _ec_types()
    # Swift refuses isa_l_rs_vand with 5 or more parity fragments: some of its matrices
    # are then not invertible (https://bugs.launchpad.net/swift/+bug/1639691).
    if wanted == "isa_l_rs_vand" and ec.m >= 5:
        raise ClusterError(
            f"--ec-type isa_l_rs_vand with --ec {ec}: Swift refuses it with 5 or more parity fragments; use isa_l_rs_cauchy or liberasurecode_rs_vand"
        )
    if wanted:
        if wanted not in valid:
            raise ClusterError(f"--ec-type {wanted}: not available here; PyECLib can use {', '.join(valid)}")
        return wanted
    # ISA-L is Swift's usual production backend; liberasurecode's own Reed-Solomon is the
    # fallback that is always built.
    for t in ("isa_l_rs_vand", "liberasurecode_rs_vand"):
        if t in valid and not (t == "isa_l_rs_vand" and ec.m >= 5):
            return t
    raise ClusterError(f"PyECLib offers neither isa_l_rs_vand nor liberasurecode_rs_vand (only {', '.join(valid)}); install libisal2 or liberasurecode1")


def _probe_url(url: str) -> int:
    """Checks that `url` answers; returns its namespace's size in bytes."""
    m = re.fullmatch(r"nvme-tcp://[^/]+/[^/]+(?:/(\d+))?/?", url)
    nsid = int(m.group(1)) if m and m.group(1) else 1
    doc = _host.insitu("nvme", "identify", url, timeout=30)
    for ns in doc.get("namespaces", []):
        if ns.get("nsid") == nsid:
            return int(ns["size_bytes"])
    raise ClusterError(f"{url}: the target has no namespace {nsid}")


def _validate_ec_for_reuse(prev: dict, ec: Optional[_conf.Ec], segment_size: Optional[int]) -> None:
    pol = prev["policy"]
    if ec is not None and (ec.k, ec.m) != (pol["k"], pol["m"]):
        raise ClusterError(
            f"{prev['dir']} holds a {pol['k']}+{pol['m']} cluster: give --ec {pol['k']}+{pol['m']} (or nothing) to bring it up again, or use a new DIR"
        )
    if segment_size is not None and segment_size != pol["segment_size"]:
        raise ClusterError(
            f"{prev['dir']} holds a cluster with --segment-size {pol['segment_size']}; "
            "the segment size of stored objects cannot change: omit it or use a new DIR"
        )


def _check_down(dir: Path, doc: dict) -> None:
    """Refuses to start a cluster over one that is (partly) running."""
    if doc.get("state") == "up" and _supervisor_pid(dir, doc):
        raise ClusterError(f"{dir} is already up (proxy {doc.get('proxy')}); `insitu swift down {dir}` first")
    leftovers = []
    if _supervisor_pid(dir, doc):
        leftovers.append("its supervisor runs")
    leftovers += [f"{name} is mounted" for name, d in doc.get("devices", {}).items() if _host.mounted(Path(d["mount"]))]
    leftovers += [f"the target of {name} runs" for name, t in doc.get("private", {}).get("targets", {}).items() if t.get("pid") and _target_alive(t)]
    if leftovers:
        raise ClusterError(f"{dir} was not brought down cleanly ({'; '.join(leftovers)}): run `insitu swift down {dir}` first")


def up(a: argparse.Namespace) -> int:
    t0 = time.monotonic()
    dir = Path(a.dir).resolve()
    try:
        ec = _conf.parse_ec(a.ec) if a.ec is not None else None
    except ValueError as e:
        raise ClusterError(str(e)) from None
    segment_size = _parse_size_arg("--segment-size", a.segment_size) if a.segment_size is not None else None
    size = _parse_size_arg("--size", a.size)
    if size < MIN_SIZE:
        raise ClusterError(f"--size {a.size}: XFS needs more than 300 MiB per device; give at least --size 320M")
    if a.port is not None and not 0 < a.port < 65536:
        raise ClusterError(f"--port {a.port}: give a TCP port between 1 and 65535")
    if not 1 <= a.part_power <= 16:
        raise ClusterError(f"--part-power {a.part_power}: give 1 to 16 (2^P partitions per ring)")
    if len(set(a.urls)) != len(a.urls):
        raise ClusterError("a target URL is given twice: each device needs its own namespace")
    if dir.exists() and not dir.is_dir():
        raise ClusterError(f"{dir} is not a directory")
    _check_environment()
    prev = _load(dir) if dir.is_dir() else None
    if prev is not None:
        _check_down(dir, prev)
        _validate_ec_for_reuse(prev, ec, segment_size)
        recorded = prev["private"].get("urls")
        if a.urls and a.urls != recorded:
            was = "embedded images" if not recorded else " ".join(recorded)
            raise ClusterError(f"{dir} was made on {was}; bring it up again with the same targets, or use a new DIR")
        if a.ec_type and a.ec_type != prev["policy"]["ec_type"]:
            raise ClusterError(f"{dir} holds a cluster with --ec-type {prev['policy']['ec_type']}; omit --ec-type or use a new DIR")
        return _up(dir, prev, a.port, t0, new=False)
    if dir.is_dir() and any(p.name != "log" for p in dir.iterdir()):
        raise ClusterError(f"{dir} is not empty and holds no cluster ({STATE} is missing): give an empty or new directory")
    if ec is None:
        raise ClusterError("--ec K+M is needed for a new cluster, e.g. --ec 4+2")
    if a.urls and len(a.urls) < ec.n:
        raise ClusterError(
            f"--ec {ec} puts each object's {ec.n} fragments on {ec.n} different devices, one per target URL: "
            f"give at least {ec.n} URLs (got {len(a.urls)}), or none for embedded targets"
        )
    ec_type = _pick_ec_type(a.ec_type, ec)
    if a.urls:
        # Every target must answer before any is formatted.
        for url in a.urls:
            got = _probe_url(url)
            if got < MIN_SIZE:
                raise ClusterError(f"{url}: the namespace has {got >> 20} MiB; XFS needs more than 300 MiB")
    names = [f"d{i}" for i in range(len(a.urls) if a.urls else ec.n)]
    doc = {
        "dir": str(dir),
        "state": "starting",
        "proxy": None,
        "auth": None,
        "user": f"{_conf.ACCOUNT}:{_conf.USER}",
        "key": _conf.KEY,
        "storage_url": None,
        "devices": {},
        "policy": {
            "index": _conf.EC_POLICY_INDEX,
            "name": _conf.EC_POLICY_NAME,
            "ec": str(ec),
            "k": ec.k,
            "m": ec.m,
            "ec_type": ec_type,
            "segment_size": segment_size or (1 << 20),
        },
        "swift_dir": str(dir),
        "log_dir": str(dir / "log"),
        "ports": {},
        "private": {
            "urls": list(a.urls) or None,
            "names": names,
            "size": size,
            "part_power": a.part_power,
            "hash_path_prefix": secrets.token_hex(16),
            "hash_path_suffix": secrets.token_hex(16),
            "targets": {},
            "supervisor": None,
            "mnt_ns": None,
        },
    }
    dir.mkdir(parents=True, exist_ok=True)
    return _up(dir, doc, a.port, t0, new=True)


def _parse_size_arg(flag: str, text: str) -> int:
    try:
        n = parse_size(text)
    except (ValueError, IndexError):
        raise ClusterError(f"{flag} {text!r}: give a size such as 1M, 512K or 1048576") from None
    if n <= 0:
        raise ClusterError(f"{flag} {text}: must be positive")
    return n


def _up(dir: Path, doc: dict, port: Optional[int], t0: float, new: bool) -> int:
    """Brings the cluster in `doc` up in DIR; on any failure undoes every step taken."""
    for sub in ("log", "run", "run/recon", "node"):
        (dir / sub).mkdir(exist_ok=True)
    doc["state"] = "starting"
    _save(dir, doc)
    rings: Optional[subprocess.Popen] = None
    try:
        old_ports = dict(doc.get("ports") or {})
        ports = _choose_ports(doc, port)
        _write_config(dir, doc, ports)
        # The rings take Swift's import time to build: they build while devices attach.
        rings = _start_rings(dir, doc, old_ports)
        _attach_devices(dir, doc)
        _finish_rings(rings)
        _start_supervisor(dir, doc)
        _wait_ready(dir, doc)
    except BaseException as e:
        if rings is not None and rings.poll() is None:
            # Let it finish: a builder file killed mid-write would not load again.
            try:
                rings.wait(timeout=60)
            except subprocess.TimeoutExpired:
                rings.kill()
                rings.wait()
        _host.progress("undoing the steps taken")
        problems = _teardown(dir, doc)
        if new and not problems and not _host.mounts_under(dir):
            _remove_new(dir)
        else:
            # Kept, so that `down` can finish what could not be undone.
            doc["state"] = "down"
            _save(dir, doc)
        if problems:
            _host.progress("could not undo everything: " + "; ".join(problems) + f"; then `insitu swift down {dir}`")
        if isinstance(e, ClusterError):
            raise ClusterError(f"{e} (logs: {dir / 'log'})") from None
        raise
    doc["state"] = "up"
    doc["up_s"] = round(time.monotonic() - t0, 2)
    _save(dir, doc)
    _host.progress(f"up in {doc['up_s']:.1f} s: proxy {doc['proxy']}, {len(doc['devices'])} devices, policy ec {doc['policy']['ec']}")
    return 0


def _remove_new(dir: Path) -> None:
    """Removes what a failed `up` of a new cluster made in DIR (nothing may be mounted
    there any more), except the logs, so that the same command can simply be run again."""
    for p in dir.iterdir():
        if p.name == "log":
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _attach_devices(dir: Path, doc: dict) -> None:
    """Starts the embedded targets (if any) and attaches every device, in parallel,
    recording each step in the state file as it is taken (so `down` can undo it)."""
    priv = doc["private"]
    urls = priv["urls"]
    # A device's file system is made once, on its first attach; later ones mount it.
    formatted = priv.setdefault("formatted", [])
    lock = threading.Lock()

    def record(update) -> None:
        with lock:
            update()
            _save(dir, doc)

    def one(i: int, name: str) -> None:
        if urls:
            url = urls[i]
        else:
            image = dir / "images" / f"{name}.img"
            if not image.exists():
                with open(image, "wb") as f:
                    f.truncate(priv["size"])
            nqn = NQN_PREFIX + name
            # Port 0: the daemon binds a free port and reports it, so two clusters never race.
            t = _host.insitu("target", "start", "--listen", "127.0.0.1:0", "--nqn", nqn, "--namespace", image, timeout=30)
            record(lambda: priv["targets"].__setitem__(name, {"listen": t["listen"], "pid": t.get("pid"), "image": str(image), "nqn": nqn}))
            url = f"nvme-tcp://{t['listen']}/{nqn}/1"
        mount = dir / "node" / name
        fresh = name not in formatted
        _host.progress(f"attaching {name} at {mount}" + (" (mkfs.xfs)" if fresh else ""))
        args = ["attach", url, mount, *(["--format", "xfs"] if fresh else [])]
        try:
            att = _host.insitu(*args, timeout=180)
        except ClusterError as e:
            if "losetup" not in str(e):
                raise
            # Attaches in parallel may race for the same free loop device; once more.
            time.sleep(0.2 + 0.1 * i)
            att = _host.insitu(*args, timeout=180)

        def done() -> None:
            doc["devices"][name] = {"mount": str(mount), "target": att.get("url", url)}
            if fresh:
                formatted.append(name)

        record(done)

    if not urls:
        (dir / "images").mkdir(exist_ok=True)
    names = priv["names"]
    with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
        futures = [pool.submit(one, i, name) for i, name in enumerate(names)]
        errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]
    # In name order (d0, d1, ...), not in the order the attaches finished.
    doc["devices"] = {n: doc["devices"][n] for n in names}
    _save(dir, doc)


def _choose_ports(doc: dict, port: Optional[int]) -> _conf.Ports:
    """The proxy gets `port` (which must be free); the others keep the ports of the last
    `up` when still free, so a cluster comes back where it was, or take new ones."""
    old = doc.get("ports") or {}
    if port is not None and not _host.port_free(port):
        raise ClusterError(f"--port {port}: something already listens on 127.0.0.1:{port}; give another port or omit --port")
    fields = ("proxy", "account", "container", "object", "memcached")
    chosen: Dict[str, int] = {}
    if port is not None:
        chosen["proxy"] = port
    for f in fields:
        if f not in chosen and old.get(f) and old[f] not in chosen.values() and _host.port_free(old[f]):
            chosen[f] = old[f]
    missing = [f for f in fields if f not in chosen]
    for f, p in zip(missing, _host.free_ports(len(missing), avoid=list(chosen.values()))):
        chosen[f] = p
    ports = _conf.Ports(**chosen)
    doc["ports"] = ports.as_dict()
    base = f"http://127.0.0.1:{ports.proxy}"
    doc["proxy"], doc["auth"] = base, f"{base}/auth/v1.0"
    doc["storage_url"] = f"{base}/v1/AUTH_{_conf.ACCOUNT}"
    return ports


def _write_config(dir: Path, doc: dict, ports: _conf.Ports) -> None:
    priv, pol = doc["private"], doc["policy"]
    ec = _conf.Ec(pol["k"], pol["m"])
    (dir / "swift.conf").write_text(_conf.swift_conf(priv["hash_path_prefix"], priv["hash_path_suffix"], ec, pol["ec_type"], pol["segment_size"]))
    for server, make in _conf.CONFS.items():
        _conf.conf_path(dir, server).write_text(make(dir, ports))
    (dir / "run" / "plan.json").write_text(json.dumps({"ports": ports.as_dict()}, indent=1))


def _start_rings(dir: Path, doc: dict, old_ports: Dict[str, int]) -> Optional[subprocess.Popen]:
    """Starts building the rings (or re-porting them after a port change); None when
    they are up to date."""
    priv, ports = doc["private"], doc["ports"]
    ec = _conf.Ec(doc["policy"]["k"], doc["policy"]["m"])
    ring_files = [dir / f"{r}.ring.gz" for r in ("account", "container", "object", f"object-{_conf.EC_POLICY_INDEX}")]
    if all(f.exists() for f in ring_files) and all(old_ports.get(s) == ports[s] for s in ("account", "container", "object")):
        return None
    n = len(priv["names"])
    if n < ec.n:
        raise ClusterError(f"{n} devices cannot hold {ec.n} fragments each on its own device")
    plan = {
        "dir": str(dir),
        "devices": priv["names"],
        "part_power": priv["part_power"],
        "rings": {
            # Accounts, containers and policy 0 keep one replica: a test cluster's listings
            # need no redundancy, and one replica needs no rsync daemon to replicate.
            "account": [1, ports["account"]],
            "container": [1, ports["container"]],
            "object": [1, ports["object"]],
            f"object-{_conf.EC_POLICY_INDEX}": [ec.n, ports["object"]],
        },
    }
    (dir / "run" / "rings.json").write_text(json.dumps(plan, indent=1))
    _host.progress("building the rings")
    return subprocess.Popen(
        [SYSTEM_PYTHON, "-I", str(RINGS), str(dir / "run" / "rings.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=SWIFT_ENV
    )


def _finish_rings(p: Optional[subprocess.Popen]) -> None:
    if p is None:
        return
    try:
        _, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise ClusterError("building the rings took more than 120 s") from None
    if p.returncode != 0:
        raise ClusterError(f"building the rings failed: {err.strip()[-2000:]}")


def _start_supervisor(dir: Path, doc: dict) -> None:
    _host.progress("starting memcached and the Swift servers")
    (dir / "run" / "supervisor.json").unlink(missing_ok=True)
    log = open(dir / "log" / "supervisor.log", "ab")
    # `setsid -f` forks, so the supervisor is nobody's child here: it outlives this
    # command and never lingers as a zombie of a long-lived caller (a test process).
    argv = ["setsid", "-f", "unshare", "--mount", "--propagation", "private", SYSTEM_PYTHON, "-I", str(SUPERVISOR), str(dir)]
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=SWIFT_ENV, check=True)
    log.close()
    deadline = time.monotonic() + 20
    while True:
        st = _supervisor_state(dir)
        if st.get("pid"):
            doc["private"]["supervisor"], doc["private"]["mnt_ns"] = st["pid"], st.get("mnt_ns")
            _save(dir, doc)
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"the supervisor did not start: {_host.tail(dir / 'log' / 'supervisor.log', 5) or 'no output'}")
        time.sleep(0.05)


def _wait_ready(dir: Path, doc: dict, timeout: float = 90) -> None:
    """Waits until every server listens and the proxy serves the EC policy through
    tempauth; fails early when a server or the supervisor exits."""
    ports = doc["ports"]
    deadline = time.monotonic() + timeout
    pending = dict(ports)
    while pending:
        st = _supervisor_state(dir)
        if st.get("error"):
            raise ClusterError(f"the supervisor failed: {st['error']}")
        for name, code in st.get("exited", {}).items():
            log = dir / "log" / (f"{name}.log" if name == "memcached" else f"{name}-server.log")
            raise ClusterError(f"{name} exited with status {code} while starting: {_host.tail(log, 8)}")
        if not _host.proc_alive(doc["private"]["supervisor"]):
            raise ClusterError(f"the supervisor exited: {_host.tail(dir / 'log' / 'supervisor.log', 5)}")
        for name, port in list(pending.items()):
            if st.get("ready") and _host.listening(port):
                del pending[name]
        if time.monotonic() > deadline:
            raise ClusterError(f"{', '.join(pending)} did not start listening in {timeout:.0f} s")
        time.sleep(0.1)
    _host.progress("waiting for the proxy")
    last: Exception = ClusterError("no answer")
    while time.monotonic() < deadline:
        try:
            storage_url, token = client.auth(doc["auth"], doc["user"], doc["key"])
            with urllib.request.urlopen(f"{doc['proxy']}/info", timeout=10) as r:
                info = json.load(r)
            names = [p.get("name") for p in info.get("swift", {}).get("policies", [])]
            if _conf.EC_POLICY_NAME not in names:
                raise ClusterError(f"the proxy does not serve the EC policy (it lists {names}): it did not read {dir / 'swift.conf'}")
            doc["storage_url"] = storage_url
            return
        except ClusterError:
            raise
        except (OSError, client.SwiftError, ValueError) as e:
            last = e
            time.sleep(0.2)
    raise ClusterError(f"the proxy at {doc['proxy']} does not answer: {last}")


# --------------------------------------------------------------------------- down


def _stop_supervisor(dir: Path, doc: dict) -> List[str]:
    problems: List[str] = []
    pid = _supervisor_pid(dir, doc)
    st = _supervisor_state(dir)
    mnt_ns = doc.get("private", {}).get("mnt_ns") or st.get("mnt_ns")
    if pid:
        _host.progress("stopping the Swift servers")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while _host.proc_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _host.proc_alive(pid):
            problems.append(f"the supervisor (pid {pid}) did not stop in 20 s: killed")
            os.kill(pid, signal.SIGKILL)
    # Whatever is left in the namespace (servers of a killed supervisor, a `once` still
    # running) keeps the devices' file systems mounted there: it must go before detaching.
    if mnt_ns and mnt_ns != os.readlink("/proc/self/ns/mnt"):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = _in_cluster_ns(dir, mnt_ns)
            if not left:
                break
            for p in left:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while _in_cluster_ns(dir, mnt_ns) and time.monotonic() < deadline:
                time.sleep(0.1)
        if _in_cluster_ns(dir, mnt_ns):
            problems.append(f"processes {_in_cluster_ns(dir, mnt_ns)} stay in the cluster's mount namespace")
    return problems


def _in_cluster_ns(dir: Path, mnt_ns: str) -> List[int]:
    """The processes in the cluster's mount namespace. A namespace's number is reused
    once it is gone, so a process counts only if its /etc/swift is DIR (the bind mount
    that only the cluster's namespace has)."""
    out = []
    for pid in _host.processes_in_ns(mnt_ns):
        try:
            if os.path.samefile(f"/proc/{pid}/root/etc/swift", dir):
                out.append(pid)
        except OSError:
            pass
    return out


def _attached_under(dir: Path) -> List[Path]:
    """Mount points under DIR/node that insitu's attach records name (also those an
    interrupted `up` did not record)."""
    out = []
    for rec in Path("/run/insitu/attach").glob("*.json"):
        try:
            d = Path(json.loads(rec.read_text())["dir"])
        except (OSError, ValueError, KeyError):
            continue
        if d.parent == dir / "node":
            out.append(d)
    return out


def _teardown(dir: Path, doc: dict) -> List[str]:
    """Stops the servers, detaches the devices and stops the embedded targets; returns
    what could not be undone."""
    problems = _stop_supervisor(dir, doc)
    mounts = {Path(d["mount"]) for d in doc.get("devices", {}).values()} | set(_attached_under(dir))
    mounts = {m for m in mounts if _host.mounted(m) or m in _attached_under(dir)}
    if mounts:
        _host.progress(f"detaching {len(mounts)} devices")

    def detach(m: Path) -> Optional[str]:
        for attempt in range(3):
            try:
                _host.insitu("detach", m, timeout=60)
                return None
            except ClusterError as e:
                err = str(e)
                time.sleep(0.5 * (attempt + 1))
        return f"{m}: {err}"

    # In parallel: each detach waits for its FUSE daemon to exit.
    with ThreadPoolExecutor(max_workers=max(1, len(mounts))) as pool:
        problems += [p for p in pool.map(detach, sorted(mounts)) if p]
    # A target whose device is still mounted keeps running: stopping it would turn the
    # file system's I/O into errors.
    targets = [
        (name, t)
        for name, t in doc.get("private", {}).get("targets", {}).items()
        if not (t.get("pid") and not _target_alive(t)) and not _host.mounted(dir / "node" / name)
    ]

    def stop(item) -> Optional[str]:
        name, t = item
        try:
            _host.insitu("target", "stop", "--listen", t["listen"], timeout=30)
            return None
        except ClusterError as e:
            return f"the target of {name} ({t['listen']}): {e}"

    with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
        problems += [p for p in pool.map(stop, targets) if p]
    (dir / "run" / "supervisor.json").unlink(missing_ok=True)
    return problems


def down(a: argparse.Namespace) -> int:
    dir = Path(a.dir).resolve()
    if os.geteuid() != 0:
        raise ClusterError("insitu swift needs root: it detaches namespaces and stops the cluster's servers")
    doc = _load(dir) if dir.is_dir() else None
    if doc is None:
        raise ClusterError(f"{dir} holds no cluster ({dir / STATE} is missing): give the DIR given to `insitu swift up`")
    problems = _teardown(dir, doc)
    doc["state"] = "down"
    doc["private"]["supervisor"] = doc["private"]["mnt_ns"] = None
    doc.pop("up_s", None)
    _save(dir, doc)
    if problems:
        raise ClusterError(f"{dir}: down, but " + "; ".join(problems), code=1)
    return 0


# --------------------------------------------------------------------------- status, once


def _status_doc(dir: Path, doc: dict) -> dict:
    st = _supervisor_state(dir)
    sup = _supervisor_pid(dir, doc)
    problems: List[str] = []
    servers = {}
    for name, pid in st.get("servers", {}).items():
        port = doc.get("ports", {}).get(name)
        # By command line too: a pid is reused once its process is gone.
        marker = f"-p {port} " if name == "memcached" else f"{_conf.conf_path(dir, name)} "
        running = _host.proc_alive(pid, marker)
        servers[name] = {"pid": pid, "port": port, "running": running, "listening": bool(port) and _host.listening(port)}
        if doc.get("state") == "up" and not (running and servers[name]["listening"]):
            problems.append(f"{name} is not running" if not running else f"{name} does not listen on {port}")
    devices = {}
    for name, d in doc.get("devices", {}).items():
        mounted = _host.mounted(Path(d["mount"]))
        devices[name] = {**d, "mounted": mounted}
        if not mounted and doc.get("state") == "up":
            problems.append(f"{name} is not mounted at {d['mount']}")
    for name, t in doc.get("private", {}).get("targets", {}).items():
        alive = bool(t.get("pid")) and _target_alive(t)
        devices.setdefault(name, {})["target_running"] = alive
        if not alive and doc.get("state") == "up":
            problems.append(f"the target of {name} ({t['listen']}) is not running")
    if doc.get("state") == "up" and not sup:
        problems.append("the supervisor is not running")
    healthy = False
    if sup and doc.get("proxy"):
        try:
            with urllib.request.urlopen(f"{doc['proxy']}/healthcheck", timeout=5) as r:
                healthy = r.status == 200
        except OSError:
            pass
        if not healthy:
            problems.append("the proxy's /healthcheck does not answer")
    if doc.get("state") == "up":
        state = "degraded" if problems else "up"
    elif sup or any(d.get("mounted") for d in devices.values()) or any(v["running"] for v in servers.values()):
        state = "degraded"
        problems.append(f"recorded as {doc.get('state')} but parts run: `insitu swift down {dir}` stops them")
    else:
        state = "down"
    out = public(doc)
    out.update(
        state=state,
        problems=problems,
        servers=servers,
        devices=devices,
        supervisor={"pid": sup, "mnt_ns": doc.get("private", {}).get("mnt_ns")} if sup else None,
    )
    return out


def status(a: argparse.Namespace) -> int:
    dir = Path(a.dir).resolve()
    doc = _load(dir) if dir.is_dir() else None
    if doc is None:
        raise ClusterError(f"{dir} holds no cluster ({dir / STATE} is missing)")
    out = _status_doc(dir, doc)
    _emit(a, out, _status_text(out))
    return 0 if out["state"] == "up" else 1


def _status_text(s: dict) -> str:
    lines = [f"{s['dir']}: {s['state']}"]
    if s.get("proxy"):
        lines.append(f"  proxy {s['proxy']}  auth {s['auth']}  user {s['user']}  key {s['key']}")
    pol = s.get("policy", {})
    lines.append(f"  policy {pol.get('name')} ({pol.get('ec_type')} {pol.get('ec')}, segments of {pol.get('segment_size')} bytes)")
    for name, d in s.get("devices", {}).items():
        lines.append(f"  {name}: {d.get('mount')} on {d.get('target')}" + ("" if d.get("mounted") else " (not mounted)"))
    for name, sv in s.get("servers", {}).items():
        lines.append(f"  {name}: pid {sv['pid']} port {sv['port']}" + ("" if sv["running"] else " (stopped)"))
    lines += [f"  problem: {p}" for p in s.get("problems", [])]
    return "\n".join(lines)


def once(a: argparse.Namespace) -> int:
    dir = Path(a.dir).resolve()
    doc = _load(dir) if dir.is_dir() else None
    if doc is None:
        raise ClusterError(f"{dir} holds no cluster ({dir / STATE} is missing)")
    pid = _supervisor_pid(dir, doc)
    if doc.get("state") != "up" or not pid:
        raise ClusterError(f"{dir} is not up: `insitu swift up {dir}` first")
    if a.devices and a.daemon == "updater":
        raise ClusterError("--devices: the updater takes no device list (auditor, reconstructor and replicator do)")
    if a.partitions and a.daemon not in ("reconstructor", "replicator"):
        raise ClusterError(f"--partitions: the {a.daemon} takes no partition list (reconstructor and replicator do)")
    program = DAEMONS[a.daemon]
    name = Path(program).name.removeprefix("swift-")
    argv = ["nsenter", "--target", str(pid), "--mount", "--", program, str(_conf.conf_path(dir, "object")), "once", "-v"]
    if a.devices:
        argv += ["--devices", a.devices]
    if a.partitions:
        argv += ["--partitions", a.partitions]
    log = dir / "log" / f"{name}.log"
    _host.progress(f"running {name} once")
    t0 = time.monotonic()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=SWIFT_ENV, cwd=dir)
    wall = time.monotonic() - t0
    output = p.stdout + p.stderr
    with open(log, "a") as f:
        f.write(output)
    lines = output.splitlines()
    out = {
        "daemon": name,
        "dir": str(dir),
        "rc": p.returncode,
        "wall_s": round(wall, 3),
        "log": str(log),
        # Swift's own closing lines: totals, quarantines, rebuilds, errors.
        "summary": [ln for ln in lines if re.search(r"complete|quarantin|rebuil|reconstructed|[Ee]rror|Traceback", ln)][-20:],
        "stats": _closing_stats(lines),
        "tail": lines[-20:],
    }
    _emit(a, out, f"{name}: exit {p.returncode} in {wall:.2f} s (log {log})" + "".join(f"\n  {ln}" for ln in out["summary"]))
    if p.returncode != 0:
        return 1
    return 0


def _closing_stats(lines: List[str]) -> Dict[str, float]:
    """The numbers of a daemon's last "completed" line, e.g. the auditor's ``Total
    quarantined: 1, Total errors: 0, ... Auditing time: 0.08`` as ``{"total_quarantined":
    1, "total_errors": 0, ..., "auditing_time": 0.08}``."""
    done = [ln for ln in lines if re.search(r"\bcomplete(d)?\b", ln)]
    if not done:
        return {}
    out: Dict[str, float] = {}
    for key, value in re.findall(r"([A-Za-z][A-Za-z /]*?):\s*(-?\d+(?:\.\d+)?)(?=[,\s]|$)", done[-1].split(":", 1)[-1]):
        name = re.sub(r"[^a-z0-9]+", "_", key.strip().lower()).strip("_")
        out[name] = float(value) if "." in value else int(value)
    return out


def _emit(a: argparse.Namespace, doc: dict, text: str) -> None:
    """Prints a command's result: `doc` as JSON with --json, else `text`."""
    print(json.dumps(doc, indent=2) if a.json else text)


if __name__ == "__main__":
    from .cli import main

    sys.exit(main(sys.argv[1:]))

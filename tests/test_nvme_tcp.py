# SPDX-License-Identifier: Apache-2.0
"""The NVMe/TCP target (`insitu target start`) against the stock Linux kernel initiator.

One guest run (tests/kernel/host-target-workload.sh under the kernel-initiator harness, QEMU)
does discovery, connect, identify, raw I/O, EXEC and in-storage attention (the KV-cache
commands) through the passthrough ioctl, an ext4 workload and a connect that must be
refused, while tshark records the loopback traffic.
The tests then judge, each from its own angle:

* what the guest saw (exit status, identify data, EXEC result bytes and statuses, the
  attention result against a host computation, kernel log);
* the wire (every byte of every connection belongs to a PDU tshark decodes, no malformed
  frames or expert errors, the ICReq/ICResp/Connect opening of each connection, R2T/H2CData/
  C2HData, EXEC commands and their completions, the refused Connect);
* the target's Prometheus metrics;
* the image files after the target is killed with SIGKILL.

Needs root, qemu-system-x86 and a Debian kernel image (installed with apt when missing: the
tests are skipped only when that install fails), tshark (installed with apt when missing;
failing to install it is an error) and the kernel-initiator harness (KINIT_DIR, default
../shared/tools/kernel-initiator beside the repository). A run takes about a minute (the guest runs under TCG).
INSITU_NVME_TCP_KEEP=DIR keeps the guest's output, the capture and the target logs in DIR.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import crc32c
import pytest

ROOT = Path(__file__).resolve().parent.parent
KINIT_DIR = Path(os.environ.get("KINIT_DIR", Path(__file__).resolve().parents[2] / "shared" / "tools" / "kernel-initiator"))
RUN_GUEST = KINIT_DIR / "run-guest.sh"
SNIPPET = Path(__file__).resolve().parent / "kernel" / "host-target-workload.sh"

NQN = "nqn.2024-01.io.insitu:nvme-tcp-test"
DENY_NQN = "nqn.2024-01.io.insitu:nvme-tcp-test-deny"
OTHER_HOST = "nqn.2014-08.org.example:not-the-kinit-guest"
GUEST_HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:6b696e69-7400-4000-8000-000000000001"

NS1_BYTES = 256 << 20
NS2_BYTES = 64 << 20
SECTOR = 512
DATA_SECTOR = 2048  # namespace 2: the host-written input of the EXEC
DATA_BYTES = (1 << 20) - 123  # not a whole number of sectors
RESULT_SECTOR = 8192  # namespace 2: the result object
RESULT_SECTORS = 8
RESULT_FILL = 0xEE  # what the result object holds before the EXEC

# NVMe/TCP PDU types and their header lengths without digests
PDU_HLEN = {0: 128, 1: 128, 2: 24, 3: 24, 4: 72, 5: 24, 6: 24, 7: 24, 9: 24}
PDU_NAMES = {0: "ICReq", 1: "ICResp", 2: "H2CTermReq", 3: "C2HTermReq", 4: "CapsuleCmd", 5: "CapsuleResp", 6: "H2CData", 7: "C2HData", 9: "R2T"}
FCTYPE_CONNECT = 0x01
OPC_EXEC = 0x99
# The KV-cache exchange the guest sends through the passthrough ioctl (docs/kv-commands.md).
KV_SEQ, KV_HEADS, KV_GROUP, KV_DIM, KV_TOKENS, KV_SCALE, KV_TAG = 0x5EED, 2, 3, 16, 150, 0.25, 7
# completion Status Field values (SC bits 7:0, SCT bits 10:8, DNR bit 14)
ST_INVALID_FIELD = 0x4002
ST_LBA_OUT_OF_RANGE = 0x4080
ST_CONNECT_INVALID_HOST = 0x4184


# --------------------------------------------------------------------------- tools


def _insitu_bin() -> str:
    """The first `insitu` that has the `target` subcommand (the one in .venv may predate it)."""
    tried = []
    for cand in (os.environ.get("INSITU_BIN"), ROOT / ".venv" / "bin" / "insitu", ROOT / "target" / "release" / "insitu"):
        if not cand or not Path(cand).exists():
            continue
        p = subprocess.run([str(cand), "target", "--help"], capture_output=True, text=True)
        if p.returncode == 0:
            return str(cand)
        tried.append(f"{cand}: {p.stderr.strip()[:200]}")
    pytest.fail("no insitu binary with the `target` subcommand (run `make build`): " + "; ".join(tried))


def _apt_install(*pkgs: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, timeout=600)
    return subprocess.run(["apt-get", "install", "-y", "-qq", *pkgs], capture_output=True, text=True, env=env, timeout=900)


def _have_qemu_and_kernel() -> bool:
    return shutil.which("qemu-system-x86_64") is not None and bool(glob.glob("/boot/vmlinuz-*"))


@pytest.fixture(scope="module")
def kinit() -> Path:
    """The kernel-initiator harness, with qemu and a guest kernel installed."""
    if not RUN_GUEST.exists():
        pytest.skip(f"the kernel-initiator harness is not here ({RUN_GUEST}; set KINIT_DIR)")
    if not _have_qemu_and_kernel():
        why = "not root"
        if os.geteuid() == 0:
            p = _apt_install("qemu-system-x86", "linux-image-amd64", "nvme-cli", "busybox-static", "e2fsprogs", "cpio", "kmod")
            why = f"apt-get install exited {p.returncode}: {p.stderr.strip()[-300:]}"
        if not _have_qemu_and_kernel():
            pytest.skip(f"qemu-system-x86_64 or /boot/vmlinuz-* missing and cannot be installed ({why})")
    return RUN_GUEST


@pytest.fixture(scope="module")
def tshark() -> str:
    path = shutil.which("tshark")
    if path is None:
        p = _apt_install("tshark")
        path = shutil.which("tshark")
        assert path, f"tshark is missing and `apt-get install tshark` failed ({p.returncode}): {p.stderr[-500:]}"
    return path


def _free_ports(n: int) -> List[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


# --------------------------------------------------------------------------- descriptors


def _encode_descriptor_reference(function: str, inputs: List[dict], result: Optional[dict]) -> bytes:
    """docs/compute-descriptor.md sections 3 and 3.5, written from the text (no arguments)."""
    objects = inputs + ([result] if result else [])
    body = function.encode()
    for o in objects:
        body += struct.pack("<QI4x", o["length"], len(o["extents"]))
        for e in o["extents"]:
            body += struct.pack("<QIB3x", e["start_sector"], e["sectors"], {"data": 0, "zero": 1}[e["kind"]])
    total = 32 + len(body)
    header = b"ISCD" + struct.pack("<HHI4xBBHHB9x", 1, 32, total, len(function), 0, len(inputs), 1 if result else 0, 1 if result else 0)
    return header + body


def make_descriptor(inputs: List[dict], result: Optional[dict]) -> bytes:
    """A crc32c descriptor, encoded by insitu (`encode_descriptor`) and checked against the
    reference encoder above."""
    import insitu._native as native

    assert hasattr(native, "encode_descriptor"), "insitu._native has no encode_descriptor: run `make build`"
    doc = {"function": "crc32c", "args": [], "inputs": inputs, "outputs": []}
    if result:
        doc["result"] = result
    data = bytes(native.encode_descriptor(json.dumps(doc)))
    assert data == _encode_descriptor_reference("crc32c", inputs, result), "encode_descriptor disagrees with the spec"
    return data


def decode_result(data: bytes) -> List[List[Tuple[str, object]]]:
    """An ISRS result (docs section 9): records of (name, value)."""
    assert data[:4] == b"ISRS", data[:16]
    version, count = struct.unpack_from("<HH", data, 4)
    assert version == 1
    at = 8
    records = []
    for _ in range(count):
        (nfields,) = struct.unpack_from("<H", data, at)
        at += 2
        fields = []
        for _ in range(nfields):
            n = data[at]
            name = data[at + 1 : at + 1 + n].decode("ascii")
            at += 1 + n
            tag = data[at]
            at += 1
            if tag in (1, 2):
                value = struct.unpack_from("<Q" if tag == 1 else "<q", data, at)[0]
                at += 8
            elif tag in (3, 4):
                (ln,) = struct.unpack_from("<I", data, at)
                raw = data[at + 4 : at + 4 + ln]
                value = raw.decode("utf-8") if tag == 3 else raw
                at += 4 + ln
            elif tag == 5:
                value = bool(data[at])
                at += 1
            elif tag == 6:
                (ln,) = struct.unpack_from("<I", data, at)
                value = list(struct.unpack_from(f"<{ln}Q", data, at + 4))
                at += 4 + 8 * ln
            else:
                raise AssertionError(f"unknown value tag {tag} at byte {at - 1}")
            fields.append((name, value))
        records.append(fields)
    assert at == len(data), f"{len(data) - at} bytes after the last record"
    return records


# --------------------------------------------------------------------------- the targets


@dataclasses.dataclass
class Env:
    insitu: str
    dir: Path
    port: int
    deny_port: int
    metrics_port: int
    ns1: Path
    ns2: Path
    ns3: Path
    ns2_data: bytes
    descriptors: Dict[str, Path]  # files for the guest: EXEC descriptors and KV requests
    started: Dict[int, dict]  # port -> `target start --json` document
    killed: bool = False
    kv: Tuple[List[float], List[float], List[float]] = ((), (), ())  # the guest's K, V and q

    def cli(self, *args: object, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([self.insitu, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def kv_requests(rng: random.Random) -> Tuple[Dict[str, bytes], Tuple[List[float], List[float], List[float]]]:
    """The guest's KV-cache requests, encoded here from docs/kv-commands.md: create sequence
    KV_SEQ (not kept: it belongs to the guest's controller), append KV_TOKENS tokens of
    KV_HEADS heads to layer 0, and a dense attention of one query per head row. Returns the
    files and (K, V, q)."""
    n = KV_HEADS * KV_TOKENS * KV_DIM
    k, v, q = ([rng.uniform(-1.5, 1.5) for _ in range(m)] for m in (n, n, KV_HEADS * KV_GROUP * KV_DIM))
    f32 = lambda xs: struct.pack(f"<{len(xs)}f", *xs)  # noqa: E731
    create = b"KVAD" + struct.pack("<BBBBQQHHHH", 1, 0, 1, 0, KV_SEQ, 0, 1, KV_HEADS, KV_DIM, 0)
    append = b"KVAP" + struct.pack("<B3xQHHHxxI4x", 1, KV_SEQ, 0, KV_HEADS, KV_DIM, KV_TOKENS) + f32(k) + f32(v)
    attend = b"KVAT" + struct.pack("<BBBxHHHHHHIIfII", 1, 0, 0, 0, KV_HEADS, KV_GROUP, KV_DIM, 1, 0, 0, 0, KV_SCALE, 0, 0)
    attend += struct.pack("<Q", KV_SEQ) + f32(q)
    assert (len(create), len(append) - 8 * n, len(attend)) == (32, 32, 48 + 4 * len(q))
    return {"kv-create.bin": create, "kv-append.bin": append, "kv-attend.bin": attend}, (k, v, q)


def kv_reference(k: List[float], v: List[float], q: List[float]) -> List[float]:
    """Dense attention of each query row over its KV head's tokens, in f64."""
    out = []
    for h in range(KV_HEADS):
        rows = range(h * KV_TOKENS, (h + 1) * KV_TOKENS)
        for g in range(KV_GROUP):
            qr = q[(h * KV_GROUP + g) * KV_DIM : (h * KV_GROUP + g + 1) * KV_DIM]
            s = [KV_SCALE * sum(a * b for a, b in zip(qr, k[t * KV_DIM : (t + 1) * KV_DIM])) for t in rows]
            m = max(s)
            e = [pow(2.718281828459045, x - m) for x in s]
            z = sum(e)
            out += [sum(w / z * v[t * KV_DIM + i] for w, t in zip(e, rows)) for i in range(KV_DIM)]
    return out


def _status(env: Env) -> Dict[str, dict]:
    p = env.cli("target", "status", "--json")
    assert p.returncode == 0, p.stderr
    return {t["listen"]: t for t in json.loads(p.stdout)["targets"]}


@pytest.fixture(scope="module")
def nvme_env(kinit) -> Env:
    """Two daemons: the target under test (namespace 1: an empty 256 MiB image; namespace 2: a
    64 MiB image with host-written data) with metrics, and one that admits only another host."""
    insitu = _insitu_bin()
    d = Path(tempfile.mkdtemp(prefix="insitu-nvme-tcp-", dir="/var/tmp"))
    port, deny_port, metrics_port = _free_ports(3)
    env = Env(insitu, d, port, deny_port, metrics_port, d / "ns1.img", d / "ns2.img", d / "ns3.img", b"", {}, {})
    private = d / "kv.img"  # the main target's KV cache
    try:
        with open(env.ns1, "wb") as f:
            f.truncate(NS1_BYTES)
        with open(env.ns3, "wb") as f:
            f.truncate(8 << 20)
        with open(private, "wb") as f:
            f.truncate(32 << 20)
        env.ns2_data = random.Random(20240101).randbytes(1 << 20)
        with open(env.ns2, "wb") as f:
            f.truncate(NS2_BYTES)
            f.seek(DATA_SECTOR * SECTOR)
            f.write(env.ns2_data)
            f.seek(RESULT_SECTOR * SECTOR)
            f.write(bytes([RESULT_FILL]) * RESULT_SECTORS * SECTOR)
        assert env.ns1.stat().st_blocks == 0 and env.ns2.stat().st_blocks * 512 < NS2_BYTES, "images should be sparse"

        data_in = [{"length": DATA_BYTES, "extents": [{"kind": "data", "start_sector": DATA_SECTOR, "sectors": 2048}]}]
        result = {"length": RESULT_SECTORS * SECTOR, "extents": [{"kind": "data", "start_sector": RESULT_SECTOR, "sectors": RESULT_SECTORS}]}
        past_end = [{"length": 4096, "extents": [{"kind": "data", "start_sector": NS2_BYTES // SECTOR - 4, "sectors": 8}]}]
        for name, blob in (
            ("desc.bin", make_descriptor(data_in, result)),
            ("desc-noresult.bin", make_descriptor(data_in, None)),
            ("desc-range.bin", make_descriptor(past_end, result)),
        ):
            env.descriptors[name] = d / name
            env.descriptors[name].write_bytes(blob)
        kv_files, env.kv = kv_requests(random.Random(20261202))
        for name, blob in kv_files.items():
            env.descriptors[name] = d / name
            env.descriptors[name].write_bytes(blob)

        for p, args in (
            (port, ["--nqn", NQN, "--namespace", env.ns1, "--namespace", env.ns2, "--private", private, "--metrics", f"127.0.0.1:{metrics_port}"]),
            (deny_port, ["--nqn", DENY_NQN, "--namespace", env.ns3, "--allow-host", OTHER_HOST]),
        ):
            r = env.cli("target", "start", "--listen", f"127.0.0.1:{p}", *args, "--json")
            assert r.returncode == 0, f"target start on {p} exited {r.returncode}: {r.stderr}"
            doc = json.loads(r.stdout)
            assert doc["listen"] == f"127.0.0.1:{p}" and doc["pid"] > 0, doc
            env.started[p] = doc
        yield env
    finally:
        try:
            _stop_all(env)
        finally:
            keep = os.environ.get("INSITU_NVME_TCP_KEEP")
            if keep:  # a directory to keep the guest log, the capture and the target logs in
                Path(keep).mkdir(parents=True, exist_ok=True)
                for f in [d / "guest.log", d / "nvme-tcp.pcapng", d / "nvme-tcp.log"] + [Path(doc["log"]) for doc in env.started.values()]:
                    if f.exists():
                        shutil.copy(f, Path(keep) / f.name)
            shutil.rmtree(d, ignore_errors=True)


def _stop_all(env: Env) -> None:
    """Stops the daemons (in parallel: `target stop` waits up to 10 s for each)."""
    procs = {
        p: subprocess.Popen([env.insitu, "target", "stop", "--listen", f"127.0.0.1:{p}", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for p in env.started
    }
    errors = []
    for p, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            errors.append(f"target stop --listen 127.0.0.1:{p} exited {proc.returncode}: {err.strip()}")
    for p, doc in env.started.items():
        try:
            os.kill(doc["pid"], 0)
            state = Path(f"/proc/{doc['pid']}/stat").read_text().split(") ")[1][0]
        except (ProcessLookupError, FileNotFoundError):
            state = "gone"
        if state not in ("gone", "Z"):
            errors.append(f"the daemon for port {p} (pid {doc['pid']}) still runs after `target stop` (state {state})")
    left = [l for l in _status(env) if l in {f"127.0.0.1:{p}" for p in env.started}]
    if left:
        errors.append(f"`target status` still lists {left} after stop")
    assert not errors, "; ".join(errors)


def test_status_lists_the_daemons(nvme_env):
    st = _status(nvme_env)
    for p, doc in nvme_env.started.items():
        rec = st.get(f"127.0.0.1:{p}")
        assert rec is not None, f"`insitu target status --json` does not list 127.0.0.1:{p}: {st}"
        assert rec["running"] is True and rec["pid"] == doc["pid"], rec
    main = st[f"127.0.0.1:{nvme_env.port}"]
    assert main["nqn"] == NQN and main["metrics"] == f"127.0.0.1:{nvme_env.metrics_port}"
    assert [Path(p).resolve() for p in main["namespaces"]] == [nvme_env.ns1, nvme_env.ns2]
    assert st[f"127.0.0.1:{nvme_env.deny_port}"]["allow_hosts"] == [OTHER_HOST]


# --------------------------------------------------------------------------- the guest run


@dataclasses.dataclass
class GuestRun:
    rc: int
    output: str
    seconds: float
    markers: Dict[str, List[str]]
    pcap: Path
    tshark_log: str

    def one(self, key: str) -> str:
        vals = self.markers.get(key)
        assert vals, f"the guest printed no {key}= line; its output ends:\n{self.output[-3000:]}"
        return vals[-1]


def _start_capture(tshark: str, pcap: Path, ports: List[int]) -> Tuple[subprocess.Popen, Path]:
    log = pcap.with_suffix(".log")
    filt = " or ".join(f"tcp port {p}" for p in ports)
    proc = subprocess.Popen([tshark, "-i", "lo", "-B", "1024", "-f", filt, "-w", str(pcap)], stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    deadline = time.monotonic() + 30
    while "Capturing on" not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"tshark exited {proc.returncode}: {log.read_text(errors='replace')}"
        assert time.monotonic() < deadline, f"tshark did not start capturing: {log.read_text(errors='replace')}"
        time.sleep(0.1)
    time.sleep(0.5)
    return proc, log


def _stop_capture(proc: subprocess.Popen, log: Path) -> str:
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return log.read_text(errors="replace")


@pytest.fixture(scope="module")
def guest_run(nvme_env, kinit, tshark) -> GuestRun:
    env = nvme_env
    pcap = env.dir / "nvme-tcp.pcapng"
    cap, caplog = _start_capture(tshark, pcap, [env.port, env.deny_port])
    argv = [
        str(kinit),
        "-q",
        "-t",
        "300",
        "-e",
        f"KINIT_NQN={NQN}",
        "-e",
        f"KINIT_PORT={env.port}",
        "-e",
        f"KINIT_DENY_NQN={DENY_NQN}",
        "-e",
        f"KINIT_DENY_PORT={env.deny_port}",
        "-e",
        f"KINIT_RESULT_SECTOR={RESULT_SECTOR}",
        "-e",
        f"KINIT_RESULT_SECTORS={RESULT_SECTORS}",
        "-e",
        f"KINIT_NS2_DATA_SECTOR={DATA_SECTOR}",
        "-e",
        f"KINIT_NS2_DATA_BYTES={DATA_BYTES}",
    ]
    for path in env.descriptors.values():
        argv += ["-a", str(path)]
    argv.append(str(SNIPPET))
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=360)
    finally:
        tlog = _stop_capture(cap, caplog)
    out = p.stdout + p.stderr
    markers: Dict[str, List[str]] = collections.defaultdict(list)
    for line in out.splitlines():
        m = re.match(r"^([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m:
            markers[m.group(1)].append(m.group(2).rstrip())
    run = GuestRun(p.returncode, out, time.monotonic() - t0, dict(markers), pcap, tlog)
    (env.dir / "guest.log").write_text(out)
    return run


def test_guest_workload(guest_run, nvme_env):
    """The snippet ran every step (exit 0, or 3: completed with content checks that the
    dedicated tests below judge)."""
    g = guest_run
    assert g.rc in (0, 3) and "WORKLOAD COMPLETED" in g.output, (
        f"guest exited {g.rc}; failed step: {g.markers.get('STEP_FAILED')}; output ends:\n{g.output[-4000:]}"
    )
    for key in ("RAW_RW_OK", "FS_OK", "DISCONNECT_OK"):
        assert g.one(key) == "1"
    assert g.one("IDCTRL_SUBNQN") == NQN
    # Namespace 3 is the private one (the KV cache): counted, but inactive to every host.
    assert int(g.one("IDCTRL_NN"), 0) == 3
    assert int(g.one("NS1_BYTES")) == NS1_BYTES and int(g.one("NS2_BYTES")) == NS2_BYTES
    assert int(g.one("NS1_NSZE"), 16) * int(g.one("NS1_LBS")) == NS1_BYTES
    assert int(g.one("NS2_NSZE"), 16) * int(g.one("NS2_LBS")) == NS2_BYTES
    # what the host wrote into the image file before starting the target, read by the guest
    assert g.one("NS2_DATA_SHA256") == hashlib.sha256(nvme_env.ns2_data[:DATA_BYTES]).hexdigest()
    assert len(g.markers.get("FS_SHA256", [])) == 6


def _identify(output: str, prefix: str) -> Dict[str, str]:
    fields = {}
    for line in output.splitlines():
        if line.startswith(prefix + ": ") and " : " in line:
            k, v = line[len(prefix) + 2 :].split(" : ", 1)
            fields.setdefault(k.strip(), v.strip())
    return fields


def test_identify(guest_run):
    """Identify Controller has the fabric fields an NVMe/TCP I/O controller needs; the two
    namespaces have distinct, non-zero NGUIDs."""
    ctrl = _identify(guest_run.output, "IDCTRL")
    assert ctrl, "no id-ctrl output"
    num = lambda k: int(ctrl[k], 0)  # noqa: E731
    assert num("cntrltype") == 1, ctrl  # I/O controller
    assert num("ioccsz") >= 4 and num("iorcsz") >= 1, ctrl  # capsule sizes in 16-byte units
    assert num("sgls") & 0x3 != 0, ctrl  # SGLs supported (the fabric transports use SGLs only)
    assert num("maxcmd") > 0 and num("nn") == 3 and num("mdts") > 0, ctrl
    assert num("sqes") == 0x66 and num("cqes") == 0x44, ctrl
    assert ctrl["subnqn"] == NQN
    nguids = [_identify(guest_run.output, f"IDNS{n}").get("nguid") for n in (1, 2)]
    assert None not in nguids and len(set(nguids)) == 2 and int(nguids[0], 16) and int(nguids[1], 16), nguids


def test_discovery_log(guest_run, nvme_env):
    """`nvme discover` lists the subsystem with the right NQN, address and port."""
    lines = [l[len("DISC: ") :] for l in guest_run.output.splitlines() if l.startswith("DISC: ")]
    entries, cur = [], None
    for l in lines:
        if l.startswith("=====Discovery Log Entry"):
            cur = {}
            entries.append(cur)
        elif cur is not None and ":" in l:
            k, v = l.split(":", 1)
            cur[k.strip()] = v.strip()
    subsystems = [e for e in entries if e.get("subtype") == "nvme subsystem"]
    assert len(subsystems) == 1, f"discovery log entries: {entries}"
    e = subsystems[0]
    assert (e.get("trtype"), e.get("adrfam"), e.get("trsvcid")) == ("tcp", "ipv4", str(nvme_env.port)), e
    assert e.get("subnqn") == NQN and e.get("traddr") == "127.0.0.1", (
        f"discovery log entry has subnqn={e.get('subnqn')!r} traddr={e.get('traddr')!r} "
        f"(expected subnqn={NQN!r} traddr='127.0.0.1'; SUBNQN is bytes 256..511 of an entry, TRADDR 512..767)"
    )


def test_exec_result(guest_run, nvme_env):
    """EXEC with a result object: dword 0 is the result length, the result object's first
    bytes are the ISRS result with the crc32c the host computes over the same bytes."""
    g = guest_run
    assert g.one("EXEC_RC") == "0", g.one("EXEC_OUT")
    dw0 = int(g.one("RESULT_DW0"), 16)
    raw = bytes.fromhex(g.one("RESULT_HEX"))
    assert len(raw) == RESULT_SECTORS * SECTOR
    assert raw.startswith(b"ISRS"), raw[:32].hex()
    expected = "%08x" % crc32c.crc32c(nvme_env.ns2_data[:DATA_BYTES])
    assert expected.encode() in raw[:dw0], f"crc32c {expected} not in the result {raw[:dw0]!r}"
    assert 8 < dw0 <= len(raw)
    records = decode_result(raw[:dw0])
    assert records == [[("digest", expected)]], records


def test_kv_attention_through_the_kernel(guest_run, nvme_env):
    """Create, append, attend and result through the stock kernel's passthrough ioctl: the
    append took every token, and the result is dense attention over them, within f32
    rounding of an f64 computation here and bit for bit what insitu's own initiator gets
    from the same target for the same requests."""
    g = guest_run
    for step in ("KV_CREATE", "KV_APPEND", "KV_ATTEND"):
        assert g.one(f"{step}_RC") == "0", g.one(f"{step}_OUT")
    assert int(g.one("KV_APPEND_DW0"), 16) == KV_TOKENS
    rows = KV_HEADS * KV_GROUP * KV_DIM
    data = bytes.fromhex(g.one("KV_RESULT_HEX"))
    assert int(g.one("KV_RESULT_LEN")) == len(data) == 48 + 4 * rows, (g.one("KV_RESULT_LEN"), len(data))
    magic, version, flags, entries, heads, group, dim = struct.unpack_from("<4sBBHHHH", data)
    assert (magic, version, flags, entries, heads, group, dim) == (b"KVRS", 1, 0, 1, KV_HEADS, KV_GROUP, KV_DIM)
    pages, media, used = struct.unpack_from("<QQQ", data, 16)
    assert used == KV_HEADS * KV_TOKENS * 2 and media > 0, (pages, media, used)
    out = struct.unpack_from(f"<{rows}f", data, 48)
    k, v, q = nvme_env.kv
    for got, want in zip(out, kv_reference(k, v, q)):
        assert abs(got - want) < 1e-5, (got, want)
    import insitu

    kvt = insitu.KvTarget(f"nvme-tcp://127.0.0.1:{nvme_env.port}/{NQN}")
    try:
        kvt.create(KV_SEQ + 1, 1, KV_HEADS, KV_DIM)
        f32 = lambda xs: struct.pack(f"<{len(xs)}f", *xs)  # noqa: E731
        kvt.append(KV_SEQ + 1, 0, KV_TOKENS, f32(k), f32(v))
        mine = kvt.attend(0, [KV_SEQ + 1], f32(q), KV_GROUP, KV_SCALE)[0]
        assert bytes(mine) == data[48:], "the kernel's result differs from insitu's initiator's"
        kvt.free(KV_SEQ + 1)
    finally:
        kvt.disconnect()


def test_exec_errors(guest_run):
    g = guest_run
    out = g.one("EXEC_NORESULT_OUT")
    assert g.one("EXEC_NORESULT_RC") != "0", out
    assert "0x4002" in out or "Invalid Field" in out, f"EXEC without a result object: {out}"
    out = g.one("EXEC_RANGE_OUT")
    assert g.one("EXEC_RANGE_RC") != "0", out
    assert "0x4080" in out or "LBA Out of Range" in out, f"EXEC with an extent past the namespace: {out}"


def test_refused_host(guest_run, nvme_env):
    """A target started with --allow-host OTHER refuses the guest's host NQN at Connect."""
    g = guest_run
    assert g.one("DENY_CONNECT_RC") != "0", g.one("DENY_CONNECT_OUT")
    assert g.one("DENY_CONTROLLERS") == "0"
    # the kernel's wording for Connect Invalid Host (SCT 1, SC 0x84)
    assert "not allowed" in g.one("DENY_DMESG"), g.one("DENY_DMESG")
    log = Path(nvme_env.started[nvme_env.deny_port]["log"]).read_text(errors="replace")
    assert GUEST_HOSTNQN in log, log[-2000:]


KMSG_PROBLEM = re.compile(
    r"error|fail|timeout|timed out|reset|reconnect|invalid|unexpected|warn|abort|corrupt|"
    r"refused|out of range|mismatch|bad|stall",
    re.IGNORECASE,
)


def test_kernel_log_clean(guest_run):
    """The initiator logged nothing alarming about the target (the refused connect's lines
    are left out by the snippet)."""
    kmsg = [l[len("KMSG: ") :] for l in guest_run.output.splitlines() if l.startswith("KMSG: ")]
    assert any("new ctrl" in l and NQN in l for l in kmsg), kmsg
    problems = [l for l in kmsg if KMSG_PROBLEM.search(l)]
    assert not problems, "kernel log:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- the wire


@dataclasses.dataclass
class Pdu:
    frame: int
    stream: int
    to_target: bool
    type: int
    hlen: int
    pdo: int
    plen: int


@dataclasses.dataclass
class Capture:
    pdus: List[Pdu]
    stream_port: Dict[int, int]  # tcp.stream -> target port
    stream_bytes: Dict[Tuple[int, bool], int]  # (stream, to_target) -> TCP payload bytes
    commands: List[Tuple[int, int, int, Optional[int], Optional[int], int]]  # frame, stream, cid, opc, fctype, plen
    completions: List[Tuple[int, int, int, int, int]]  # frame, stream, cid, status field, dword0
    frames: int


FIELDS = [
    "frame.number",
    "tcp.stream",
    "tcp.srcport",
    "tcp.dstport",
    "tcp.seq",
    "tcp.len",
    "nvme-tcp.type",
    "nvme-tcp.hlen",
    "nvme-tcp.pdo",
    "nvme-tcp.plen",
    "nvme.cmd.opc",
    "nvme.cmd.cid",
    "nvme.fabrics.cmd.fctype",
    "nvme.fabrics.cmd.cid",
    "nvme.cqe.cid",
    "nvme.cqe.status",
    "nvme.cqe.dword0",
]


def _tshark(tshark: str, pcap: Path, ports: List[int], *args: str) -> str:
    # A capture on loopback can record a connection's segments out of order (the sender's
    # CPUs hand them to the capture, not the receiving socket). tshark leaves such segments
    # out of its reassembly by default, and a 1 MiB H2CData PDU spanning them is then not
    # decoded at all, though the target received it (1 CI run in many): reassemble them as
    # the receiving TCP does.
    decode = ["-o", "tcp.reassemble_out_of_order:TRUE"]
    for p in ports:
        decode += ["-d", f"tcp.port=={p},nvme-tcp"]
    p = subprocess.run([tshark, "-r", str(pcap), *decode, *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"tshark {' '.join(args)} exited {p.returncode}: {p.stderr[-1000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def capture(guest_run, nvme_env, tshark) -> Capture:
    assert guest_run.pcap.exists(), f"no capture file; tshark said: {guest_run.tshark_log}"
    dropped = re.search(r"(\d+) packets? dropped", guest_run.tshark_log)
    assert not dropped or dropped.group(1) == "0", f"the capture lost packets ({guest_run.tshark_log.strip()}); the wire checks need a complete capture"
    ports = [nvme_env.port, nvme_env.deny_port]
    args = ["-T", "fields", "-E", "occurrence=a", "-E", "separator=/t", "-E", "aggregator=,"]
    for f in FIELDS:
        args += ["-e", f]
    text = _tshark(tshark, guest_run.pcap, ports, *args)
    pdus, commands, completions = [], [], []
    stream_port: Dict[int, int] = {}
    stream_end: Dict[Tuple[int, bool], int] = collections.Counter()
    frames = 0
    for line in text.splitlines():
        frames += 1
        row = dict(zip(FIELDS, line.split("\t")))
        lst = lambda k: [int(x, 0) for x in row.get(k, "").split(",") if x]  # noqa: E731
        frame, stream = int(row["frame.number"]), int(row["tcp.stream"])
        src, dst = int(row["tcp.srcport"]), int(row["tcp.dstport"])
        to_target = dst in ports
        stream_port[stream] = dst if to_target else src
        if row["tcp.len"] and int(row["tcp.len"]) > 0:
            end = int(row["tcp.seq"]) + int(row["tcp.len"])
            stream_end[(stream, to_target)] = max(stream_end[(stream, to_target)], end)
        types, hlens, pdos, plens = lst("nvme-tcp.type"), lst("nvme-tcp.hlen"), lst("nvme-tcp.pdo"), lst("nvme-tcp.plen")
        assert len(types) == len(hlens) == len(pdos) == len(plens), f"frame {frame}: {row}"
        for t, h, o, n in zip(types, hlens, pdos, plens):
            pdus.append(Pdu(frame, stream, to_target, t, h, o, n))
        ncmd = types.count(4)
        opcs, cids = lst("nvme.cmd.opc"), lst("nvme.cmd.cid")
        fcts, fcids = lst("nvme.fabrics.cmd.fctype"), lst("nvme.fabrics.cmd.cid")
        assert len(opcs) == len(cids) and len(fcts) == len(fcids) and len(opcs) + len(fcts) == ncmd, (
            f"frame {frame}: {ncmd} capsules but opcodes {opcs}/{cids} fabrics {fcts}/{fcids}"
        )
        cmd_plens = [n for t, n in zip(types, plens) if t == 4]
        for i, (opc, cid) in enumerate(zip(opcs, cids)):
            commands.append((frame, stream, cid, opc, None, cmd_plens[i] if len(cmd_plens) == 1 else -1))
        for fct, cid in zip(fcts, fcids):
            commands.append((frame, stream, cid, None, fct, -1))
        ccids, sts, dw0s = lst("nvme.cqe.cid"), lst("nvme.cqe.status"), lst("nvme.cqe.dword0")
        assert len(ccids) == len(sts) == types.count(5), f"frame {frame}: {types} cqe cids {ccids} status {sts}"
        if len(dw0s) != len(ccids):
            dw0s = [-1] * len(ccids)
        for cid, st, dw0 in zip(ccids, sts, dw0s):
            # tshark shows the 16-bit word with the phase tag in bit 0
            completions.append((frame, stream, cid, st >> 1, dw0))
    # relative sequence numbers start at 1 after the SYN
    stream_bytes = {k: v - 1 for k, v in stream_end.items()}
    return Capture(pdus, stream_port, stream_bytes, commands, completions, frames)


def test_wire_every_pdu_decodes(capture, guest_run, nvme_env, tshark):
    """Every byte of every connection is inside a PDU tshark's NVMe/TCP dissector decodes,
    with the header lengths the specification gives; no malformed frames, no expert errors."""
    c = capture
    assert c.frames > 1000 and c.pdus, "the capture is (nearly) empty"
    bad = [
        p
        for p in c.pdus
        if p.type not in PDU_HLEN
        or p.hlen != PDU_HLEN[p.type]
        or p.plen < p.hlen
        or (p.type in (6, 7) and p.pdo not in (0, p.hlen))
        or (p.type not in (6, 7) and p.type != 4 and p.plen != p.hlen)
    ]
    assert not bad, f"PDUs with unexpected type/header length/data offset: {bad[:10]}"
    covered = collections.Counter()
    for p in c.pdus:
        covered[(p.stream, p.to_target)] += p.plen
    gaps = {k: (n, covered[k]) for k, n in c.stream_bytes.items() if covered[k] != n}
    assert not gaps, f"(stream, to target): (TCP payload bytes, bytes in decoded PDUs) differ: {gaps}"
    ports = [nvme_env.port, nvme_env.deny_port]
    malformed = _tshark(tshark, guest_run.pcap, ports, "-Y", "_ws.malformed || nvme-tcp.unknown_data", "-T", "fields", "-e", "frame.number")
    assert not malformed.strip(), f"malformed frames: {malformed.split()[:20]}"
    expert = _tshark(tshark, guest_run.pcap, ports, "-q", "-z", "expert,note")
    assert not re.search(r"^Errors \(", expert, re.M), expert
    nvme_expert = [l for l in expert.splitlines() if re.search(r"\bNVMe", l)]
    assert not nvme_expert, "NVMe expert infos:\n" + "\n".join(nvme_expert)
    termreqs = [p for p in c.pdus if p.type in (2, 3)]
    assert not termreqs, f"termination requests: {termreqs}"


def test_wire_connection_openings(capture, nvme_env):
    """Each connection opens ICReq -> ICResp -> Connect capsule -> response; every command
    gets exactly one completion."""
    c = capture
    by_stream: Dict[int, List[Pdu]] = collections.defaultdict(list)
    for p in c.pdus:
        by_stream[p.stream].append(p)
    main = [s for s, port in c.stream_port.items() if port == nvme_env.port]
    deny = [s for s, port in c.stream_port.items() if port == nvme_env.deny_port]
    # discovery + admin + one I/O queue per guest vCPU (2)
    assert len(main) >= 3, f"connections to the target: {main}"
    assert len(deny) >= 1, "no connection to the --allow-host target"
    connect_frames = {f for f, s, cid, opc, fct, _ in c.commands if fct == FCTYPE_CONNECT}
    for s, pdus in sorted(by_stream.items()):
        head = [(p.to_target, p.type) for p in pdus[:4]]
        assert head == [(True, 0), (False, 1), (True, 4), (False, 5)], (
            f"stream {s} opens with {[(('H' if d else 'C') + ':' + PDU_NAMES.get(t, str(t))) for d, t in head]}"
        )
        assert pdus[2].frame in connect_frames, f"stream {s}: the first capsule (frame {pdus[2].frame}) is not a Connect"
        cmds = collections.Counter(cid for f, st, cid, *_ in c.commands if st == s)
        cqes = collections.Counter(cid for f, st, cid, *_ in c.completions if st == s)
        assert cmds == cqes, f"stream {s}: commands without a completion {cmds - cqes}, completions without a command {cqes - cmds}"
    types = collections.Counter(p.type for p in c.pdus)
    for t in (6, 7, 9):
        assert types[t] > 0, f"no {PDU_NAMES[t]} PDU in the capture: {types}"
    assert types[6] >= types[9], f"fewer H2CData than R2T: {types}"


def test_wire_exec_and_statuses(capture, guest_run, nvme_env):
    """The EXEC commands are on the wire with their descriptors in the capsule, and their
    completions carry the statuses and dword 0 the guest reported; no other command failed
    except the refused Connect."""
    c = capture
    by_key = {}
    for f, s, cid, st, dw0 in c.completions:
        by_key.setdefault((s, cid), []).append((f, st, dw0))
    execs = [(f, s, cid, plen) for f, s, cid, opc, fct, plen in c.commands if opc == OPC_EXEC]
    assert len(execs) == 3, f"EXEC commands on the wire: {execs}"
    # the descriptor travels in the capsule (72-byte header + data) or, if the target's
    # in-capsule size is smaller, after an R2T (a bare 72-byte capsule)
    sizes = {p.stat().st_size for p in nvme_env.descriptors.values()}
    assert all(plen in (-1, 72) or plen - 72 in sizes for *_, plen in execs), execs
    statuses = []
    for f, s, cid, _ in execs:
        later = [x for x in by_key.get((s, cid), []) if x[0] > f]
        assert later, f"no completion for the EXEC in frame {f}"
        statuses.append(later[0][1:])
    dw0 = int(guest_run.one("RESULT_DW0"), 16)
    assert sorted(statuses) == sorted([(0, dw0), (ST_INVALID_FIELD, 0), (ST_LBA_OUT_OF_RANGE, 0)]), statuses
    failed = sorted({st for f, s, cid, st, _ in c.completions if st})
    assert failed == sorted([ST_INVALID_FIELD, ST_LBA_OUT_OF_RANGE, ST_CONNECT_INVALID_HOST]), (
        f"non-zero completion statuses on the wire: {[hex(x) for x in failed]}"
    )
    deny = {s for s, port in c.stream_port.items() if port == nvme_env.deny_port}
    assert {st for f, s, cid, st, _ in c.completions if s in deny} == {ST_CONNECT_INVALID_HOST}


# --------------------------------------------------------------------------- metrics


def test_metrics(guest_run, nvme_env):
    url = f"http://127.0.0.1:{nvme_env.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    series = []  # (name, labels, value)
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(\{[^}]*\})? (\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            series.append((m.group(1), labels, float(m.group(3))))

    def get(name, **want):
        """Sum of the series `name` whose labels include `want` (a series may carry more,
        e.g. EXEC's function)."""
        return sum(v for n, labels, v in series if n == name and all(labels.get(k) == str(x) for k, x in want.items()))

    assert get("insitu_commands_total", nsid=2, command="exec", function="crc32c") == 3, text
    assert get("insitu_commands_total", nsid=1, command="write") > 0, text
    assert get("insitu_commands_total", nsid=1, command="read") > 0, text
    assert get("insitu_commands_total", nsid=2, command="read") > 0, text
    assert get("insitu_commands_total", nsid=2, command="exec") == 3, text
    assert get("insitu_command_errors_total", nsid=2, command="exec") == 2, text
    assert get("insitu_command_errors_total", nsid=1, command="write") == 0, text
    assert get("insitu_command_errors_total", nsid=1, command="read") == 0, text
    assert [v for n, _, v in series if n == "insitu_protocol_errors_total"] == [0.0], text
    # The one successful EXEC read its 1 MiB input on the target, not over the link.
    assert get("insitu_media_bytes_total", nsid=2, command="exec", function="crc32c") >= 1 << 20, text
    assert get("insitu_link_bytes_total", nsid=2, command="exec") < 64 << 10, text
    # ~16 MiB of files + 8 MiB raw went to the target
    assert get("insitu_wire_bytes_total", direction="to_target") > 24 << 20, text
    assert get("insitu_wire_bytes_total", direction="to_host") > 8 << 20, text
    assert get("insitu_command_seconds_count", nsid=2, command="exec") == 3, text
    # The guest's KV sequence went with its controller when it disconnected.
    assert get("insitu_kv_reclaimed_sequences_total", subsystem=NQN) == 1, text
    assert get("insitu_kv_sequences", subsystem=NQN) == 0 and get("insitu_kv_pages", subsystem=NQN, state="used") == 0, text
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{nvme_env.metrics_port}/admin", timeout=10)
    assert e.value.code == 404


# --------------------------------------------------------------------------- after a crash


def test_data_survives_target_kill(guest_run, nvme_env):
    """SIGKILL the target after the guest unmounted and disconnected: the image files hold a
    clean ext4 with every file the guest wrote, and the EXEC result. (Runs last: it kills the
    module's target.)"""
    assert guest_run.rc in (0, 3), "the guest workload did not complete"
    pid = nvme_env.started[nvme_env.port]["pid"]
    os.kill(pid, signal.SIGKILL)
    nvme_env.killed = True
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z":
                break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    fsck = subprocess.run(["e2fsck", "-fn", str(nvme_env.ns1)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    dump = nvme_env.dir / "dump"
    for entry in guest_run.markers["FS_SHA256"]:
        name, digest = entry.split(":")
        p = subprocess.run(["debugfs", "-R", f"dump /{name} {dump}", str(nvme_env.ns1)], capture_output=True, text=True)
        assert p.returncode == 0 and dump.exists(), p.stderr
        assert hashlib.sha256(dump.read_bytes()).hexdigest() == digest, f"{name} differs in the image file"
        dump.unlink()
    dw0 = int(guest_run.one("RESULT_DW0"), 16)
    with open(nvme_env.ns2, "rb") as f:
        f.seek(RESULT_SECTOR * SECTOR)
        on_disk = f.read(RESULT_SECTORS * SECTOR)
    assert on_disk[:dw0] == bytes.fromhex(guest_run.one("RESULT_HEX"))[:dw0]
    with open(nvme_env.ns2, "rb") as f:
        f.seek(DATA_SECTOR * SECTOR)
        assert f.read(len(nvme_env.ns2_data)) == nvme_env.ns2_data, "EXEC changed its input"

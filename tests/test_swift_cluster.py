# SPDX-License-Identifier: Apache-2.0
"""`insitu swift up|down|status|once`: a real Swift 2.30 cluster (erasure-coded policy
2+1) whose devices are XFS file systems on embedded insitu targets.

An object PUT through the proxy comes back byte for byte; its K+M fragment archives lie
one per device as ``#FRAG#d.data``; a corrupted fragment is quarantined by the auditor and
rebuilt by the reconstructor; `down` leaves nothing mounted or running and `up` again
brings the same objects back; an `up` that fails midway undoes itself; bad input fails
with exit 2 and a message. On a 4+2 cluster of their own, with targets stopped: scrub
audits the devices that are up (quarantining as usual) and reports the others, also one
that goes away mid-audit; wc and grep stay exact with two of six targets stopped.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from swift_fixture import (  # noqa: E402,F401
    INSITU,
    SwiftCluster,
    start_cluster,
    stop_cluster,
    swift_cli,
    swift_cluster,
    swift_json,
    swift_missing,
)

from insitu.swift import client  # noqa: E402

SWIFT_EC = "2+1"
SWIFT_SEGMENT_SIZE = "256K"


def _mounts_under(d: Path) -> List[str]:
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines() if line.split()[1].startswith(f"{d}/")]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _pids_of(c: SwiftCluster) -> List[int]:
    """Every process of the cluster: supervisor, servers, memcached, embedded targets."""
    sup = json.loads((c.dir / "run" / "supervisor.json").read_text())
    targets = [t["pid"] for t in c.state()["private"]["targets"].values()]
    return [sup["pid"], *sup["servers"].values(), *targets]


def _error(*args: object) -> str:
    """Runs a command that must fail with exit 2; returns its message (the same on
    stderr and as the --json error document)."""
    p = swift_cli(*args, "--json", timeout=120)
    assert p.returncode == 2, f"exit {p.returncode}: {p.stdout[-1000:]} {p.stderr[-2000:]}"
    assert "Traceback" not in p.stderr, p.stderr
    msg = json.loads(p.stdout)["error"]
    assert msg in p.stderr
    return msg


def test_up_reports_the_cluster(swift_cluster: SwiftCluster):
    doc = swift_cluster.doc
    for key in ("proxy", "auth", "user", "key", "devices"):
        assert key in doc, key
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", doc["proxy"])
    assert doc["auth"] == doc["proxy"] + "/auth/v1.0"
    assert (doc["user"], doc["key"]) == ("test:tester", "testing")
    assert sorted(doc["devices"]) == ["d0", "d1", "d2"]
    for name, d in doc["devices"].items():
        assert set(d) == {"mount", "target"}
        assert d["mount"] == str(swift_cluster.dir / "node" / name)
        assert d["target"].startswith("nvme-tcp://127.0.0.1:") and d["target"].endswith(f"swift-{name}/1")
        fs = [line.split()[2] for line in Path("/proc/self/mounts").read_text().splitlines() if line.split()[1] == d["mount"]]
        assert fs == ["xfs"], f"{d['mount']}: {fs}"
    assert doc["policy"]["ec_type"] in ("isa_l_rs_vand", "liberasurecode_rs_vand")
    assert (doc["policy"]["k"], doc["policy"]["m"], doc["policy"]["segment_size"]) == (2, 1, 256 << 10)
    # The state file is the same document plus its private part.
    state = swift_cluster.state()
    assert {k: v for k, v in state.items() if k != "private"} == doc
    # Swift's own files, where --swift-dir DIR finds them.
    for name in ("swift.conf", "account.ring.gz", "container.ring.gz", "object.ring.gz", "object-1.ring.gz", "proxy-server.conf", "object-server.conf"):
        assert (swift_cluster.dir / name).is_file(), name
    conf = (swift_cluster.dir / "swift.conf").read_text()
    assert "ec_num_data_fragments = 2" in conf and "ec_num_parity_fragments = 1" in conf
    assert "ec_object_segment_size = 262144" in conf
    # The real /etc/swift is untouched: the cluster's swift.conf is seen only in its namespace.
    assert Path("/etc/swift/swift.conf").read_text() != conf


def test_put_get_round_trips_and_fragments_lie_on_every_device(swift_cluster: SwiftCluster):
    url, token = swift_cluster.login()
    client.put_container(url, token, "bucket")
    data = os.urandom(3 * 256 * 1024 + 12345)  # 4 segments, the last one short
    etag = client.put_object(url, token, "bucket", "dir/obj.bin", data)
    assert etag == hashlib.md5(data).hexdigest()
    assert client.get_object(url, token, "bucket", "dir/obj.bin") == data
    head = client.head_object(url, token, "bucket", "dir/obj.bin")
    assert int(head["content-length"]) == len(data)
    assert client.get_object(url, token, "bucket", "dir/obj.bin", {"Range": "bytes=1000-299999"}) == data[1000:300000]

    frags = swift_cluster.fragments("bucket", "dir/obj.bin")
    assert len(frags) == 3, frags
    devices = {p.relative_to(swift_cluster.dir / "node").parts[0] for p in frags}
    assert devices == {"d0", "d1", "d2"}
    indexes = set()
    for p in frags:
        m = re.fullmatch(r"\d+\.\d+#(\d+)#d\.data", p.name)
        assert m, p.name
        indexes.add(int(m.group(1)))
        assert p.parts[-5] == "objects-1"
    assert indexes == {0, 1, 2}
    # Each archive holds a third of every segment (plus fragment headers): far less than
    # the object, so no device holds a whole copy.
    for p in frags:
        assert len(data) / 2 <= p.stat().st_size < len(data) / 2 + 4096

    client.delete_object(url, token, "bucket", "dir/obj.bin")
    with pytest.raises(client.SwiftError) as e:
        client.get_object(url, token, "bucket", "dir/obj.bin")
    assert e.value.status == 404


def test_status_reports_every_part(swift_cluster: SwiftCluster):
    s = swift_json("status", swift_cluster.dir)
    assert s["state"] == "up" and s["problems"] == []
    assert set(s["servers"]) == {"memcached", "account", "container", "object", "proxy"}
    assert all(v["running"] and v["listening"] for v in s["servers"].values())
    assert all(d["mounted"] and d["target_running"] for d in s["devices"].values())
    text = swift_cli("status", swift_cluster.dir)
    assert text.returncode == 0 and "up" in text.stdout


def test_auditor_quarantines_and_reconstructor_rebuilds(swift_cluster: SwiftCluster):
    url, token = swift_cluster.login()
    client.put_container(url, token, "heal")
    data = os.urandom(600 * 1024)
    client.put_object(url, token, "heal", "o", data)
    victim = swift_cluster.fragments("heal", "o")[0]
    with open(victim, "r+b") as f:
        f.seek(200)
        f.write(b"\xff" * 64)
        f.flush()
        os.fsync(f.fileno())

    audit = swift_cluster.once("auditor")
    assert audit["rc"] == 0 and audit["wall_s"] > 0
    assert audit["stats"]["total_quarantined"] == 1, audit["summary"]
    assert not victim.exists()
    dev = victim.relative_to(swift_cluster.dir / "node").parts[0]
    assert list((swift_cluster.dir / "node" / dev / "quarantined" / "objects-1").glob(f"*/{victim.name}"))

    rebuilt = swift_cluster.once("reconstructor")
    assert rebuilt["rc"] == 0
    assert victim.exists(), rebuilt["tail"]
    assert client.get_object(url, token, "heal", "o") == data
    assert swift_cluster.once("auditor")["stats"]["total_quarantined"] == 0


def test_up_again_on_a_running_cluster_is_refused(swift_cluster: SwiftCluster):
    msg = _error("up", swift_cluster.dir, "--ec", SWIFT_EC)
    assert "already up" in msg and "down" in msg


@pytest.mark.parametrize("ec, why", [("4+", "K+M"), ("0+2", "at least 1"), ("2+0", "at least 1"), ("x", "K+M"), ("20+20", "at most 32")])
def test_bad_ec_is_refused(tmp_path: Path, ec: str, why: str):
    assert why in _error("up", tmp_path / "c", "--ec", ec)
    assert not (tmp_path / "c").exists()


def test_bad_input_is_refused(tmp_path: Path):
    if swift_missing():
        pytest.skip(swift_missing())
    assert "--ec K+M is needed" in _error("up", tmp_path / "a")
    assert "300 MiB" in _error("up", tmp_path / "a", "--ec", "2+1", "--size", "64M")
    assert "--segment-size" in _error("up", tmp_path / "a", "--ec", "2+1", "--segment-size", "lots")
    url = "nvme-tcp://127.0.0.1:1/nqn.2024-01.io.insitu:nobody"
    assert "at least 3 URLs" in _error("up", tmp_path / "a", "--ec", "2+1", url, url + "x")
    assert "given twice" in _error("up", tmp_path / "a", "--ec", "2+1", url, url, url)
    assert "127.0.0.1:1" in _error("up", tmp_path / "a", "--ec", "2+1", url, url + "1", url + "2")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "precious.txt").write_text("mine")
    assert "not empty" in _error("up", tmp_path / "full", "--ec", "2+1")
    assert (tmp_path / "full" / "precious.txt").read_text() == "mine"
    for cmd in ("down", "status"):
        assert "holds no cluster" in _error(cmd, tmp_path / "nothing")
    assert "holds no cluster" in _error("once", tmp_path / "nothing", "auditor")
    assert "invalid choice" in _error("once", tmp_path / "nothing", "sweeper")
    assert "unrecognized" in _error("up", tmp_path / "a", "--ec", "2+1", "--bogus")
    assert "5 or more parity" in _error("up", tmp_path / "a", "--ec", "2+5", "--ec-type", "isa_l_rs_vand")
    assert "not available" in _error("up", tmp_path / "a", "--ec", "2+1", "--ec-type", "no_such_code")


def test_up_that_fails_midway_leaves_nothing_behind(monkeypatch, capsys):
    """A taken --port fails before anything starts; a server that dies at start (its
    configuration broken after the devices were attached) makes `up` undo every device,
    target and process it started."""
    if swift_missing():
        pytest.skip(swift_missing())
    from insitu.swift import cli, cluster

    d = Path(tempfile.mkdtemp(prefix="insitu-swift-fail-", dir="/var/tmp"))
    blocker = socket.socket()
    try:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        assert "--port" in _error("up", d, "--ec", "2+1", "--port", blocker.getsockname()[1])
        blocker.close()
        assert sorted(p.name for p in d.iterdir()) in ([], ["log"])

        start_supervisor = cluster._start_supervisor

        def break_object_server(dir: Path, doc: dict) -> None:
            (dir / "object-server.conf").write_text("[DEFAULT]\nnot a configuration\n")
            start_supervisor(dir, doc)

        monkeypatch.setattr(cluster, "_start_supervisor", break_object_server)
        capsys.readouterr()
        assert cli.main(["up", str(d), "--ec", "2+1", "--json"]) == 2
        assert "object exited" in json.loads(capsys.readouterr().out)["error"]
        assert _mounts_under(d) == []
        assert sorted(x.name for x in d.iterdir()) == ["log"]
        assert not [f for f in Path("/run/insitu/attach").glob("*.json") if f"{d}/" in f.read_text()]
        assert not [f for f in Path("/run/insitu").glob("target-*.json") if f"{d}/" in f.read_text()]
        assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_mentions(p, d)]
    finally:
        blocker.close()
        if (d / "swift.json").exists():
            swift_cli("down", d)
        shutil.rmtree(d, ignore_errors=True)


def _cmdline_mentions(proc: Path, d: Path) -> bool:
    try:
        return str(d) in (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def test_up_on_given_targets(start_target):
    """Devices on target daemons the user runs: one per URL, formatted on the first up;
    `down` detaches them and leaves the targets running."""
    if swift_missing():
        pytest.skip(swift_missing())
    targets = [start_target(f"nqn.2024-01.io.insitu:swift-given-{i}", 320 << 20) for i in range(3)]
    d = Path(tempfile.mkdtemp(prefix="insitu-swift-urls-", dir="/var/tmp"))
    try:
        doc = swift_json("up", d, "--ec", "2+1", *[t.url for t in targets])
        assert [doc["devices"][f"d{i}"]["target"] for i in range(3)] == [f"{t.url}/1" for t in targets]
        assert not (d / "images").exists()
        c = SwiftCluster(d, doc)
        url, token = c.login()
        client.put_container(url, token, "c")
        data = os.urandom(70_000)
        client.put_object(url, token, "c", "o", data)
        assert client.get_object(url, token, "c", "o") == data
        assert len(c.fragments("c", "o")) == 3
        assert swift_cli("down", d).returncode == 0
        assert _mounts_under(d) == []
        assert all(_alive(t.doc["pid"]) for t in targets)
        assert "same targets" in _error("up", d, targets[0].url, targets[1].url, targets[0].url + "x")
    finally:
        swift_cli("down", d)
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------ devices down: scrub, wc, grep (4+2)
#
# A cluster of its own (six devices, small segments so that objects span several), since
# these tests stop targets. Each one brings the cluster back as it runs (`_restore`).

DEGRADED_EC = "4+2"
DEGRADED_SEGMENT = "64K"
C_LOCALE = {**os.environ, "LC_ALL": "C"}


def _text(length: int, seed: int) -> bytes:
    rng = random.Random(seed)
    words = [b"error", b"ERROR", b"ab", b"a", b"\xc3\xa9t\xc3\xa9", b"warn", b"x" * 40]
    out = bytearray()
    while len(out) < length:
        out += rng.choice(words) + rng.choice([b" ", b" ", b"\t", b"\n", b"\r\n", b"\n\n"])
    return bytes(out[:length])


DEGRADED_OBJECTS = {
    "text": _text(700_000, 1),  # 11 segments, every fragment of every segment
    "short": b"error in one line\nab\n",  # all of it in data fragment 0
    "blob": random.Random(2).randbytes(300_000),
}
DEGRADED_GREPS = [("error", []), ("error", ["-i"]), ("^ab", ["-E"]), ("\u00e9t\u00e9", [])]


@pytest.fixture(scope="module")
def ec42():
    """A 4+2 cluster with DEGRADED_OBJECTS in container "s"."""
    c = start_cluster(DEGRADED_EC, DEGRADED_SEGMENT)
    try:
        url, token = c.login()
        client.put_container(url, token, "s")
        for name, data in DEGRADED_OBJECTS.items():
            client.put_object(url, token, "s", name, data)
        yield c
    finally:
        stop_cluster(c)


def _insitu(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([INSITU, *map(str, args)], capture_output=True, text=True, timeout=300)


def _scrub(c: SwiftCluster, *extra: str) -> subprocess.CompletedProcess:
    p = _insitu("scrub", "--swift-dir", c.dir, *extra)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def _stop_targets(c: SwiftCluster, names: List[str]) -> None:
    for name in names:
        listen = c.devices[name]["target"].split("://", 1)[1].split("/", 1)[0]
        p = _insitu("target", "stop", "--listen", listen)
        assert p.returncode == 0, p.stderr


def _restore(c: SwiftCluster) -> None:
    """Brings stopped targets back: `insitu swift down` and `up` with the command line the
    fixture used. `up` starts every embedded target again and mounts every device anew (the
    XFS of a device whose target stopped may have shut down after its I/O errors)."""
    p = swift_cli("down", c.dir)
    assert p.returncode == 0, p.stderr
    c.doc = swift_json("up", c.dir, "--ec", DEGRADED_EC, "--segment-size", DEGRADED_SEGMENT)


def _shut_down_xfs(c: SwiftCluster, name: str) -> None:
    """Shuts device `name`'s XFS down as the kernel does after I/O errors (xfs_io's
    godown): from then on every access to it fails with EIO."""
    subprocess.run(["xfs_io", "-x", "-c", "shutdown", c.devices[name]["mount"]], check=True, capture_output=True)
    with pytest.raises(OSError):
        os.stat(c.devices[name]["mount"])


def _device_of(c: SwiftCluster, path: Path) -> str:
    return path.relative_to(c.dir / "node").parts[0]


def _data_files(c: SwiftCluster, name: str) -> int:
    return len(glob.glob(f"{c.devices[name]['mount']}/objects*/**/*.data", recursive=True))


def _system_wc(data: bytes) -> dict:
    out = subprocess.run(["wc"], input=data, capture_output=True, env=C_LOCALE, check=True).stdout.split()
    return {"lines": int(out[0]), "words": int(out[1]), "bytes": int(out[2])}


def _system_grep(pattern: str, flags: list, data: bytes) -> tuple:
    p = subprocess.run(["grep", "-a", "-n", "-b", *flags, "-e", pattern], input=data, capture_output=True, env=C_LOCALE)
    matches = [[int(n), int(at)] for n, at, _ in (line.split(b":", 2) for line in p.stdout.split(b"\n")[:-1])]
    return len(matches), matches


def test_scrub_skips_a_stopped_device_and_quarantines_on_the_others(ec42: SwiftCluster):
    """One target stopped: every other device is audited, a flipped byte in a fragment
    archive on one of them is quarantined as with all devices up, the stopped device is
    listed under `unreachable`, and the exit status is 5 (1 corrupt | 4 not all audited)."""
    c = ec42
    p = _scrub(c, "--json")
    assert p.returncode == 0, p.stderr
    clean = json.loads(p.stdout)
    assert (clean["devices"], clean["unreachable"], clean["corrupt"], clean["unreadable"]) == (6, [], [], [])
    total = clean["files"]
    by_device = {_device_of(c, f): f for f in c.fragments("s", "text")}
    assert len(by_device) == 6
    down, bad = sorted(by_device)[0], sorted(by_device)[-1]
    victim = by_device[bad]
    on_down = _data_files(c, down)
    assert on_down >= len(DEGRADED_OBJECTS)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    with open(victim, "r+b") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    h = victim.parent.name
    partition = victim.parent.parent.parent
    try:
        _stop_targets(c, [down])
        # Its XFS shuts down at its next write, which fails: now, so that every access to
        # the device fails with EIO, its mount point's too (a scrub used to stop there).
        _shut_down_xfs(c, down)
        p = _scrub(c, "--json")
        assert p.returncode == 5, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
        r = json.loads(p.stdout)
        assert [u["device"] for u in r["unreachable"]] == [down]
        assert "does not answer" in r["unreachable"][0]["error"]
        assert f"device {down} skipped" in p.stderr
        assert r["files"] == total - on_down
        assert [x["path"] for x in r["corrupt"]] == [str(victim)]
        corrupt = r["corrupt"][0]
        assert corrupt["device"] == bad and corrupt["md5"] != corrupt["etag"]
        assert corrupt["quarantined"] == str(c.dir / "node" / bad / "quarantined" / "objects-1" / h)
        assert (Path(corrupt["quarantined"]) / victim.name).is_file() and not victim.exists()
        assert victim.parent.parent.name in (partition / "hashes.invalid").read_text().split()
        # The text report says which device was skipped and why; nothing corrupt is left.
        p = _scrub(c)
        assert p.returncode == 4, (p.returncode, p.stdout, p.stderr)
        assert f"unreachable: device {down} skipped, not audited: its target " in p.stdout
        assert "does not answer" in p.stdout and "on 5 of 6 devices (1 unreachable: " + down + ")" in p.stdout
    finally:
        _restore(c)
    c.once("reconstructor")
    p = _scrub(c, "--json")
    assert p.returncode == 0, p.stdout[-2000:]
    assert json.loads(p.stdout)["files"] == total
    url, token = c.login()
    assert client.get_object(url, token, "s", "text") == DEGRADED_OBJECTS["text"]


def test_scrub_goes_on_when_a_device_goes_away_or_one_archive_fails(ec42: SwiftCluster, monkeypatch):
    """During the audit one device's target stops (for real, as its MD5s are asked for),
    one fragment archive's read fails with EIO on a device that stays up, and a third
    device's XFS has shut down though its target answers: the first and the third are
    reported unreachable, the archive unreadable, everything else is audited (exit 4)."""
    from insitu import _native
    from insitu.swift import scrub as swift_scrub

    c = ec42
    by_device = {_device_of(c, f): f for f in c.fragments("s", "blob")}
    leaving, failing, broken = sorted(by_device)[1], sorted(by_device)[2], sorted(by_device)[3]
    eio = by_device[failing]
    total = sum(_data_files(c, d) for d in c.devices)
    on_leaving = _data_files(c, leaving)
    on_broken = _data_files(c, broken)
    real_md5 = swift_scrub._md5
    stopped: List[str] = []

    def md5(paths: List[Path], conventional: bool) -> dict:
        if eio in paths:
            raise _native.InsituError(f"{eio}: Input/output error (os error 5)")
        if paths and _device_of(c, paths[0]) == leaving and not stopped:
            _stop_targets(c, [leaving])
            stopped.append(leaving)
        return real_md5(paths, conventional)

    monkeypatch.setattr(swift_scrub, "_md5", md5)
    try:
        _shut_down_xfs(c, broken)
        r = swift_scrub.scrub(c.dir, None)
    finally:
        monkeypatch.undo()
        _restore(c)
    assert stopped == [leaving]
    unreachable = {u["device"]: u["error"] for u in r["unreachable"]}
    assert sorted(unreachable) == sorted([leaving, broken])
    assert "does not answer" in unreachable[leaving] and "during the scrub" in unreachable[leaving]
    assert "file system cannot be read: Input/output error" in unreachable[broken]
    assert [(u["path"], u["device"]) for u in r["unreadable"]] == [(str(eio), failing)]
    assert "Input/output error" in r["unreadable"][0]["error"]
    assert r["corrupt"] == []
    assert r["files"] == total - on_leaving - on_broken - 1
    assert swift_scrub.exit_status(r) == swift_scrub.EXIT_INCOMPLETE == 4


def test_wc_and_grep_stay_exact_with_two_of_six_targets_stopped(ec42: SwiftCluster):
    """The targets of data fragments 0 and 1 stopped (M = 2 of six): wc and grep on every
    object equal wc and grep -n -b on its bytes, the missing pieces rebuilt on the host; a
    scrub meanwhile lists both devices as unreachable."""
    c = ec42
    index = {int(re.search(r"#(\d+)#", f.name).group(1)): _device_of(c, f) for f in c.fragments("s", "text")}
    down = sorted([index[0], index[1]])
    try:
        _stop_targets(c, down)
        for name, data in DEGRADED_OBJECTS.items():
            obj = f"swift://AUTH_test/s/{name}"
            p = _insitu("wc", obj, "--swift-dir", c.dir, "--json")
            assert p.returncode == 0, p.stderr
            wc = json.loads(p.stdout)
            assert {k: wc["results"][0][k] for k in ("lines", "words", "bytes")} == _system_wc(data), name
            assert sorted(wc["stats"]["devices_down"]) == down
            if name == "text":
                assert wc["stats"]["fragments_rebuilt"] == [0, 1]
            for pattern, flags in DEGRADED_GREPS:
                p = _insitu("grep", pattern, obj, "--swift-dir", c.dir, "--json", *flags)
                assert p.returncode == 0, p.stderr
                g = json.loads(p.stdout)["results"][0]
                assert (g["count"], g["matches"]) == _system_grep(pattern, flags, data), (name, pattern, flags)
        p = _scrub(c, "--json")
        assert p.returncode == 4, p.stderr
        assert [u["device"] for u in json.loads(p.stdout)["unreachable"]] == down
    finally:
        _restore(c)
    wc = json.loads(_insitu("wc", "swift://AUTH_test/s/text", "--swift-dir", c.dir, "--json").stdout)
    assert wc["stats"]["devices_down"] == [] and wc["stats"]["fragments_rebuilt"] == []


def test_down_leaves_nothing_and_up_brings_the_objects_back(swift_cluster: SwiftCluster):
    """Last in the module: takes the shared cluster down and up again."""
    c = swift_cluster
    url, token = c.login()
    client.put_container(url, token, "keep")
    data = os.urandom(100_000)
    client.put_object(url, token, "keep", "o", data)
    pids = _pids_of(c)
    assert all(_alive(p) for p in pids)

    down = swift_cli("down", c.dir)
    assert down.returncode == 0, down.stderr
    assert _mounts_under(c.dir) == []
    assert [p for p in pids if _alive(p)] == []
    status = swift_cli("status", c.dir, "--json")
    assert status.returncode == 1 and json.loads(status.stdout)["state"] == "down"
    again = swift_cli("down", c.dir)  # idempotent
    assert again.returncode == 0, again.stderr
    assert (c.dir / "images" / "d0.img").exists()
    assert "holds a 2+1 cluster" in _error("up", c.dir, "--ec", "4+2")

    doc = swift_json("up", c.dir)  # no --ec: the cluster in DIR is brought back
    c.doc = doc
    url, token = c.login()
    assert client.get_object(url, token, "keep", "o") == data
    assert len(c.fragments("keep", "o")) == 3

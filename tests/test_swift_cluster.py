# SPDX-License-Identifier: Apache-2.0
"""`insitu swift up|down|status|once`: a real Swift 2.30 cluster (erasure-coded policy
2+1) whose devices are XFS file systems on embedded insitu targets.

An object PUT through the proxy comes back byte for byte; its K+M fragment archives lie
one per device as ``#FRAG#d.data``; a corrupted fragment is quarantined by the auditor and
rebuilt by the reconstructor; `down` leaves nothing mounted or running and `up` again
brings the same objects back; an `up` that fails midway undoes itself; bad input fails
with exit 2 and a message.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from swift_fixture import SwiftCluster, swift_cli, swift_cluster, swift_json, swift_missing  # noqa: E402,F401

from insitu.swift import client  # noqa: E402

SWIFT_EC = "2+1"
SWIFT_SEGMENT_SIZE = "256K"


def _mounts_under(d: Path) -> List[str]:
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(f"{d}/")]


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
    for name in ("swift.conf", "account.ring.gz", "container.ring.gz", "object.ring.gz", "object-1.ring.gz",
                 "proxy-server.conf", "object-server.conf"):
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


@pytest.mark.parametrize("ec, why", [("4+", "K+M"), ("0+2", "at least 1"), ("2+0", "at least 1"), ("x", "K+M"),
                                     ("20+20", "at most 32")])
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
    from insitu.swift import cluster

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
        assert cluster.main(["up", str(d), "--ec", "2+1", "--json"]) == 2
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

# SPDX-License-Identifier: Apache-2.0
"""End to end over NVMe/TCP on loopback: a target daemon on an image, `insitu attach` with
ext4, files written through the mount, and `insitu exec`/`grep`/`wc`/`scrub` sending EXEC
across the fabric. Results are compared with the standard tools; the wire bytes of an
offloaded crc32c over 1 GiB must stay under 1 MiB.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import crc32c
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import C_ENV, cli_json, free_port, run_cli  # noqa: E402

NQN = "nqn.2024-01.io.insitu:attach-test"


@pytest.fixture(scope="module")
def remote(start_target):
    """A target serving a 1.5 GiB sparse image, attached with a fresh ext4 at a mount point."""
    target = start_target(NQN, 1536 << 20)
    mnt = target.dir / "mnt"
    try:
        att = cli_json("attach", f"{target.url}/1", mnt, "--format", "ext4", timeout=120)
        assert Path(att["dir"]) == mnt.resolve()
        yield mnt
    finally:
        run_cli("detach", mnt)


def write_text(path: Path, lines: int) -> None:
    with open(path, "w") as f:
        for i in range(lines):
            level = "ERROR" if i % 17 == 0 else "INFO"
            f.write(f"{i:08d} {level} request id={i * 7919 % 100003} took {i % 250}ms\n")
        f.write("trailing line without newline")
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def test_attached_mount_is_a_real_file_system(remote: Path):
    out = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", str(remote)], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "ext4" and out[1].startswith("/dev/loop")
    listed = cli_json("target", "status")["targets"]
    assert any(t["nqn"] == NQN and t["running"] for t in listed)


def test_exec_over_the_fabric_matches_standard_tools(remote: Path):
    d = remote / "text"
    d.mkdir(exist_ok=True)
    files = [d / f"log-{i}.txt" for i in range(3)]
    for i, p in enumerate(files):
        write_text(p, 20000 + 3001 * i)
    r = cli_json("exec", "sha256", *files)
    assert r["mode"] == "offload" and r["stats"]["commands"] == 3
    for res, p in zip(r["results"], files):
        assert res["value"] == hashlib.sha256(p.read_bytes()).hexdigest()
    g = cli_json("grep", "-E", "ERROR request id=[0-9]*7 ", *files)
    for res, p in zip(g["results"], files):
        want = subprocess.run(["grep", "-c", "-E", "ERROR request id=[0-9]*7 ", str(p)], capture_output=True, text=True, env=C_ENV).stdout.strip()
        assert res["count"] == int(want)
        lines = subprocess.run(["grep", "-n", "-b", "-E", "ERROR request id=[0-9]*7 ", str(p)], capture_output=True, text=True, env=C_ENV).stdout.splitlines()
        assert res["matches"] == [[int(x.split(":")[0]), int(x.split(":")[1])] for x in lines]
    w = cli_json("wc", *files)
    for res, p in zip(w["results"], files):
        want = subprocess.run(["wc", str(p)], capture_output=True, text=True, env=C_ENV).stdout.split()
        assert [res["lines"], res["words"], res["bytes"]] == [int(x) for x in want[:3]]


def test_offloaded_crc32c_over_1gib_keeps_the_wire_quiet(remote: Path):
    big = remote / "big.bin"
    crc = 0
    block = bytearray(os.urandom(1 << 20))
    with open(big, "wb") as f:
        for i in range(1024):
            block[:8] = i.to_bytes(8, "little")  # every MiB differs
            f.write(block)
            crc = crc32c.crc32c(bytes(block), crc)
        f.flush()
        os.fsync(f.fileno())
    r = cli_json("exec", "crc32c", big, timeout=600)
    assert r["results"][0]["value"] == f"{crc:08x}"
    s = r["stats"]
    assert s["media_bytes"] >= 1 << 30
    assert s["bytes_to_host"] + s["bytes_from_host"] < 1 << 20, s
    big.unlink()


def test_outputs_and_scrub_over_the_fabric(remote: Path, tmp_path: Path):
    d = remote / "scrub"
    d.mkdir(exist_ok=True)
    for i in range(4):
        write_text(d / f"f{i}.txt", 3000 + i)
    sorted_out = cli_json("exec", "sort", d / "f0.txt", "--output", remote / "f0.sorted", "--force")
    want = subprocess.run(["sort", str(d / "f0.txt")], capture_output=True, env=C_ENV, check=True).stdout
    assert (remote / "f0.sorted").read_bytes() == want
    assert sorted_out["results"][0]["output_length"] == len(want)
    manifest = tmp_path / "m.json"
    cli_json("scrub", d, "--manifest", manifest, "--create")
    clean = cli_json("scrub", d, "--manifest", manifest)
    assert clean["checked"] == 4 and not clean["corrupted"] and not clean["missing"]
    (d / "f2.txt").unlink()
    with open(d / "f1.txt", "r+b") as f:
        f.write(b"X")
        os.fsync(f.fileno())
    dirty = run_cli("scrub", d, "--manifest", manifest)
    assert dirty.rc == 1
    assert dirty.doc["corrupted"] == ["f1.txt"] and dirty.doc["missing"] == ["f2.txt"]


def test_bad_urls_and_unreachable_targets_fail_clearly(tmp_path: Path):
    r = run_cli("attach", "http://example/nqn.x", tmp_path / "m")
    assert r.rc == 2 and "nvme-tcp://" in r.stderr
    r = run_cli("attach", f"nvme-tcp://127.0.0.1:{free_port()}/{NQN}", tmp_path / "m")
    assert r.rc == 2 and "127.0.0.1" in r.stderr

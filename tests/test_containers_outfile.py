# SPDX-License-Identifier: Apache-2.0
"""Containers write results into files the host pre-allocated on the sharable namespace
(`docker run -v /FILE:/DST:rw`, docs/containers.md), driven by the stock docker CLI.

A target daemon on loopback serves a sharable namespace that the host attaches with
`insitu attach` and formats ext4, and a private one for images and containers; Debian's
docker-registry on loopback holds a busybox image built offline. The host writes a data
set and pre-allocates output files (zeros from dd, synced); containers compute over the
data set and write into the output files in place; the host reads the results back and
compares them with its own computation. Files that cannot be written in place (sparse,
fallocated, empty, directories, links out of the namespace) are refused with a clear
error, writes past the end fail, and the file system stays clean for e2fsck.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import ROOT, cli_json, run_cli
from test_containers import Env, busybox_registry, docker_target, need

NQN = "nqn.2024-01.io.insitu:outfile"
LINES = 40_000


@pytest.fixture(scope="module")
def env():
    if os.geteuid() != 0:
        pytest.skip("containers need root (runc, overlayfs, loop devices, FUSE)")
    need("docker", "runc", "docker-registry", "skopeo", "umoci", "e2fsck")
    d = Path(tempfile.mkdtemp(prefix="insitu-outfile-", dir="/var/tmp"))
    mnt = d / "mnt"
    stack = contextlib.ExitStack()
    try:
        reg, image = stack.enter_context(busybox_registry(d))
        ns = d / "ns.img"
        with open(ns, "wb") as f:
            f.truncate(256 << 20)
        listen, api = stack.enter_context(docker_target(d, NQN, ns))
        cli_json("attach", f"nvme-tcp://{listen}/{NQN}/1", mnt, "--format", "ext4", timeout=120)
        with open(mnt / "lines.txt", "w") as f:
            for i in range(LINES):
                f.write(f"record {i} {'y' * (i % 23)}\n")
        (mnt / "results").mkdir()
        os.sync()
        e = Env(d, api, reg, image, mnt, listen)
        e.ok("pull", image)
        e.ns = ns
        yield e
    finally:
        for h in json.loads(run_cli("lock", "--list").stdout or '{"locks": []}').get("locks", []):
            if str(h["path"]).startswith(str(mnt)):
                run_cli("unlock", h["path"])
        if mnt.exists():
            run_cli("detach", mnt)
        stack.close()
        shutil.rmtree(d, ignore_errors=True)


def preallocate(path: Path, size: int, byte: int = 0) -> None:
    """What the docs tell a host to do: write every byte (here with dd), then sync."""
    if byte == 0:
        subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=4096", f"count={size // 4096}", "conv=fsync", "status=none"], check=True)
    else:
        path.write_bytes(bytes([byte]) * size)
    os.sync()


def drop_cache(path: Path) -> None:
    """A host that did not lock the file drops its cached pages before reading results."""
    subprocess.run(["dd", f"if={path}", "iflag=nocache", "count=0", "status=none"], check=True)


def session():
    sys_path = str(ROOT / "python")
    if sys_path not in sys.path:
        sys.path.insert(0, sys_path)
    import insitu  # the binding built by `make build`

    return insitu


def test_a_container_writes_results_the_host_reads_back(env):
    """The paper's flow: the host pre-allocates and locks the output file, the container
    computes next to the data and writes into it, the host unlocks and reads the result."""
    out = env.data_mnt / "results" / "summary.txt"
    preallocate(out, 16384)
    before = out.stat()
    cli_json("lock", out)
    script = "{ wc -l < /data/lines.txt; sha256sum < /data/lines.txt; grep -c 'y\\{22\\}' /data/lines.txt; } > /out/summary"
    env.ok("run", "--rm", "-v", "/results/summary.txt:/out/summary:rw", env.image, "sh", "-c", script)
    cli_json("unlock", out)
    data = (env.data_mnt / "lines.txt").read_bytes()
    want = f"{LINES}\n{hashlib.sha256(data).hexdigest()}  -\n{sum(1 for l in data.splitlines() if l.endswith(b'y' * 22))}\n".encode()
    got = out.read_bytes()
    # Byte for byte: the result, then zeros to the pre-allocated size (`>` zeroes the rest).
    assert got == want + bytes(16384 - len(want))
    after = out.stat()
    # The host's metadata is untouched: same inode, size and modification time.
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    # A later container sees the results on its read-only /data.
    assert env.ok("run", "--rm", env.image, "head", "-n", "1", "/data/results/summary.txt").strip() == str(LINES)


def test_dd_fills_a_file_and_a_write_past_its_end_fails(env):
    size = 1 << 19
    out = env.data_mnt / "results" / "copy.bin"
    preallocate(out, size, 0x5A)
    env.ok(
        "run",
        "--rm",
        "-v",
        "/results/copy.bin:/out.bin:rw",
        env.image,
        "dd",
        "if=/data/lines.txt",
        "of=/out.bin",
        "bs=64k",
        f"count={size // 65536}",
        "conv=notrunc",
    )
    drop_cache(out)
    data = (env.data_mnt / "lines.txt").read_bytes()
    assert len(data) > size
    assert out.read_bytes() == data[:size]
    # Past the pre-allocated size: EFBIG, and nothing changes.
    r = env.docker(
        "run",
        "--rm",
        "-v",
        "/results/copy.bin:/out.bin:rw",
        env.image,
        "dd",
        "if=/dev/zero",
        "of=/out.bin",
        "bs=4096",
        "count=1",
        f"seek={size // 4096}",
        "conv=notrunc",
    )
    assert r.returncode != 0 and "File too large" in r.stdout + r.stderr, r
    r = env.docker("run", "--rm", "-v", "/results/copy.bin:/out.bin:rw", env.image, "sh", "-c", "echo more >> /out.bin")
    assert r.returncode != 0 and "File too large" in r.stdout + r.stderr, r
    drop_cache(out)
    assert out.stat().st_size == size and out.read_bytes() == data[:size]


def test_a_held_file_is_fenced_against_the_host_and_other_writers(env):
    """While a container holds the file, the target refuses host writes into its blocks
    (the LOCK command's fence) and a second container asking to write it; on exit both
    are free again."""
    out = env.data_mnt / "results" / "held.bin"
    preallocate(out, 8192)
    lba = physical_of(out) // 512
    insitu = session()
    s = insitu.Session(f"nvme-tcp://{env.target_listen}/{NQN}")
    env.ok("run", "-d", "--name", "holder", "-v", "/results/held.bin:/o:rw", env.image, "sh", "-c", "echo held > /o; sleep 60")
    try:
        deadline = time.time() + 20
        while not env.ok("ps", "-q", "--filter", "name=holder").strip() and time.time() < deadline:
            time.sleep(0.2)
        with pytest.raises(Exception) as e:
            s.write(1, lba, b"X" * 512)
        assert "locked" in str(e.value).lower() or "0xc6" in str(e.value).lower()
        r = env.docker("run", "--rm", "-v", "/results/held.bin:/o:rw", env.image, "true")
        assert r.returncode != 0 and "another running container" in r.stderr, r.stderr
        # Reading it is fine.
        assert env.ok("run", "--rm", env.image, "head", "-c", "5", "/data/results/held.bin") in ("held\n", "\0" * 5)
    finally:
        env.ok("rm", "-f", "holder")
    # Released with the container: the host may write the blocks again.
    s.write(1, lba, s.read(1, lba, 1))
    drop_cache(out)
    assert out.read_bytes() == b"held\n" + bytes(8192 - 5)


def physical_of(path: Path) -> int:
    import fcntl
    import struct

    with open(path, "rb") as fh:
        buf = bytearray(struct.pack("=QQLLLL", 0, 1 << 30, 0, 0, 1, 0) + bytes(56))
        fcntl.ioctl(fh.fileno(), 0xC020660B, buf)
        return struct.unpack_from("=QQQ", buf, 32)[1]


def test_files_that_cannot_be_written_in_place_are_refused(env):
    res = env.data_mnt / "results"
    with open(res / "sparse.bin", "wb") as f:
        f.truncate(1 << 20)
    subprocess.run(["fallocate", "-l", "1M", str(res / "fallocated.bin")], check=True)
    (res / "empty.bin").touch()
    (res / "escape").symlink_to("/etc/hostname")
    half = res / "half.bin"
    with open(half, "wb") as f:
        f.write(b"\1" * 4096)
        f.seek(1 << 20)
        f.write(b"\1" * 4096)
    os.sync()
    before = set(env.ok("ps", "-aq", "--no-trunc").split())
    cases = {
        "/results/sparse.bin": "no blocks",
        "/results/half.bin": "bytes 4096..1048576 have no blocks",
        "/results/fallocated.bin": "unwritten",
        "/results/empty.bin": "empty",
        "/results": "a directory",
        "/results/escape": "outside the sharable namespace",
        "/results/missing.bin": "No such file",
    }
    for src, why in cases.items():
        r = env.docker("run", "--rm", "-v", f"{src}:/out:rw", env.image, "true")
        assert r.returncode != 0 and why in r.stderr and src in r.stderr, (src, r.stderr)
    # The API answers 400 (a bad request), and no container was made.
    body = json.dumps({"Image": env.image, "Cmd": ["true"], "HostConfig": {"Binds": ["/results/sparse.bin:/out:rw"]}}).encode()
    status, text = env.request("POST", "/containers/create", body, {"Content-Type": "application/json"})
    assert status == 400 and b"no blocks" in text
    assert set(env.ok("ps", "-aq", "--no-trunc").split()) == before
    # The refused files are as the host left them.
    assert (res / "sparse.bin").stat().st_blocks == 0 and (res / "empty.bin").stat().st_size == 0


def test_the_file_system_stays_clean(env):
    """Last: after all of the above the host detaches, and e2fsck finds nothing to fix."""
    r = run_cli("detach", env.data_mnt)
    assert r.rc == 0, r.stderr
    fsck = subprocess.run(["e2fsck", "-fn", str(env.ns)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr

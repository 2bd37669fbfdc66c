# SPDX-License-Identifier: Apache-2.0
"""Host/container locks (DockerSSD's inode lock, `docs/lock-commands.md`) end to end: a
target daemon on loopback, its namespace attached with `insitu attach` and ext4, and
`insitu lock`/`unlock` on files and directories of the mount.

While a path is locked the host cannot modify it: writers through the mount get EROFS at
once, and a block-level write through the fabric into its extents is refused by the target
with the lock status (SCT 7, SC 0xC6). After `insitu unlock` both work again. A target
restart drops every lock.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import insitu  # noqa: E402
from helpers import cli_json, fiemap, run_cli  # noqa: E402

NQN = "nqn.2024-01.io.insitu:lock-test"


@pytest.fixture(scope="module")
def remote(start_target):
    """(target daemon, mount point): a 256 MiB namespace attached with a fresh ext4."""
    target = start_target(NQN, 256 << 20)
    mnt = target.dir / "mnt"
    try:
        cli_json("attach", f"{target.url}/1", mnt, "--format", "ext4", timeout=120)
        yield target, mnt.resolve()
    finally:
        for h in cli_json("lock", "--list")["locks"]:
            if str(h["path"]).startswith(str(mnt.resolve())):
                run_cli("unlock", h["path"])
        run_cli("detach", mnt)


def write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def first_block(path: Path) -> int:
    """The namespace LBA (512 bytes) of the file's first block."""
    ext = [e for e in fiemap(path) if e.length]
    assert ext, f"{path} has no blocks"
    return ext[0].physical // 512


def error_of(argv) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True)


def test_a_locked_file_cannot_be_modified_by_the_host(remote):
    target, mnt = remote
    f = mnt / "shared.txt"
    write_synced(f, "v1\n")
    lba = first_block(f)
    doc = cli_json("lock", f)
    assert doc["lock_id"] > 0 and doc["extents"] >= 1 and doc["path"] == str(f) and doc["relative"] == "shared.txt"
    listed = cli_json("lock", "--list")["locks"]
    assert [h["lock_id"] for h in listed if h["path"] == str(f)] == [doc["lock_id"]]

    # Through the mount: EROFS at open, from Python and from the shell.
    with pytest.raises(OSError) as e:
        with open(f, "a") as w:
            w.write("host write\n")
    assert e.value.errno == errno.EROFS
    sh = error_of(["sh", "-c", f"echo more >> '{f}'"])
    assert sh.returncode != 0 and "Read-only file system" in sh.stderr
    assert error_of(["truncate", "-s", "0", str(f)]).returncode != 0
    assert f.read_text() == "v1\n"

    # Below the file system: the target refuses a write into the file's blocks...
    s = insitu.Session(target.url)
    before = s.read(1, lba, 8)
    with pytest.raises(insitu.TargetError) as e:
        s.write(1, lba, b"X" * 4096)
    assert "sc 0xc6" in str(e.value).lower(), str(e.value)
    assert s.read(1, lba, 8) == before
    # ...and accepts writes elsewhere (the last block of the namespace, outside the file system's data).
    last = (256 << 20) // 512 - 1
    s.write(1, last, s.read(1, last, 1))

    # A second lock on the same path, or on a directory above it, is refused.
    r = run_cli("lock", f)
    assert r.rc != 0 and "already locked" in r.stderr
    r = run_cli("lock", mnt)
    assert r.rc != 0 and "already locked" in r.stderr

    u = cli_json("unlock", f)
    assert u["unlocked"] == str(f) and u["target_held"] is True
    with open(f, "a") as w:
        w.write("v2\n")
    assert f.read_text() == "v1\nv2\n"
    s.write(1, lba, s.read(1, lba, 8))  # the fence is gone
    assert not [h for h in cli_json("lock", "--list")["locks"] if h["path"] == str(f)]
    r = run_cli("unlock", f)
    assert r.rc != 0 and "not locked" in r.stderr


def test_a_directory_lock_covers_everything_under_it(remote):
    target, mnt = remote
    d = mnt / "dataset"
    (d / "sub").mkdir(parents=True)
    files = [d / "a.csv", d / "sub" / "b.csv"]
    for i, p in enumerate(files):
        write_synced(p, f"row,{i}\n" * 2000)
    doc = cli_json("lock", d)
    assert doc["extents"] >= 2
    for p in files:
        with pytest.raises(OSError) as e:
            open(p, "a").close()
        assert e.value.errno == errno.EROFS
    with pytest.raises(OSError) as e:
        (d / "new.txt").write_text("x")
    assert e.value.errno == errno.EROFS
    assert sorted(x.name for x in d.iterdir()) == ["a.csv", "sub"]
    s = insitu.Session(target.url)
    with pytest.raises(insitu.TargetError):
        s.write(1, first_block(files[1]), b"\0" * 512)
    # Reads are never fenced.
    assert files[1].read_text() == "row,1\n" * 2000
    cli_json("unlock", d)
    (d / "new.txt").write_text("x")


def test_a_lock_is_refused_while_a_host_process_writes(remote):
    _, mnt = remote
    f = mnt / "busy.txt"
    write_synced(f, "busy\n")
    with open(f, "a"):
        r = run_cli("lock", f)
        assert r.rc != 0 and "open for writing" in r.stderr, r.stderr
    assert not [h for h in cli_json("lock", "--list")["locks"] if h["path"] == str(f)]
    with open(f, "r"):  # readers do not block a lock
        cli_json("lock", f)
    cli_json("unlock", f)


def test_paths_outside_attached_file_systems_are_refused(tmp_path):
    r = run_cli("lock", tmp_path)
    assert r.rc != 0 and "insitu attach" in r.stderr
    r = run_cli("unlock", tmp_path / "nothing")
    assert r.rc != 0 and "not locked" in r.stderr


def test_python_api(remote):
    _, mnt = remote
    if not hasattr(insitu, "lock"):
        pytest.skip("the insitu binding predates locks; rebuild it with `make build`")
    f = mnt / "py.txt"
    write_synced(f, "py\n")
    with insitu.lock(f) as lk:
        assert lk.held and lk.id > 0 and Path(lk.path) == f
        assert [h["lock_id"] for h in insitu.locks() if h["path"] == str(f)] == [lk.id]
        with pytest.raises(OSError):
            open(f, "w").close()
    assert not lk.held
    f.write_text("py2\n")
    lk = insitu.lock(f)
    assert insitu.unlock(f)["target_held"] is True
    with pytest.raises(insitu.RequestError):
        insitu.unlock(f)


def test_a_target_restart_drops_locks(remote):
    target, mnt = remote
    f = mnt / "restart.txt"
    write_synced(f, "before restart\n")
    lba = first_block(f)
    cli_json("lock", f)
    run_cli("target", "stop", "--listen", target.listen)
    cli_json("target", "start", "--listen", target.listen, "--nqn", target.nqn, "--namespace", target.image, timeout=120)
    # The new target holds no lock: a block write into the file is accepted again.
    s = insitu.Session(target.url)
    s.write(1, lba, s.read(1, lba, 8))
    # The host side is still read-only until released; unlock says the target had none.
    with pytest.raises(OSError):
        open(f, "a").close()
    u = cli_json("unlock", f)
    assert u["target_held"] is False and "no longer held" in u["note"] and u["lock"]["path"] == str(f)
    write_synced(f, "after restart\n")
    assert f.read_text() == "after restart\n"

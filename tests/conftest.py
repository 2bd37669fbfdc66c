# SPDX-License-Identifier: Apache-2.0
"""Fixtures: real file-system images, made with `insitu image create` in a temporary
directory under /var/tmp and loop-mounted with `insitu image mount`, for the whole session.

* `ext4_fs`: ext4 with the default 4 KiB blocks;
* `ext4_1k_fs`: ext4 made with `--block-size 1024` (1 KiB blocks on the 512-byte-sector
  loop device, so extents are not 4 KiB aligned);
* `xfs_fs`: xfs;
* `any_fs`: parametrized over the three.

And NVMe/TCP target daemons: `start_target` starts `insitu target start` on 127.0.0.1 with
a free port over a new sparse namespace image, for the module.

Everything is unmounted, stopped and removed at the end, also when tests fail.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import INSITU, cli_json, free_port, run_cli  # noqa: E402

FILESYSTEMS = {
    # name: (fs, size, block size)
    "ext4": ("ext4", "2G", None),
    "ext4-1k": ("ext4", "768M", 1024),
    "xfs": ("xfs", "768M", None),
}


@dataclasses.dataclass
class MountedFs:
    name: str
    fs: str
    image: Path
    mnt: Path
    block_size: int

    _counter = itertools.count()

    def mkdir(self, tag: str) -> Path:
        """A fresh directory on this file system."""
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", tag)[:60]
        d = self.mnt / f"{next(MountedFs._counter):03d}-{safe}"
        d.mkdir()
        return d


def _require_environment() -> None:
    if os.geteuid() != 0:
        pytest.skip("the integration tests need root (loop devices and mount)")
    if not Path(INSITU).exists():
        pytest.skip(f"{INSITU} not found: run `make build` first")


@pytest.fixture(scope="session")
def workdir():
    """A temporary directory under /var/tmp (a real block-device file system, where the
    sparse images live); every mount made under it is undone at the end."""
    _require_environment()
    d = Path(tempfile.mkdtemp(prefix="insitu-tests-", dir="/var/tmp"))
    try:
        yield d
    finally:
        _unmount_under(d)
        shutil.rmtree(d, ignore_errors=True)


def _mounts_under(d: Path) -> List[str]:
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            target = line.split()[1].replace("\\040", " ")
            if target == str(d) or target.startswith(str(d) + "/"):
                out.append(target)
    return out


def _unmount_under(d: Path) -> None:
    for target in sorted(_mounts_under(d), key=len, reverse=True):
        if run_cli("image", "umount", target).rc != 0:
            subprocess.run(["umount", "-l", target], capture_output=True)


_mounted: Dict[str, MountedFs] = {}


def _make_fs(workdir: Path, name: str) -> MountedFs:
    if name in _mounted:
        return _mounted[name]
    fs, size, bs = FILESYSTEMS[name]
    image = workdir / f"{name}.img"
    mnt = workdir / f"mnt-{name}"
    args = ["image", "create", image, "--size", size, "--fs", fs]
    if bs:
        args += ["--block-size", bs]
    doc = cli_json(*args)
    assert doc["ok"] is True
    assert image.stat().st_size == {"2G": 2 << 30, "768M": 768 << 20}[size]
    assert image.stat().st_blocks * 512 < image.stat().st_size, "the image should be sparse"
    cli_json("image", "mount", image, mnt)
    assert str(mnt) in _mounts_under(workdir)
    m = MountedFs(name, fs, image, mnt, os.statvfs(mnt).f_bsize)
    if bs:
        assert m.block_size == bs
    _mounted[name] = m
    return m


@pytest.fixture(scope="session")
def ext4_fs(workdir) -> MountedFs:
    return _make_fs(workdir, "ext4")


@pytest.fixture(scope="session")
def ext4_1k_fs(workdir) -> MountedFs:
    return _make_fs(workdir, "ext4-1k")


@pytest.fixture(scope="session")
def xfs_fs(workdir) -> MountedFs:
    return _make_fs(workdir, "xfs")


@pytest.fixture(scope="session", params=list(FILESYSTEMS))
def any_fs(request, workdir) -> MountedFs:
    return _make_fs(workdir, request.param)


@pytest.fixture
def tdir(any_fs, request) -> Path:
    """A fresh directory for one test on the parametrized file system."""
    return any_fs.mkdir(request.node.name)


@pytest.fixture(scope="session")
def rootfs_dir(workdir) -> Path:
    """A directory on the root file system (a real disk, not a loop device)."""
    d = workdir / "on-root-fs"
    d.mkdir(exist_ok=True)
    return d


@dataclasses.dataclass
class TargetDaemon:
    """An `insitu target start` daemon on loopback serving one sparse image."""

    listen: str
    nqn: str
    image: Path
    dir: Path
    doc: dict  # the `target start --json` document

    @property
    def url(self) -> str:
        """nvme-tcp://HOST:PORT/NQN (namespace 1 when used as is)."""
        return f"nvme-tcp://{self.listen}/{self.nqn}"


@pytest.fixture(scope="module")
def start_target() -> Callable[..., TargetDaemon]:
    """A function that starts a target daemon and returns its `TargetDaemon`:
    `start_target(nqn, size, private=False, extra=())` makes a sparse image of `size` bytes
    in a new directory under /var/tmp and serves it as namespace 1 (and, with `private`,
    also as a private namespace) on 127.0.0.1 at a free port, with `extra` arguments. Every daemon started is stopped and its
    directory removed at the end of the module, also when tests fail."""
    started: List[TargetDaemon] = []

    def start(nqn: str, size: int, private: bool = False, extra: Sequence[str] = ()) -> TargetDaemon:
        d = Path(tempfile.mkdtemp(prefix="insitu-target-", dir="/var/tmp"))
        image = d / "ns.img"
        with open(image, "wb") as f:
            f.truncate(size)
        listen = f"127.0.0.1:{free_port()}"
        args = ["target", "start", "--listen", listen, "--nqn", nqn, "--namespace", image]
        if private:
            args += ["--private", image]
        args += list(extra)
        t = TargetDaemon(listen, nqn, image, d, {})
        started.append(t)
        t.doc = cli_json(*args)
        return t

    try:
        yield start
    finally:
        for t in reversed(started):
            run_cli("target", "stop", "--listen", t.listen)
            shutil.rmtree(t.dir, ignore_errors=True)

# SPDX-License-Identifier: Apache-2.0
"""A Swift cluster on insitu targets for a test module: the `swift_cluster` fixture.

Use it from a test module with

    from swift_fixture import swift_cluster  # noqa: F401  (the fixture)

    SWIFT_EC = "4+2"                # optional: K+M of the EC policy (default 2+1)
    SWIFT_SEGMENT_SIZE = "256K"     # optional: ec_object_segment_size (default 1M)

    def test_something(swift_cluster):
        url, token = swift_cluster.login()
        ...

It runs ``insitu swift up DIR --ec K+M --json`` with embedded targets in a new directory
under /var/tmp once per module and ``insitu swift down DIR`` at the end (also when tests
fail), then removes the directory. Tests are skipped, saying why, without root, without
the built ``insitu`` or without Swift, memcached or PyECLib in the system Python.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSITU = os.environ.get("INSITU_BIN") or str(ROOT / ".venv" / "bin" / "insitu")
SYSTEM_PYTHON = "/usr/bin/python3"


def swift_cli(*args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``insitu swift ARGS`` (as ``python -m insitu.swift``, the same code) and
    returns the finished process, output as text."""
    argv = [sys.executable, "-m", "insitu.swift", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def swift_json(*args: object, timeout: float = 300) -> dict:
    """Runs ``insitu swift ARGS --json``, asserts exit 0, returns the document."""
    p = swift_cli(*args, "--json", timeout=timeout)
    assert p.returncode == 0, f"insitu swift {' '.join(map(str, args))} exited {p.returncode}: {p.stderr[-3000:]}"
    return json.loads(p.stdout)


def swift_missing() -> Optional[str]:
    """Why a Swift cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "the Swift cluster needs root (mounts, loop devices, a mount namespace)"
    if not Path(INSITU).exists():
        return f"{INSITU} not found: run `make build` first"
    for prog in (
        "/usr/bin/swift-proxy-server",
        "/usr/bin/swift-object-server",
        "/usr/bin/swift-account-server",
        "/usr/bin/swift-container-server",
        "/usr/bin/memcached",
        SYSTEM_PYTHON,
    ):
        if not os.access(prog, os.X_OK):
            return f"{prog} is missing: install Debian's swift, swift-proxy, swift-account, swift-container, swift-object and memcached"
    p = subprocess.run([SYSTEM_PYTHON, "-I", "-c", "import pyeclib.ec_iface, swift"], capture_output=True, text=True)
    if p.returncode != 0:
        return f"Swift or PyECLib does not import in {SYSTEM_PYTHON}: install python3-swift and python3-pyeclib"
    if not shutil.which("mkfs.xfs"):
        return "mkfs.xfs is missing: install xfsprogs"
    return None


@dataclasses.dataclass
class SwiftCluster:
    """A running cluster: `doc` is the ``insitu swift up --json`` document."""

    dir: Path
    doc: dict

    @property
    def proxy(self) -> str:
        return self.doc["proxy"]

    @property
    def auth(self) -> str:
        return self.doc["auth"]

    @property
    def user(self) -> str:
        return self.doc["user"]

    @property
    def key(self) -> str:
        return self.doc["key"]

    @property
    def devices(self) -> Dict[str, dict]:
        """Device name -> {"mount": path, "target": url}."""
        return self.doc["devices"]

    @property
    def k(self) -> int:
        return self.doc["policy"]["k"]

    @property
    def m(self) -> int:
        return self.doc["policy"]["m"]

    def login(self) -> Tuple[str, str]:
        """(storage URL, token) from tempauth."""
        from insitu.swift import client

        return client.auth(self.auth, self.user, self.key)

    def state(self) -> dict:
        """DIR/swift.json: the public document plus the private part."""
        return json.loads((self.dir / "swift.json").read_text())

    def object_hash(self, container: str, obj: str, account: Optional[str] = None) -> str:
        """Swift's hash of /account/container/object with this cluster's secrets (the
        name of the directory that holds the object's fragment archives)."""
        conf = (self.dir / "swift.conf").read_text()
        prefix = re.search(r"^swift_hash_path_prefix\s*=\s*(\S+)", conf, re.M).group(1)
        suffix = re.search(r"^swift_hash_path_suffix\s*=\s*(\S+)", conf, re.M).group(1)
        account = account or self.doc["storage_url"].rstrip("/").rsplit("/", 1)[1]
        return hashlib.md5(f"{prefix}/{account}/{container}/{obj}{suffix}".encode()).hexdigest()

    def fragments(self, container: str, obj: str) -> List[Path]:
        """The object's EC fragment archives on every device,
        ``DEV/objects-1/PART/SUFFIX/HASH/TIMESTAMP#FRAG#d.data``, sorted by path."""
        h = self.object_hash(container, obj)
        out: List[Path] = []
        for d in self.devices.values():
            out += map(Path, glob.glob(f"{d['mount']}/objects-{self.doc['policy']['index']}/*/{h[-3:]}/{h}/*.data"))
        return sorted(out)

    def once(self, daemon: str, *args: str) -> dict:
        """``insitu swift once DIR DAEMON --json``: one pass of an object daemon."""
        return swift_json("once", self.dir, daemon, *args)


def start_cluster(ec: str = "2+1", segment_size: str = "1M", extra: Tuple[str, ...] = ()) -> SwiftCluster:
    """Brings a new cluster up in a new directory under /var/tmp (skips when Swift cannot
    run here). Stop it with :func:`stop_cluster`."""
    why = swift_missing()
    if why:
        pytest.skip(why)
    d = Path(tempfile.mkdtemp(prefix="insitu-swift-", dir="/var/tmp"))
    try:
        doc = swift_json("up", d, "--ec", ec, "--segment-size", segment_size, *extra)
    except BaseException:
        # `up` undoes itself on failure; only the directory is left.
        shutil.rmtree(d, ignore_errors=True)
        raise
    return SwiftCluster(d, doc)


def stop_cluster(c: SwiftCluster) -> None:
    """``insitu swift down`` and removal of the cluster's directory."""
    p = swift_cli("down", c.dir)
    mounted = [line for line in Path("/proc/self/mounts").read_text().splitlines() if f" {c.dir}/" in line]
    if p.returncode == 0 and not mounted:
        shutil.rmtree(c.dir, ignore_errors=True)
    else:
        # Left for inspection rather than removed through a live mount.
        print(f"insitu swift down {c.dir} exited {p.returncode}: {p.stderr[-2000:]}; left {c.dir}", file=sys.stderr)


@pytest.fixture(scope="module")
def swift_cluster(request) -> SwiftCluster:
    """A Swift cluster for the module: policy "ec" with the module's ``SWIFT_EC`` (default
    2+1) and ``SWIFT_SEGMENT_SIZE`` (default 1M) over embedded targets."""
    ec = getattr(request.module, "SWIFT_EC", "2+1")
    segment = getattr(request.module, "SWIFT_SEGMENT_SIZE", "1M")
    c = start_cluster(ec, segment)
    try:
        yield c
    finally:
        stop_cluster(c)

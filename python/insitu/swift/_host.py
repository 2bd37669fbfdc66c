# SPDX-License-Identifier: Apache-2.0
"""Host plumbing of :mod:`insitu.swift.cluster`: running the ``insitu`` command, loopback
ports, processes (by pid, command line and mount namespace) and mounts, read from /proc.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence


class ClusterError(Exception):
    """A failure to report without a traceback: the message says what failed, on which
    object, and what to do; `code` is the exit status (2 errors, 1 problems found)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def progress(msg: str) -> None:
    """A progress line on stderr, for the slow steps."""
    print(f"insitu swift: {msg}", file=sys.stderr, flush=True)


def insitu_command() -> List[str]:
    """The ``insitu`` command: $INSITU_BIN, the one beside this interpreter, the one on
    PATH, or this interpreter running the package."""
    if os.environ.get("INSITU_BIN"):
        return [os.environ["INSITU_BIN"]]
    beside = Path(sys.executable).parent / "insitu"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("insitu")
    return [found] if found else [sys.executable, "-m", "insitu"]


def insitu(*args: object, timeout: float = 120) -> dict:
    """Runs ``insitu ARGS --json`` and returns its document; ClusterError with insitu's own
    message when it fails."""
    argv = [*insitu_command(), *map(str, args), "--json"]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`insitu {' '.join(map(str, args))}` did not finish in {timeout:.0f} s") from None
    doc: object = None
    try:
        doc = json.loads(p.stdout) if p.stdout.strip() else None
    except json.JSONDecodeError:
        pass
    if p.returncode != 0:
        msg = doc.get("error") if isinstance(doc, dict) else None
        raise ClusterError(msg or p.stderr.strip() or f"`insitu {' '.join(map(str, args))}` exited {p.returncode}")
    return doc if isinstance(doc, dict) else {}


def free_ports(n: int, avoid: Sequence[int] = ()) -> List[int]:
    """`n` distinct TCP ports on 127.0.0.1 that nothing listens on now."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            if s.getsockname()[1] not in avoid:
                ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def port_free(port: int) -> bool:
    """Whether a server could bind 127.0.0.1:`port` now."""
    with socket.socket() as s:
        # As the servers bind: a port whose old connections linger in TIME_WAIT is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def proc_alive(pid: Optional[int], marker: str = "") -> bool:
    """Whether `pid` runs (not a zombie) and its command line contains `marker`."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return False
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    return marker in cmdline


def processes_in_ns(mnt_ns: str) -> List[int]:
    """Pids of the processes in mount namespace `mnt_ns` (``mnt:[N]``)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.readlink(d / "ns" / "mnt") == mnt_ns:
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def mounted(path: Path) -> bool:
    """Whether `path` is a mount point in this mount namespace."""
    with open("/proc/self/mounts") as f:
        return any(line.split()[1].replace("\\040", " ") == str(path) for line in f)


def mounts_under(dir: Path) -> List[str]:
    """Mount points below `dir` in this mount namespace."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    return [p for p in points if p.startswith(f"{dir}/")]


def tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a log file (empty if unreadable)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""

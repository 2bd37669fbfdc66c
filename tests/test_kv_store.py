# SPDX-License-Identifier: Apache-2.0
"""The target's key-value store (NVMe Key Value command set) end to end: `insitu target
start --kv-store SIZE`, the `insitu kv` command line and `insitu.kv(url)`, against a
daemon on 127.0.0.1 over a sparse private image. A model dict checks every answer.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers import INSITU, cli_json, free_port, run_cli

NQN = "nqn.2024-01.io.insitu:kv-test"
KV_SIZE = "16M"


class KvTarget:
    """A target daemon with a sharable namespace and a private one holding the KV store."""

    def __init__(self, base: str = "/var/tmp"):
        self.dir = Path(tempfile.mkdtemp(prefix="insitu-kv-", dir=base))
        self.shared = self.dir / "shared.img"
        self.private = self.dir / "private.img"
        for p, size in ((self.shared, 4 << 20), (self.private, 64 << 20)):
            with open(p, "wb") as f:
                f.truncate(size)
        self.listen = f"127.0.0.1:{free_port()}"
        self.running = False

    @property
    def url(self) -> str:
        return f"nvme-tcp://{self.listen}/{NQN}"

    def start(self) -> dict:
        doc = cli_json("target", "start", "--listen", self.listen, "--nqn", NQN, "--namespace", self.shared, "--private", self.private, "--kv-store", KV_SIZE)
        self.running = True
        return doc

    def stop(self) -> None:
        if self.running:
            run_cli("target", "stop", "--listen", self.listen)
            self.running = False


@pytest.fixture(scope="module")
def kv_target():
    if not Path(INSITU).exists():
        pytest.skip(f"{INSITU} not found: run `make build` first")
    t = KvTarget()
    try:
        t.start()
        yield t
    finally:
        t.stop()
        shutil.rmtree(t.dir, ignore_errors=True)


def kv(*args, stdin: bytes = None) -> subprocess.CompletedProcess:
    """`insitu kv ARGS` with binary stdout."""
    return subprocess.run([INSITU, "kv", *map(str, args)], input=stdin, capture_output=True, timeout=60)


def test_target_start_refuses_kv_store_without_private(tmp_path):
    img = tmp_path / "ns.img"
    img.write_bytes(b"\0" * 4096)
    r = run_cli("target", "start", "--listen", f"127.0.0.1:{free_port()}", "--namespace", img, "--kv-store", "16M")
    assert r.rc == 2 and "--private IMG" in r.stderr, r.stderr
    r = run_cli("target", "start", "--listen", f"127.0.0.1:{free_port()}", "--namespace", img, "--private", img, "--kv-store", "lots")
    assert r.rc == 2 and "--kv-store" in r.stderr and "not a size" in r.stderr, r.stderr


def test_cli_round_trip(kv_target, tmp_path):
    u = kv_target.url
    assert kv("put", u, "cli-hello", "world").returncode == 0
    r = kv("get", u, "cli-hello")
    assert (r.returncode, r.stdout) == (0, b"world")
    # A binary value from stdin under a binary (0x) key, and one from a file.
    blob = bytes(range(256)) * 40
    assert kv("put", u, "0x00ff10", "-", stdin=blob).returncode == 0
    assert kv("get", u, "0x00ff10").stdout == blob
    f = tmp_path / "v.bin"
    f.write_bytes(b"\x00\x01file\xff")
    assert kv("put", u, "cli-file", "--file", f).returncode == 0
    assert kv("get", u, "cli-file").stdout == b"\x00\x01file\xff"
    # ls: one key per line, 0x form for keys that are not text; it reads back.
    lines = kv("ls", u).stdout.decode().splitlines()
    assert "0x00ff10" in lines and "cli-hello" in lines and "cli-file" in lines, lines
    assert kv("ls", u, "--prefix", "cli-").stdout.decode().splitlines() == ["cli-file", "cli-hello"]
    assert kv("ls", u, "--prefix", "0x00").stdout.decode().splitlines() == ["0x00ff10"]
    r = kv("exists", u, "cli-hello")
    assert (r.returncode, r.stdout.strip()) == (0, b"yes")
    # The URL may name the namespace; the JSON form lists the same keys.
    nsid = cli_json("kv", "ls", u)["nsid"]
    assert kv("get", f"{u}/{nsid}", "cli-hello").stdout == b"world"
    r = kv("get", f"{u}/1", "cli-hello")  # namespace 1 is the block namespace
    assert r.returncode == 2 and b"not a key-value namespace" in r.stderr and f"is {nsid}".encode() in r.stderr, r.stderr
    for k in ("cli-hello", "0x00ff10", "cli-file"):
        assert kv("rm", u, k).returncode == 0
    r = kv("exists", u, "cli-hello")
    assert (r.returncode, r.stdout.strip()) == (1, b"no")
    assert "cli-hello" not in kv("ls", u).stdout.decode().splitlines()


def test_cli_absent_keys_exit_1(kv_target):
    u = kv_target.url
    for cmd in ("get", "rm"):
        r = kv(cmd, u, "cli-absent")
        assert r.returncode == 1, (cmd, r)
        assert b"does not exist" in r.stderr and b"cli-absent" in r.stderr, r.stderr
        assert r.stdout == b""
    assert kv("exists", u, "cli-absent").returncode == 1


def test_bad_keys_change_nothing(kv_target):
    import insitu

    u = kv_target.url
    m = insitu.kv(u)
    m[b"bad-keep"] = b"kept"
    before = {k: m[k] for k in m.keys()}
    for bad in ("x" * 17, "0x" + "ab" * 17, "", "0x123"):
        r = kv("put", u, bad, "v")
        assert r.returncode == 2 and b"key" in r.stderr, (bad, r.stderr)
    with pytest.raises(ValueError, match="1 to 16 bytes"):
        m[b"y" * 17] = b"v"
    with pytest.raises(ValueError, match="1 to 16 bytes"):
        m["é" * 9]  # 18 bytes in UTF-8
    with pytest.raises(ValueError):
        m[b""] = b"v"
    with pytest.raises(ValueError):
        del m[b"z" * 17]
    assert b"y" * 17 not in m
    assert {k: m[k] for k in m.keys()} == before
    del m[b"bad-keep"]


def test_python_mapping_semantics(kv_target):
    import collections.abc

    import insitu

    m = insitu.kv(kv_target.url)
    assert isinstance(m, collections.abc.MutableMapping)
    m["py-str"] = bytearray(b"from str")
    assert m[b"py-str"] == b"from str" and "py-str" in m
    m[b"py-mv"] = memoryview(b"\x00\xffmv")
    assert m.get("py-mv") == b"\x00\xffmv"
    assert m.get(b"py-absent", b"dflt") == b"dflt"
    with pytest.raises(KeyError):
        m[b"py-absent"]
    with pytest.raises(KeyError):
        del m[b"py-absent"]
    assert m.keys(prefix=b"py-") == [b"py-mv", b"py-str"]
    assert set(iter(m)) >= {b"py-mv", b"py-str"} and len(m) >= 2
    big = random.Random(3).randbytes(200_000)
    m[b"py-big"] = big
    assert m[b"py-big"] == big
    for k in (b"py-str", b"py-mv", b"py-big"):
        del m[k]
    assert m.keys(prefix=b"py-") == []


def model_run(m, n: int, seed: int, values=(0, 1, 100, 4095, 4097, 20000)) -> None:
    """`n` random Stores, Retrieves, Deletes, Exists and prefix Lists through `m` (an
    ``insitu.kv`` mapping), each checked against a model dict; then the whole store."""
    rng = random.Random(seed)
    prefixes = [b"m", b"ma", b"mb\x00", b"m\xff"]
    keys = [rng.choice(prefixes) + rng.randbytes(rng.randint(0, 12)) for _ in range(300)]
    keys = [k[:16] for k in keys]
    model = {}
    for k in m.keys(prefix=b"m"):
        model[k] = m[k]
    counts = [0] * 5
    for _ in range(n):
        op = rng.random()
        k = rng.choice(keys)
        if op < 0.40:
            v = rng.randbytes(rng.choice(values))
            m[k] = v
            model[k] = v
            counts[0] += 1
        elif op < 0.65:
            if k in model:
                assert m[k] == model[k], k
            else:
                with pytest.raises(KeyError):
                    m[k]
            counts[1] += 1
        elif op < 0.80:
            if k in model:
                del m[k]
                del model[k]
            else:
                with pytest.raises(KeyError):
                    del m[k]
            counts[2] += 1
        elif op < 0.97:
            assert (k in m) == (k in model), k
            counts[3] += 1
        else:
            p = k[: rng.randint(0, len(k))]
            assert m.keys(prefix=p) == sorted(x for x in model if x.startswith(p)), p
            counts[4] += 1
    assert sum(counts) == n and min(counts) > 0, counts
    assert m.keys(prefix=b"m") == sorted(model)
    for k, v in model.items():
        assert m[k] == v
    for k in list(model):
        del m[k]


def test_python_model_3000_operations(kv_target):
    import insitu

    model_run(insitu.kv(kv_target.url), 3000, 0x4B56)


def test_python_model_200000_operations():
    """Hundreds of thousands of operations through the Python API against a model, on a
    target whose private namespace is in memory (the test is about semantics; every Store
    and Delete is still committed and synced before it is acknowledged)."""
    import insitu

    t = KvTarget(base="/dev/shm" if Path("/dev/shm").is_dir() else "/var/tmp")
    try:
        t.start()
        model_run(insitu.kv(t.url), 200_000, 0x5EED, values=(0, 1, 16, 100, 300, 4097))
    finally:
        t.stop()
        shutil.rmtree(t.dir, ignore_errors=True)


def test_restart_keeps_data(kv_target):
    import insitu

    m = insitu.kv(kv_target.url)
    data = {f"rs-{i}".encode(): random.Random(i).randbytes(i * 37) for i in range(1, 60)}
    for k, v in data.items():
        m[k] = v
    del m[b"rs-7"]
    del data[b"rs-7"]
    m.close()
    kv_target.stop()
    kv_target.start()
    m = insitu.kv(kv_target.url)
    assert m.keys(prefix=b"rs-") == sorted(data)
    for k, v in data.items():
        assert m[k] == v, k
    r = kv("get", kv_target.url, "rs-1")
    assert r.stdout == data[b"rs-1"]
    for k in data:
        del m[k]


def test_kill_9_during_a_write_stream_loses_no_acknowledged_store():
    """The target is killed (SIGKILL) in the middle of a stream of Stores, six times over,
    and restarted on the same image each time: every Store acknowledged before a kill reads
    back exactly, the one in flight is either absent or whole, and `insitu target fsck` finds
    the file system under the store clean."""
    import os
    import signal
    import threading
    import time

    import insitu

    t = KvTarget()
    acked: dict[bytes, bytes] = {}
    in_flight: dict[bytes, bytes] = {}

    def value(trial: int, i: int) -> bytes:
        return random.Random(trial * 1_000_003 + i).randbytes(100 + (i * 977) % 8000)

    try:
        for trial in range(6):
            pid = t.start()["pid"]
            m = insitu.kv(t.url)
            for k, v in acked.items():  # every earlier trial's acknowledged Stores survived
                assert m[k] == v, (trial, k)
            for k, v in in_flight.items():
                assert k not in m or m[k] == v, f"{k!r} was half-written"
            in_flight.clear()

            def writer():
                i = 0
                while True:
                    k, v = f"t{trial}-{i}".encode(), value(trial, i)
                    in_flight[k] = v
                    try:
                        m[k] = v
                    except Exception:
                        return  # the target is gone: this Store's outcome is unknown
                    acked[k] = in_flight.pop(k)
                    i += 1

            w = threading.Thread(target=writer)
            w.start()
            time.sleep(0.3 + 0.15 * trial)
            os.kill(pid, signal.SIGKILL)
            w.join(60)
            assert not w.is_alive(), "the writer did not notice the target's death"
            t.running = False
            for _ in range(200):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.05)
            assert sum(k.startswith(f"t{trial}-".encode()) for k in acked) > 0, "no Store completed before the kill"
            # The file system under the store is consistent after every kill.
            check = cli_json("target", "fsck", "--private", t.private, "--kv-store", KV_SIZE)
            assert check["clean"] and check["problems"] == [] and check["files"] >= 1, check
        t.start()
        m = insitu.kv(t.url)
        for k, v in acked.items():
            assert m[k] == v, k
        for k, v in in_flight.items():
            assert k not in m or m[k] == v, f"{k!r} was half-written"
    finally:
        t.stop()
        shutil.rmtree(t.dir, ignore_errors=True)

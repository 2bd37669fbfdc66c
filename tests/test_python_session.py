# SPDX-License-Identifier: Apache-2.0
"""The Python binding of the user-space initiator, `insitu.Session`, against a target
daemon on loopback: identify, block I/O, EXEC with a result object, errors."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import crc32c
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import insitu  # noqa: E402
from insitu import _native  # noqa: E402


NQN = "nqn.2024-01.io.insitu:session-test"


@pytest.fixture(scope="module")
def url(start_target):
    return start_target(NQN, 64 << 20, private=True).url


def test_identify_and_block_io(url: str):
    s = insitu.Session(url, queue_depth=8, io_queues=2)
    c = s.identify_controller()
    assert c["subnqn"] == NQN and c["namespaces"] == 2
    assert s.active_namespaces() == [1]  # namespace 2 is private
    ns = s.identify_namespace(1)
    assert ns["size"] == 64 << 20 and ns["lba_size"] == 512
    data = os.urandom(3 * 4096 + 512)
    s.write(1, 100, data)
    s.flush(1)
    assert s.read(1, 100, len(data) // 512) == data
    # Into a caller's buffer, reused: the same bytes, the rest of the image untouched.
    buf = bytearray(len(data))
    for _ in range(2):
        s.read_into(1, 100, buf)
        assert buf == data
    for bad in (bytearray(0), bytearray(700)):
        with pytest.raises(insitu.RequestError, match="whole"):
            s.read_into(1, 100, bad)
    with pytest.raises(TypeError):
        s.read_into(1, 100, bytes(512))  # not writable
    assert s.stats()["bytes_received"] >= len(data)
    with pytest.raises(insitu.TargetError, match="LBA Out of Range"):
        s.read(1, (64 << 20) // 512, 1)
    with pytest.raises(insitu.TargetError, match="LBA Out of Range"):
        s.read_into(1, (64 << 20) // 512, bytearray(512))
    s.disconnect()


@pytest.mark.parametrize("extra", [[], ["--direct-reads"]], ids=["page-cache", "direct-reads"])
def test_host_reads_of_a_disk_match_the_image_either_way(start_target, extra):
    """Host reads go through the page cache by default and with direct I/O under
    --direct-reads: both return the image's bytes, also right after overwriting what was
    just read (and so cached)."""
    t = start_target(f"{NQN}-{'direct' if extra else 'cached'}", 32 << 20, extra=extra)
    assert t.doc["direct_reads"] is bool(extra)
    s = insitu.Session(t.url, queue_depth=8, io_queues=2)
    first = os.urandom(4 << 20)
    s.write(1, 0, first)
    assert s.read(1, 0, len(first) // 512) == first
    second = os.urandom(1 << 20)
    s.write(1, 1024, second)
    s.flush(1)
    want = first[: 1024 * 512] + second + first[1024 * 512 + len(second) :]
    assert s.read(1, 0, len(first) // 512) == want
    s.disconnect()
    with open(t.image, "rb") as f:
        assert f.read(len(want)) == want, "what the host read is what the image holds"


def test_kv_attention_is_counted_in_the_metrics(start_target):
    """A KV attention, answered on its connection's thread, is in the target's metrics
    with the media bytes it read, as commands run on a worker are."""
    import re
    import struct
    import urllib.request

    from helpers import free_port

    port = free_port()
    t = start_target(f"{NQN}-kv-metrics", 32 << 20, private=True, extra=["--metrics", f"127.0.0.1:{port}"])
    kv = _native.KvTarget(t.url)
    heads, dim, tokens = 2, 64, 64  # f32: 16 tokens a page, 4 pages per head
    kv.create(7, 1, heads, dim)
    k = struct.pack(f"<{heads * tokens * dim}f", *[0.01 * (i % 97) for i in range(heads * tokens * dim)])
    kv.append(7, 0, tokens, k, k)
    q = struct.pack(f"<{heads * dim}f", *[0.1] * (heads * dim))
    _, stats = kv.attend(0, [7], q, 1, 0.125)
    assert stats["media_bytes"] > 0
    kv.disconnect()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    media = sum(float(v) for v in re.findall(r'^insitu_media_bytes_total\{[^}]*command="other"[^}]*\} (\S+)$', text, re.M))
    assert media >= stats["media_bytes"], text


def test_exec_writes_its_result_to_the_result_object(url: str):
    s = insitu.Session(url)
    payload = os.urandom(1 << 20)
    s.write(1, 2048, payload)
    desc = {
        "function": "crc32c",
        "args": [],
        "inputs": [{"length": len(payload) - 5, "extents": [{"kind": "data", "start_sector": 2048, "sectors": 2048}]}],
        "outputs": [],
        "result": {"length": 4096, "extents": [{"kind": "data", "start_sector": 8192, "sectors": 8}]},
    }
    blob = _native.encode_descriptor(json.dumps(desc))
    assert json.loads(_native.decode_descriptor(blob))["result"]["extents"][0]["start_sector"] == 8192
    length, media_kib = s.exec(1, blob)
    assert media_kib >= 1023
    result = s.read(1, 8192, 8)[:length]
    assert result.startswith(b"ISRS")
    assert f"{crc32c.crc32c(payload[:-5]):08x}".encode() in result
    # Without a result object the fabric has no way back for the result: refused.
    del desc["result"]
    with pytest.raises(insitu.TargetError, match="Invalid Field"):
        s.exec(1, _native.encode_descriptor(json.dumps(desc)))
    # Private namespaces are unreachable.
    with pytest.raises(insitu.InsituError):
        s.read(2, 0, 1)


def test_bad_urls_and_hosts_are_refused(url: str):
    with pytest.raises(insitu.RequestError, match="nvme-tcp://"):
        insitu.Session("tcp://nowhere")
    with pytest.raises(insitu.InsituError):
        insitu.Session(url.replace(NQN, "nqn.2024-01.io.insitu:absent"))


def test_a_paced_read_completes_no_sooner_than_its_model_reads_it(tmp_path):
    """A namespace paced by a device model sends a Read's data from the page cache at once,
    but completes it only when the modelled drive would have read it (here 256 KiB at
    1 MB/s: at least 0.25 s), and the data is the data written."""
    import time

    t = _native.EmbeddedTarget(str(tmp_path / "paced"), 64 << 20, 16 << 20, "custom:1")
    try:
        s = insitu.Session(t.url)
        data = os.urandom(256 << 10)
        s.write(1, 0, data)
        buf = bytearray(len(data))
        started = time.perf_counter()
        s.read_into(1, 0, buf)
        took = time.perf_counter() - started
        assert bytes(buf) == data
        assert took >= 0.2, f"a 256 KiB read at 1 MB/s took {took:.3f} s"
        s.disconnect()
    finally:
        t.shutdown()

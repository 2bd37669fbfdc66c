# SPDX-License-Identifier: Apache-2.0
"""Fuzzing the parsers of what a Swift device holds (ring files, metadata pickles, fragment
headers): any bytes give a value or a SwiftError, never another exception, and a pickle
that names a callable is refused without running it."""

from __future__ import annotations

import json
import pickle
import random
import struct
import zlib

import pytest

from insitu.swift.resolve import HEADER_MAGIC, Header, Ring, SwiftConf, SwiftError, parse_metadata

ROUNDS = 3000


def ring_bytes(parts_power: int = 3, replicas: int = 3, devices: int = 4) -> bytes:
    """A ring as Swift writes it: R1NG, version 1, JSON, one array per replica."""
    meta = {
        "devs": [{"id": i, "device": f"d{i}", "ip": "127.0.0.1", "port": 6200 + i} for i in range(devices)],
        "part_shift": 32 - parts_power,
        "replica_count": replicas,
        "byteorder": "little",
    }
    j = json.dumps(meta).encode()
    out = b"R1NG" + struct.pack("!H", 1) + struct.pack("!I", len(j)) + j
    parts = 1 << parts_power
    for r in range(replicas):
        out += struct.pack(f"<{parts}H", *[(p + r) % devices for p in range(parts)])
    return out


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(4)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1 and b:
            del b[rng.randrange(len(b)) :]
        elif op == 2:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        elif b:
            i = rng.randrange(len(b))
            del b[i : i + rng.randint(1, 16)]
    return bytes(b)


def test_a_ring_swift_writes_places_partitions_on_its_devices():
    ring = Ring.parse(ring_bytes())
    assert len(ring.replicas) == 3 and len(ring.devices) == 4
    h = "f" * 32
    part = ring.partition(h)
    assert part == 7  # the top 3 bits
    assert [d.name for d in ring.nodes(part)] == ["d3", "d0", "d1"]


def test_mutated_rings_parse_or_fail_clearly():
    rng = random.Random(7)
    good = ring_bytes()
    for _ in range(ROUNDS):
        try:
            ring = Ring.parse(mutate(rng, good))
        except SwiftError:
            continue
        for part in range(1 << (32 - ring.part_shift)):
            ring.nodes(part)  # a ring that parsed answers every partition


def test_metadata_pickles_parse_or_fail_clearly():
    good = pickle.dumps({b"ETag": b"0" * 32, b"X-Object-Sysmeta-Ec-Frag-Index": b"1", b"Content-Length": b"12"}, protocol=2)
    assert parse_metadata(good, "m")["ETag"] == "0" * 32
    rng = random.Random(11)
    for _ in range(ROUNDS):
        try:
            parse_metadata(mutate(rng, good), "m")
        except SwiftError:
            pass


def test_a_pickle_that_names_a_callable_is_refused_unrun(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with pytest.raises(SwiftError, match="only plain values"):
        parse_metadata(pickle.dumps({"ETag": Evil()}, protocol=2), "m")
    assert not marker.exists()
    with pytest.raises(SwiftError, match="latin1"):
        parse_metadata(b"\x80\x02c_codecs\nencode\nq\x00X\x01\x00\x00\x00xX\x04\x00\x00\x00zlibq\x01\x86q\x02Rq\x03.", "m")


def test_fragment_headers_parse_or_fail_clearly():
    good = struct.pack("<IIIQB", 2, 1024, 0, 3072, 1) + bytes(32 + 1 + 1 + 4) + struct.pack("<I", HEADER_MAGIC) + bytes(17)
    assert len(good) == 80
    h = Header.parse(good, "h")
    assert (h.index, h.size, h.segment) == (2, 1024, 3072)
    rng = random.Random(5)
    for _ in range(ROUNDS):
        try:
            Header.parse(mutate(rng, good), "h")
        except SwiftError:
            pass


def test_swift_conf_without_hash_secrets_is_refused(tmp_path):
    (tmp_path / "swift.conf").write_text("[storage-policy:0]\nname = gold\n")
    with pytest.raises(SwiftError, match="swift_hash_path"):
        SwiftConf.load(tmp_path)
    (tmp_path / "swift.conf").write_text(
        "[swift-hash]\nswift_hash_path_suffix = s\n[storage-policy:1]\nname = ec\npolicy_type = erasure_coding\nec_num_data_fragments = x\n"
    )
    with pytest.raises(SwiftError, match="storage-policy:1"):
        SwiftConf.load(tmp_path)
    assert zlib  # the stdlib codec the refused pickle names

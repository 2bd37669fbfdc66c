# SPDX-License-Identifier: Apache-2.0
"""The analysis kernels (count, vector-add, array-merge, pagerank) offloaded on a real
file system, against NumPy-free Python references."""

from __future__ import annotations

import random
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import cli_json, run_cli  # noqa: E402


def u64s(values):
    return struct.pack(f"<{len(values)}Q", *values)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture
def tdir(ext4_fs):
    return ext4_fs.mkdir("analytics")


def test_count_vector_add_and_merge(tdir):
    rng = random.Random(7)
    a = sorted(rng.randrange(1 << 40) for _ in range(300_000))
    b = sorted(rng.randrange(1 << 40) for _ in range(300_000))
    pa, pb = write(tdir / "a.u64", u64s(a)), write(tdir / "b.u64", u64s(b))
    lo, hi = 1 << 38, 1 << 39
    for mode in ([], ["--conventional"]):
        r = cli_json("exec", "count", pa, pb, "--arg", f"min={lo}", "--arg", f"max={hi}", *mode)
        assert [x["count"] for x in r["results"]] == [sum(lo <= v < hi for v in xs) for xs in (a, b)]
    s = cli_json("exec", "vector-add", pa, pb, "--output", tdir / "sum.u64")
    assert s["results"][0]["inputs"] == [str(pa), str(pb)] and s["stats"]["commands"] == 1
    assert (tdir / "sum.u64").read_bytes() == u64s([(x + y) % (1 << 64) for x, y in zip(a, b)])
    cli_json("exec", "array-merge", pa, pb)
    assert Path(f"{pa}.merged").read_bytes() == u64s(sorted(a + b))
    unsorted = write(tdir / "u.u64", u64s([3, 1, 2]))
    r = run_cli("exec", "array-merge", unsorted, pb)
    assert r.rc == 2 and "ascending" in r.stderr
    r = run_cli("exec", "vector-add", pa, pb, tdir / "sum.u64")
    assert r.rc == 2 and "at most 2" in r.stderr


def pagerank(nodes, edges, iterations=20, d=0.85):
    out = [0] * nodes
    for s, _ in edges:
        out[s] += 1
    rank = [1.0 / nodes] * nodes
    for _ in range(iterations):
        dangling = sum(r for r, o in zip(rank, out) if o == 0)
        base = (1 - d) / nodes + d * dangling / nodes
        nxt = [base] * nodes
        for s, t in edges:
            nxt[t] += d * rank[s] / out[s]
        rank = nxt
    return rank


def test_pagerank_matches_a_python_reference(tdir):
    rng = random.Random(3)
    nodes = 500
    edges = [(rng.randrange(nodes), rng.randrange(nodes // 5) * 5) for _ in range(4000)]
    g = write(tdir / "g.edges", b"".join(struct.pack("<II", s, t) for s, t in edges))
    off = cli_json("exec", "pagerank", g, "--arg", f"nodes={nodes}", "--force")
    conv = cli_json("exec", "pagerank", g, "--arg", f"nodes={nodes}", "--conventional", "--force")
    got = Path(off["results"][0]["output"]).read_bytes()
    assert got == Path(conv["results"][0]["output"]).read_bytes()
    ranks = struct.unpack(f"<{nodes}d", got)
    want = pagerank(nodes, edges)
    assert max(abs(x - y) for x, y in zip(ranks, want)) < 1e-12
    assert abs(sum(ranks) - 1) < 1e-9
    bad = write(tdir / "bad.edges", struct.pack("<II", 0, nodes))
    r = run_cli("exec", "pagerank", bad, "--arg", f"nodes={nodes}")
    assert r.rc == 2 and "outside" in r.stderr

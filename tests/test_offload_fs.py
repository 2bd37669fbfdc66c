# SPDX-License-Identifier: Apache-2.0
"""Every function, offloaded and conventionally, over files of many shapes on ext4 (4 KiB
and 1 KiB blocks) and xfs, against independent references: hashlib, crc32c, xxhash,
b3sum, GNU grep / wc / sort in the C locale, zstd and a CSV oracle written from the spec.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
from pathlib import Path
from typing import Dict, List

import crc32c as _crc
import pytest
import xxhash

from helpers import (
    CHECKSUMS,
    both_modes,
    csv_select_oracle,
    exec_json,
    fiemap,
    ref_checksum,
    read_chunks,
    ref_grep,
    ref_grep_literal_stream,
    ref_sort,
    ref_wc,
    run_cli,
    text_bytes,
    write_fallocated,
    write_fallocated_islands,
    write_file,
    write_fragmented,
    write_many_extents,
    write_sparse,
    virtual_chunks,
    zstd_decompress,
)

ODD_SIZES = [1, 2, 511, 512, 513, 1023, 1025, 4095, 4096, 4097, 8191, 65537, (1 << 20) + 1, (2 << 20) + 3]


@pytest.fixture(scope="session")
def corpus(any_fs) -> Dict[str, Path]:
    """Files of every shape on the file system (most left unsynced: the host must sync
    them before mapping)."""
    rng = random.Random(f"corpus-{any_fs.name}")
    d = any_fs.mkdir("corpus")
    files: Dict[str, Path] = {}
    files["empty"] = write_file(d / "empty", b"")
    for n in ODD_SIZES:
        files[f"text-{n}"] = write_file(d / f"text-{n}.log", text_bytes(n, rng))
    files["binary"] = write_file(d / "binary.bin", rng.randbytes(300_001))
    files["zeros"] = write_file(d / "zeros.bin", bytes(70_000))
    files["no-newline"] = write_file(d / "no-newline.txt", b"abc ERROR " * 5000)
    files["newlines"] = write_file(d / "newlines.txt", b"\n" * 9999)
    write_fragmented(d / "frag-a.log", d / "frag-b.bin", 300, rng)
    files["frag-a"], files["frag-b"] = d / "frag-a.log", d / "frag-b.bin"
    write_sparse(d / "sparse.log", rng)
    files["sparse"] = d / "sparse.log"
    files["hole-only"] = d / "hole-only"
    with open(files["hole-only"], "wb") as f:
        f.truncate((3 << 20) + 5)
    files["hole-tail"] = d / "hole-tail"
    with open(files["hole-tail"], "wb") as f:
        f.write(text_bytes(100, rng))
        f.truncate(10_000)
    write_fallocated(d / "fallocated.log", rng)
    files["fallocated"] = d / "fallocated.log"
    write_fallocated_islands(d / "islands.bin", rng)
    files["islands"] = d / "islands.bin"
    # Preallocated beyond EOF (fallocate --keep-size): the extents past the end are ignored.
    files["prealloc-beyond-eof"] = write_file(d / "prealloc.log", text_bytes(12_345, rng))
    subprocess.run(["fallocate", "-n", "-o", "12345", "-l", "1M", str(files["prealloc-beyond-eof"])], check=True)
    write_many_extents(d / "many-extents.log", rng)
    files["many-extents"] = d / "many-extents.log"
    files["big-text"] = write_file(d / "big-text.log", text_bytes((6 << 20) + 99, rng))
    # Written without fsync: delayed allocation must not fool the host.
    files["unsynced"] = write_file(d / "unsynced.log", text_bytes(777_777, rng))
    return files


def _paths(corpus) -> List[Path]:
    return list(corpus.values())


def test_corpus_has_the_shapes_it_claims(corpus, any_fs):
    """Guards the other tests: the shapes really are fragmented, sparse and unwritten."""
    assert len(fiemap(corpus["frag-a"])) >= 3, "interleaved appends did not fragment the file"
    assert len(fiemap(corpus["frag-b"])) >= 3
    sparse = fiemap(corpus["sparse"])
    assert sparse and sparse[0].logical >= 1 << 20, "no hole at the start"
    assert sum(e.length for e in sparse) < 1 << 20, "holes were filled"
    assert sparse[-1].logical + sparse[-1].length < corpus["sparse"].stat().st_size, "no hole at the end"
    assert fiemap(corpus["hole-only"]) == []
    fal = fiemap(corpus["fallocated"])
    assert any(e.unwritten for e in fal), "posix_fallocate left no unwritten extent"
    assert any(not e.unwritten for e in fal)
    isl = fiemap(corpus["islands"])
    assert sum(1 for e in isl if e.unwritten) >= 2 and any(not e.unwritten for e in isl)
    beyond = fiemap(corpus["prealloc-beyond-eof"])
    size = corpus["prealloc-beyond-eof"].stat().st_size
    assert max(e.logical + e.length for e in beyond) > size, "nothing preallocated past EOF"
    many = fiemap(corpus["many-extents"])
    assert len(many) > 300, "the many-extents file has too few extents"
    assert any(e.unwritten for e in many)
    for n in ODD_SIZES:
        assert corpus[f"text-{n}"].stat().st_size == n
    if any_fs.block_size == 1024:
        # Extents that start on an odd KiB: aligned to 512-byte sectors but not to 4 KiB.
        starts = [e.physical for p in _paths(corpus) for e in fiemap(p)]
        assert any(s % 4096 for s in starts), "no extent off the 4 KiB grid on the 1 KiB-block file system"


@pytest.mark.parametrize("function", CHECKSUMS)
def test_checksums_match_references(corpus, function):
    paths = _paths(corpus)
    off, conv = both_modes(function, paths)
    for p, o, c in zip(paths, off["results"], conv["results"]):
        want = ref_checksum(function, p)
        assert o["value"] == want, f"{function} offloaded of {p.name}"
        assert c["value"] == want, f"{function} conventional of {p.name}"
    assert off["stats"]["commands"] == len(paths)
    assert conv["stats"]["commands"] == 0


GREP_CASES = [
    ("ERROR", False, False),
    ("status=503", False, False),
    ("abcabc", False, False),
    ("error", False, True),
    ("", False, False),
    ("x" * 40 + " ", False, False),
    ("status=5[0-9]{2}", True, False),
    ("^[a-z]+ ERROR", True, False),
    ("e$", True, False),
    ("^$", True, False),
    ("warn(ing)?", True, True),
    ("^[^E]*$", True, False),
    ("ab(c|cabc) .*GET", True, False),
    ("[0-9]{3}\t", True, False),
]


@pytest.mark.parametrize("pattern,regex,icase", GREP_CASES, ids=[f"{'E' if r else 'F'}{'i' if i else ''}:{p!r}" for p, r, i in GREP_CASES])
def test_grep_matches_gnu_grep(corpus, pattern, regex, icase):
    paths = _paths(corpus)
    off, conv = both_modes("grep", paths, {"pattern": pattern, "regex": regex, "ignore_case": icase})
    for p, o, c in zip(paths, off["results"], conv["results"]):
        count, matches = ref_grep(p, pattern, regex, icase)
        assert (o["count"], o["matches"], o["truncated"]) == (count, matches, False), f"offloaded grep on {p.name}"
        assert (c["count"], c["matches"], c["truncated"]) == (count, matches, False), f"conventional grep on {p.name}"


def test_grep_max_matches_truncates_but_counts_exactly(corpus):
    p = corpus["big-text"]
    count, matches = ref_grep(p, "ERROR")
    assert count > 10
    for conventional in (False, True):
        doc = exec_json("grep", [p], {"pattern": "ERROR", "max_matches": 7}, conventional=conventional)
        r = doc["results"][0]
        assert r["count"] == count
        assert r["matches"] == matches[:7]
        assert r["truncated"] is True
        doc = exec_json("grep", [p], {"pattern": "ERROR", "max_matches": count}, conventional=conventional)
        assert doc["results"][0]["truncated"] is False
        assert doc["results"][0]["matches"] == matches


def test_friendly_grep_and_wc_commands(corpus):
    paths = [corpus["big-text"], corpus["frag-a"], corpus["sparse"]]
    doc = run_cli("grep", "-E", "-i", "status=5[0-9]{2}", *paths)
    assert doc.rc == 0, doc.stderr
    for p, r in zip(paths, doc.doc["results"]):
        assert (r["count"], r["matches"]) == ref_grep(p, "status=5[0-9]{2}", regex=True, ignore_case=True)
    text = run_cli("grep", "-c", "ERROR", *paths, json_out=False)
    assert text.rc == 0, text.stderr
    assert text.stdout.splitlines() == [f"{p}:{ref_grep(p, 'ERROR')[0]}" for p in paths]
    for conventional in ([], ["--conventional"]):
        w = run_cli("wc", *paths, *conventional)
        assert w.rc == 0, w.stderr
        assert [(r["lines"], r["words"], r["bytes"]) for r in w.doc["results"]] == [ref_wc(p) for p in paths]


def test_wc_matches_gnu_wc(corpus):
    paths = _paths(corpus)
    off, conv = both_modes("wc", paths)
    for p, o, c in zip(paths, off["results"], conv["results"]):
        want = ref_wc(p)
        assert (o["lines"], o["words"], o["bytes"]) == want, f"offloaded wc of {p.name}"
        assert (c["lines"], c["words"], c["bytes"]) == want, f"conventional wc of {p.name}"


SORT_INPUTS = [
    "many-extents",
    "empty",
    "text-1",
    "text-513",
    "text-4097",
    "text-65537",
    "binary",
    "newlines",
    "no-newline",
    "frag-a",
    "frag-b",
    "sparse",
    "hole-tail",
    "fallocated",
    "islands",
    "prealloc-beyond-eof",
    "unsynced",
]


def test_sort_matches_gnu_sort(corpus, any_fs):
    out = any_fs.mkdir("sort-out")
    for name in SORT_INPUTS:
        p = corpus[name]
        want = ref_sort(p)
        for conventional in (False, True):
            dest = out / f"{name}.{'host' if conventional else 'off'}.sorted"
            doc = exec_json("sort", [p], output=dest, conventional=conventional)
            r = doc["results"][0]
            assert r["output"] == str(dest)
            assert r["output_length"] == len(want)
            got = dest.read_bytes()
            assert got == want, f"sort of {name} ({'conventional' if conventional else 'offloaded'})"


ZSTD_INPUTS = [
    "many-extents",
    "empty",
    "text-1",
    "text-4095",
    "text-65537",
    "text-2097155",
    "binary",
    "zeros",
    "frag-a",
    "frag-b",
    "sparse",
    "hole-only",
    "fallocated",
    "islands",
    "prealloc-beyond-eof",
    "big-text",
]


def test_zstd_round_trips(corpus, any_fs):
    out = any_fs.mkdir("zstd-out")
    for name in ZSTD_INPUTS:
        p = corpus[name]
        data = p.read_bytes()
        for conventional, level in ((False, 3), (True, 3), (False, 1), (False, 19 if len(data) < 1 << 20 else 9)):
            dest = out / f"{name}.{conventional}.{level}.zst"
            doc = exec_json("zstd", [p], {"level": level}, output=dest, conventional=conventional)
            r = doc["results"][0]
            assert r["input_length"] == len(data)
            assert dest.stat().st_size == r["output_length"]
            assert zstd_decompress(dest) == data, f"zstd -d of {name} level {level} ({'conventional' if conventional else 'offloaded'})"


# ----------------------------------------------------------------------------- csv-select


def _csv_field(rng: random.Random) -> bytes:
    kind = rng.randrange(8)
    if kind == 0:
        return b'"' + rng.choice([b"a,b", b'say ""hi""', b"two\nlines", b"cr\rlf\r\n", b"", b",", b'""']) + b'"'
    if kind == 1:
        return b""
    return rng.choice([b"alpha", b"Beta", b"gamma delta", b"\xc3\xa9t\xc3\xa9", b"\xff", b"x" * 30, b"DE", b"de"])


NUMBERS = [
    b"0",
    b"-0",
    b"1",
    b"12.5",
    b" 12.5 ",
    b"\t7",
    b"1e3",
    b"1E-2",
    b"+5",
    b".5",
    b"5.",
    b"-3.25",
    b"nan",
    b"NaN",
    b"inf",
    b"-Infinity",
    b"abc",
    b"",
    b"0x10",
    b"1_000",
    b"100",
    b"99.999",
    b"1e400",
    b"-1e-400",
    b'"1,5"',
]


def make_csv(rng: random.Random, rows: int) -> bytes:
    out = [b"id,name,amount,country,note,score,name\r\n"]
    terms = [b"\n", b"\r\n", b"\r", b"\n\n", b"\r\n\r\n"]
    for i in range(rows):
        rec = [
            str(i).encode(),
            rng.choice([b"ann", b"bob", b"Carl", b"dora", b"zed", b'"o\'neil, ""neo"""', b"m"]),
            rng.choice(NUMBERS),
            rng.choice([b"DE", b"FR", b"US", b"de", b"DE ", b'"D,E"']),
            _csv_field(rng),
            str(rng.randrange(-500, 500) / rng.choice([1, 4, 10])).encode(),
            _csv_field(rng),
        ]
        out.append(b",".join(rec) + rng.choice(terms))
    return b"".join(out)


CSV_ROWS = 64_000

CSV_QUERIES = [
    (None, None),
    ("country=DE;amount>=10", "id,amount"),
    ("amount<0", None),
    ("amount!=5", "id,amount"),
    ("amount=nan", "id"),
    ("amount!=nan", "id,amount"),
    ("amount>inf", "id"),
    ("amount>=-inf", "amount"),
    ("score>=1e2", "score,id"),
    (" country = DE ; score < 10 ", " note , id , note "),
    ("country!=DE", "country"),
    ("name<c", "name,id"),
    ("name>=dora", "name"),
    ("note~,", "note"),
    ('note~"', "id,note"),
    ("note~", "id"),
    ("country~E", "country,country"),
    ("amount=", "id,amount"),
    ("note=", "note"),
    ("amount<=12.5;amount>=12.5", "id,amount"),
]


@pytest.fixture(scope="session")
def csv_file(any_fs):
    """A CSV of about 2.5 MiB with every quoting and terminator form, written fragmented."""
    rng = random.Random(f"csv-{any_fs.name}")
    d = any_fs.mkdir("csv")
    data = make_csv(rng, CSV_ROWS)
    # Interleave with another file so the CSV's extents are scattered.
    with open(d / "orders.csv", "wb") as f, open(d / "filler.bin", "wb") as g:
        for i in range(0, len(data), 50_000):
            f.write(data[i : i + 50_000])
            f.flush()
            os.fsync(f.fileno())
            g.write(rng.randbytes(20_000))
            g.flush()
            os.fsync(g.fileno())
    assert len(data) > 2 << 20, "the CSV should cross the target's 2 MiB read chunks"
    return d / "orders.csv"


@pytest.mark.parametrize("where,columns", CSV_QUERIES, ids=[f"{w}|{c}" for w, c in CSV_QUERIES])
def test_csv_select_matches_oracle(csv_file, any_fs, where, columns):
    data = csv_file.read_bytes()
    want, rows_in, rows_out = csv_select_oracle(data, where, columns)
    assert rows_in == CSV_ROWS
    args = {}
    if where is not None:
        args["where"] = where
    if columns is not None:
        args["columns"] = columns
    out = any_fs.mkdir("csv-out")
    for conventional in (False, True):
        dest = out / f"sel.{conventional}.csv"
        r = exec_json("csv-select", [csv_file], args, output=dest, conventional=conventional)["results"][0]
        got = dest.read_bytes()
        assert (r["rows_in"], r["rows_out"]) == (rows_in, rows_out)
        assert r["output_length"] == len(got)
        assert got == want, f"csv-select {where!r} {columns!r} ({'conventional' if conventional else 'offloaded'})"


def test_csv_select_single_column_and_small_inputs(tdir):
    cases = {
        "one-col.csv": b'x\na\n""\nb\r\n\n"c,d"\n',
        "header-only.csv": b"a,b,c",
        "empty.csv": b"",
        "dup.csv": b"k,v,k\n1,2,3\n4,5,6\n",
        "trailing-comma.csv": b"a,b\n1,\n,2",
    }
    queries = {
        "one-col.csv": [(None, None), ("x!=a", None), ("x=", "x")],
        "header-only.csv": [(None, "c,a"), ("a=1", None)],
        "empty.csv": [(None, None)],
        "dup.csv": [("k>=4", "k,v"), (None, "k")],
        "trailing-comma.csv": [("b=", "a"), ("a<1", "b,a")],
    }
    for name, data in cases.items():
        p = write_file(tdir / name, data)
        for where, columns in queries[name]:
            want, _, rows_out = csv_select_oracle(data, where, columns)
            args = {k: v for k, v in (("where", where), ("columns", columns)) if v is not None}
            for conventional in (False, True):
                dest = tdir / f"{name}.{where}.{columns}.{conventional}.out"
                r = exec_json("csv-select", [p], args, output=dest, conventional=conventional)["results"][0]
                assert dest.read_bytes() == want, (name, where, columns, conventional)
                assert r["rows_out"] == rows_out


# ----------------------------------------------------------------------------- big file


@pytest.fixture(scope="session")
def big_file(ext4_fs):
    """300 MiB of log-like text, every MiB different, on the 4 KiB-block ext4 only."""
    rng = random.Random("big")
    base = bytearray(text_bytes(1 << 20, rng))
    p = ext4_fs.mkdir("big") / "big.log"
    with open(p, "wb") as f:
        for i in range(300):
            # Rotate the block, stamp it, and scatter a few changed bytes, so no two MiB
            # are equal.
            k = rng.randrange(1 << 20)
            chunk = bytearray(base[k:] + base[:k])
            stamp = b"chunk %d ERROR %d\n" % (i, rng.randrange(10**9))
            chunk[: len(stamp)] = stamp
            for _ in range(64):
                chunk[rng.randrange(1 << 20)] = rng.randrange(32, 127)
            f.write(chunk)
    assert p.stat().st_size == 300 << 20
    return p


def test_big_file_every_function(big_file, ext4_fs):
    size = big_file.stat().st_size
    extents = fiemap(big_file)
    assert sum(e.length for e in extents) >= size
    for function in CHECKSUMS:
        off, conv = both_modes(function, [big_file])
        want = ref_checksum(function, big_file)
        assert off["results"][0]["value"] == want
        assert conv["results"][0]["value"] == want
        assert off["stats"]["media_bytes"] >= size
        assert off["stats"]["bytes_to_host"] <= conv["stats"]["bytes_to_host"] / 100
    for pattern, regex in (("chunk 1", False), ("^chunk [0-9]+ ERROR [0-9]*7$", True)):
        off, conv = both_modes("grep", [big_file], {"pattern": pattern, "regex": regex})
        want = ref_grep(big_file, pattern, regex)
        assert (off["results"][0]["count"], off["results"][0]["matches"]) == want
        assert (conv["results"][0]["count"], conv["results"][0]["matches"]) == want
    off, conv = both_modes("wc", [big_file])
    want = ref_wc(big_file)
    for doc in (off, conv):
        r = doc["results"][0]
        assert (r["lines"], r["words"], r["bytes"]) == want
    dest = big_file.with_name("big.log.zst")
    r = exec_json("zstd", [big_file], {"level": 1}, output=dest)["results"][0]
    assert dest.stat().st_size == r["output_length"] < size
    assert zstd_decompress(dest) == big_file.read_bytes()


# ----------------------------------------------------------------------------- data movement


@pytest.mark.parametrize(
    "function,args",
    [(f, {}) for f in CHECKSUMS]
    + [
        ("grep", {"pattern": "status=503 ERROR abcabc"}),
        ("grep", {"pattern": "^ERROR warning c$", "regex": True}),
        ("wc", {}),
    ],
    ids=list(CHECKSUMS) + ["grep-F", "grep-E", "wc"],
)
def test_offload_moves_at_most_1pct(corpus, function, args):
    paths = [corpus["big-text"], corpus["text-2097155"], corpus["frag-a"]]
    total = sum(p.stat().st_size for p in paths)
    assert total > 8 << 20
    off, conv = both_modes(function, paths, args)
    assert off["stats"]["bytes_to_host"] <= conv["stats"]["bytes_to_host"] / 100
    assert conv["stats"]["bytes_to_host"] >= total
    assert off["stats"]["media_bytes"] >= total
    assert off["stats"]["commands"] == len(paths)
    assert 0 < off["stats"]["bytes_from_host"] < 64 << 10
    # The results themselves agree (the references are checked elsewhere).
    assert off["results"] == conv["results"]


# ----------------------------------------------------------------------------- coherence


def test_target_sees_unsynced_and_rewritten_data(tdir):
    """Data still in the page cache (never synced) and data overwritten in place after an
    offload are what the target reads: the host syncs before mapping."""
    rng = random.Random("coherence")
    p = tdir / "f.log"
    for round_ in range(4):
        if round_ == 0:
            data = text_bytes(3 << 20, rng)
            write_file(p, data)
        else:
            with open(p, "r+b") as f:
                off = rng.randrange(p.stat().st_size - 5000)
                f.seek(off)
                f.write(b"\nERROR rewritten %d\n" % round_)
                if round_ == 3:
                    f.truncate(p.stat().st_size - 1234)
        want = ref_checksum("sha256", p)
        assert exec_json("sha256", [p])["results"][0]["value"] == want
        assert exec_json("grep", [p], {"pattern": "rewritten"})["results"][0]["count"] == ref_grep(p, "rewritten")[0]


def test_reflinked_files_on_xfs(xfs_fs):
    """Shared (reflink) extents are read like any other, before and after copy-on-write."""
    d = xfs_fs.mkdir("reflink")
    src = write_file(d / "src.log", text_bytes(3 << 20, random.Random("reflink")))
    os.sync()
    cp = subprocess.run(["cp", "--reflink=always", str(src), str(d / "copy.log")], capture_output=True, text=True)
    if cp.returncode != 0:
        pytest.skip(f"no reflink support: {cp.stderr.strip()}")
    copy = d / "copy.log"
    with open(copy, "r+b") as f:
        f.seek(1 << 20)
        f.write(b"copy-on-write happened here\n")
    for p in (src, copy):
        for function in ("sha256", "crc32c"):
            assert exec_json(function, [p])["results"][0]["value"] == ref_checksum(function, p)
    assert ref_checksum("sha256", src) != ref_checksum("sha256", copy)


def test_many_files_in_one_command(tdir):
    """More files than worker threads, results in input order."""
    rng = random.Random("many")
    paths = [write_file(tdir / f"f{i:03d}", text_bytes(rng.randrange(0, 40_000), rng)) for i in range(97)]
    for function in ("xxh3", "wc"):
        off, conv = both_modes(function, paths)
        assert off["results"] == conv["results"]
    off = exec_json("xxh3", paths)
    assert [r["value"] for r in off["results"]] == [ref_checksum("xxh3", p) for p in paths]


def test_files_on_several_file_systems_in_one_command(ext4_fs, ext4_1k_fs, xfs_fs):
    """One command over files on three images: one target per backing image."""
    rng = random.Random("mixed")
    paths = []
    for fs in (ext4_fs, ext4_1k_fs, xfs_fs, ext4_fs):
        d = fs.mkdir("mixed")
        paths.append(write_file(d / "a.log", text_bytes(rng.randrange(1 << 20, 3 << 20), rng)))
        write_many_extents(d / "b.log", rng, islands=300)
        paths.append(d / "b.log")
    for function in ("blake3", "crc32c"):
        off, conv = both_modes(function, paths)
        assert [r["value"] for r in off["results"]] == [ref_checksum(function, p) for p in paths]
        assert off["results"] == conv["results"]
    off, conv = both_modes("grep", paths, {"pattern": "ERROR"})
    assert [(r["count"], r["matches"]) for r in off["results"]] == [ref_grep(p, "ERROR") for p in paths]
    assert off["results"] == conv["results"]


def test_sparse_file_larger_than_4_gib(ext4_fs):
    """Offsets and lengths past 2^32 bytes: a 5 GiB sparse file with data across the 4 GiB
    mark, more data beyond, and a hole at the end. The reference is computed from what
    was written (reading 5 GiB of holes back through the file system is slow)."""
    p = ext4_fs.mkdir("huge") / "huge.bin"
    rng = random.Random("huge")
    regions = [((1 << 32) - 3000, text_bytes(7000, rng)), ((4 << 30) + (300 << 20) + 1, rng.randbytes(50_000) + b"ERROR at the end")]
    length = (5 << 30) + 17
    with open(p, "wb") as f:
        for off, data in regions:
            f.seek(off)
            f.write(data)
        f.truncate(length)
    crc, h = 0, xxhash.xxh3_64()
    for chunk in virtual_chunks(regions, length):
        crc = _crc.crc32c(chunk, crc)
        h.update(chunk)
    doc = exec_json("crc32c", [p])
    assert doc["results"][0]["value"] == "%08x" % crc
    assert doc["stats"]["media_bytes"] < 1 << 20, "holes should not be read from the media"
    assert exec_json("xxh3", [p])["results"][0]["value"] == h.hexdigest()
    r = exec_json("grep", [p], {"pattern": "ERROR"})["results"][0]
    want = ref_grep_literal_stream(virtual_chunks(regions, length), b"ERROR")
    assert want[0] > 2 and want[1][-1][1] > 1 << 32
    assert (r["count"], r["matches"]) == want
    # The streaming reference itself agrees with GNU grep where GNU grep is quick.
    small = write_file(p.with_name("small.log"), bytes(100_000) + text_bytes(200_000, rng) + bytes(5000) + b"ERROR")
    assert ref_grep_literal_stream(read_chunks(small, 4096), b"ERROR") == ref_grep(small, "ERROR")
    assert ref_grep_literal_stream(read_chunks(small), b"ERROR") == ref_grep(small, "ERROR")


def _mkfs_and_mount(device_or_image: str, mnt: Path, extra_mount: List[str]) -> None:
    subprocess.run(["mkfs.ext4", "-q", "-F", device_or_image], check=True, capture_output=True)
    mnt.mkdir(exist_ok=True)
    subprocess.run(["mount", *extra_mount, device_or_image, str(mnt)], check=True, capture_output=True)


def _check_device_mapping(mnt: Path) -> None:
    rng = random.Random("mapping")
    a = write_file(mnt / "a.log", text_bytes((3 << 20) + 11, rng))
    write_fragmented(mnt / "b.log", mnt / "c.bin", 80, rng)
    for p in (a, mnt / "b.log", mnt / "c.bin"):
        assert exec_json("sha256", [p])["results"][0]["value"] == ref_checksum("sha256", p)
    r = exec_json("sort", [a])["results"][0]
    assert Path(r["output"]).read_bytes() == ref_sort(a)


def test_file_system_at_an_offset_in_the_image(workdir):
    """`mount -o loop,offset=N`: the loop offset is added to every sector."""
    image, mnt = workdir / "offset.img", workdir / "mnt-offset"
    with open(image, "wb") as f:
        f.truncate(128 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "offset=1048576", str(image), "100M"], check=True, capture_output=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop,offset=1048576", str(image), str(mnt)], check=True, capture_output=True)
    try:
        _check_device_mapping(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
        image.unlink()


def test_file_system_in_a_partition_of_a_loop_device(workdir):
    """A partition of a partitioned loop device: the partition start is added too."""
    image, mnt = workdir / "part.img", workdir / "mnt-part"
    with open(image, "wb") as f:
        f.truncate(96 << 20)
        start = 6144  # sectors: 3 MiB
        count = (96 << 20) // 512 - start - 100
        f.seek(0x1BE)
        f.write(bytes([0, 0, 0, 0, 0x83, 0, 0, 0]) + struct.pack("<II", start, count))
        f.seek(510)
        f.write(b"\x55\xaa")
    loop = subprocess.run(["losetup", "-f", "--show", "-P", str(image)], capture_output=True, text=True, check=True).stdout.strip()
    try:
        part = loop + "p1"
        if not os.path.exists(part):
            subprocess.run(["partx", "-a", loop], capture_output=True)
        if not os.path.exists(part):
            pytest.skip("the kernel did not create the partition device")
        _mkfs_and_mount(part, mnt, [])
        try:
            _check_device_mapping(mnt)
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
    finally:
        subprocess.run(["losetup", "-d", loop], check=True)
        image.unlink()

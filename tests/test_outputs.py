# SPDX-License-Identifier: Apache-2.0
"""Functions that write a result file (zstd, sort, csv-select): where outputs land, their
exact length, refusal to replace without --force, and that the host never reads stale
blocks after the target wrote them behind the file system's back.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

import insitu
from helpers import (
    INSITU,
    cli_error,
    csv_select_oracle,
    exec_args,
    exec_json,
    ref_sort,
    text_bytes,
    write_file,
    zstd_decompress,
)

SUFFIX = {"zstd": ".zst", "sort": ".sorted", "csv-select": ".select.csv"}
WHERE = {"where": "amount>=50;country!=FR", "columns": "id,amount,note"}


def csv_bytes(rng: random.Random, rows: int, tag: str = "") -> bytes:
    out = [b"id,country,amount,note\n"]
    for i in range(rows):
        note = rng.choice([b"plain", b'"with, comma"', b'"q""uote"', tag.encode() or b"t"])
        out.append(b"%d,%s,%d,%s\n" % (i, rng.choice([b"DE", b"FR", b"US"]), rng.randrange(100), note))
    return b"".join(out)


def expected(function: str, src: Path) -> bytes:
    """The independent expectation for an output: decompressed input for zstd."""
    if function == "zstd":
        return src.read_bytes()
    if function == "sort":
        return ref_sort(src)
    return csv_select_oracle(src.read_bytes(), WHERE["where"], WHERE["columns"])[0]


def check_output(function: str, src: Path, result: dict, dest: Path) -> None:
    assert result["output"] == str(dest)
    assert dest.stat().st_size == result["output_length"], "output not truncated to output_length"
    got = zstd_decompress(dest) if function == "zstd" else dest.read_bytes()
    assert got == expected(function, src)


def fargs(function: str) -> dict:
    return dict(WHERE) if function == "csv-select" else {}


def pool_dir(fs) -> Path:
    return fs.mnt / ".insitu" / "pool"


def taken(fs):
    d = pool_dir(fs)
    return sorted(p.name for p in d.iterdir() if p.name.startswith("taken-")) if d.exists() else []


@pytest.mark.parametrize("function", list(SUFFIX))
def test_default_output_paths(tdir, any_fs, function):
    rng = random.Random(function)
    src = write_file(tdir / "in.csv", csv_bytes(rng, 30_000))
    off = exec_json(function, [src], fargs(function))["results"][0]
    check_output(function, src, off, Path(f"{src}{SUFFIX[function]}"))
    conv = exec_json(function, [src], fargs(function), conventional=True)["results"][0]
    check_output(function, src, conv, Path(f"{src}{SUFFIX[function]}.host"))
    assert off["output_length"] == conv["output_length"]
    # Both files are there, plus the input; nothing else was left next to them.
    assert sorted(p.name for p in tdir.iterdir()) == sorted(["in.csv", f"in.csv{SUFFIX[function]}", f"in.csv{SUFFIX[function]}.host"])
    assert taken(any_fs) == []
    # Outputs are far smaller than a pool file (1 MiB at least): they were truncated.
    small = exec_json(function, [write_file(tdir / "small.csv", csv_bytes(rng, 3))], fargs(function))["results"][0]
    assert Path(small["output"]).stat().st_size == small["output_length"] < 4096


def test_several_inputs_get_their_own_outputs(tdir, any_fs):
    rng = random.Random("several")
    srcs = [write_file(tdir / f"f{i}.log", text_bytes(rng.randrange(1, 3 << 20), rng)) for i in range(7)]
    for function in ("zstd", "sort"):
        for conventional in (False, True):
            doc = exec_json(function, srcs, conventional=conventional)
            for src, r in zip(srcs, doc["results"]):
                dest = Path(f"{src}{SUFFIX[function]}{'.host' if conventional else ''}")
                check_output(function, src, r, dest)
    assert taken(any_fs) == []


def test_output_option_and_relative_paths(tdir):
    rng = random.Random("relative")
    src = write_file(tdir / "in.log", text_bytes(500_000, rng))
    sub = tdir / "results"
    sub.mkdir()
    r = exec_json("sort", [src], output=sub / "sorted.txt")["results"][0]
    check_output("sort", src, r, sub / "sorted.txt")
    # Relative input and output, resolved from the working directory.
    cp = subprocess.run([INSITU, "exec", "zstd", "in.log", "-o", "results/rel.zst", "--json"], cwd=tdir, capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    assert zstd_decompress(sub / "rel.zst") == src.read_bytes()
    cp = subprocess.run([INSITU, "exec", "sort", "in.log", "--json"], cwd=tdir, capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    assert (tdir / "in.log.sorted").read_bytes() == ref_sort(src)


@pytest.mark.parametrize("function", list(SUFFIX))
@pytest.mark.parametrize("conventional", [False, True], ids=["offload", "conventional"])
def test_existing_output_is_refused_and_left_alone(tdir, any_fs, function, conventional):
    rng = random.Random("exists")
    a = write_file(tdir / "a.csv", csv_bytes(rng, 2000))
    b = write_file(tdir / "b.csv", csv_bytes(rng, 2000))
    suffix = SUFFIX[function] + (".host" if conventional else "")
    # The second input's default output exists: the whole command is refused before any
    # data is read, so not even the first input's output appears.
    existing = Path(f"{b}{suffix}")
    existing.write_bytes(b"precious, do not overwrite\n")
    before = existing.stat()
    msg = cli_error(*exec_args(function, [a, b], fargs(function), conventional=conventional))
    assert "exists" in msg and "--force" in msg and str(existing) in msg
    assert existing.read_bytes() == b"precious, do not overwrite\n"
    assert (existing.stat().st_ino, existing.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert not Path(f"{a}{suffix}").exists()
    # The same with --output, and from Python.
    dest = tdir / "explicit.out"
    dest.write_bytes(b"keep me")
    msg = cli_error(*exec_args(function, [a], fargs(function), conventional=conventional, output=dest))
    assert "exists" in msg
    with pytest.raises(insitu.RequestError, match="exists"):
        insitu.exec(function, [str(a)], conventional=conventional, output=str(dest), **fargs(function))
    assert dest.read_bytes() == b"keep me"
    assert taken(any_fs) == []
    # --force replaces both.
    r = exec_json(function, [a], fargs(function), conventional=conventional, output=dest, force=True)["results"][0]
    check_output(function, a, r, dest)
    doc = exec_json(function, [a, b], fargs(function), conventional=conventional, force=True)
    check_output(function, b, doc["results"][1], existing)


@pytest.mark.parametrize("function", list(SUFFIX))
def test_forced_rerun_on_changed_input_never_reads_stale_data(tdir, any_fs, function):
    """Run, read the result (so its pages are cached), change the input (same size, then
    shorter, then longer), run again with --force: the host must see the new result every
    time, with no tail of an older, longer one."""
    rng = random.Random("stale-" + function)
    src = tdir / "in.csv"
    dest = tdir / "out"
    sizes = [20_000, 20_000, 3_000, 60_000, 10]
    previous = None
    for rows in sizes:
        write_file(src, csv_bytes(rng, rows, tag=f"v{rows}-{rng.random()}"))
        for conventional in (False, True):
            out = dest.with_suffix(".host" if conventional else ".off")
            r = exec_json(function, [src], fargs(function), conventional=conventional, output=out, force=True)["results"][0]
            check_output(function, src, r, out)
            # Keep the file's pages in the page cache and open, as a reader would.
            with open(out, "rb") as f:
                f.read()
        current = expected(function, src)
        assert current != previous
        previous = current
    assert taken(any_fs) == []


@pytest.mark.parametrize("conventional", [False, True], ids=["offload", "conventional"])
def test_sort_in_place(tdir, conventional):
    src = write_file(tdir / "data.log", text_bytes(3 << 20, random.Random("inplace")))
    want = ref_sort(src)
    r = exec_json("sort", [src], output=src, force=True, conventional=conventional)["results"][0]
    assert r["output_length"] == len(want)
    assert src.read_bytes() == want


def test_offloaded_output_must_be_on_the_input_file_system(ext4_fs, xfs_fs, rootfs_dir):
    src = write_file(ext4_fs.mkdir("cross-fs") / "in.log", text_bytes(200_000, random.Random("x")))
    for elsewhere in (xfs_fs.mkdir("cross-fs-out") / "out.zst", rootfs_dir / "out.zst"):
        msg = cli_error(*exec_args("zstd", [src], output=elsewhere))
        assert "same file system" in msg and "--conventional" in msg
        assert not elsewhere.exists()
        exec_json("zstd", [src], output=elsewhere, conventional=True)
        assert zstd_decompress(elsewhere) == src.read_bytes()


def test_failed_offload_leaves_no_output_and_the_pool_is_reused(tdir, any_fs):
    bad = write_file(tdir / "bad.csv", b"a,b\n" + b"1,2\n" * 50_000 + b"3\n")
    msg = cli_error(*exec_args("csv-select", [bad]))
    assert "has 1 fields but the header has 2" in msg
    assert not Path(f"{bad}.select.csv").exists()
    assert taken(any_fs) == []
    free = [p for p in pool_dir(any_fs).iterdir() if p.name.startswith("free-")]
    assert free, "the pool file of the failed command was not returned to the pool"
    # The next commands reuse free pool files; their (old) contents must never show.
    rng = random.Random("reuse")
    for i in range(3):
        good = write_file(tdir / f"good{i}.csv", csv_bytes(rng, 200 * (i + 1)))
        r = exec_json("csv-select", [good], WHERE)["results"][0]
        check_output("csv-select", good, r, Path(f"{good}.select.csv"))
        s = exec_json("sort", [good])["results"][0]
        check_output("sort", good, s, Path(f"{good}.sorted"))
    assert taken(any_fs) == []


def test_python_api_writes_outputs(tdir):
    src = write_file(tdir / "in.csv", csv_bytes(random.Random("py"), 5000))
    r = insitu.exec("csv-select", src, **WHERE)
    check_output("csv-select", src, r["results"][0], Path(f"{src}.select.csv"))
    r = insitu.exec("zstd", [src], output=tdir / "x.zst", level=7)
    check_output("zstd", src, r["results"][0], tdir / "x.zst")
    r = insitu.exec("zstd", [src], output=tdir / "x.zst", force=True, conventional=True, level=1)
    check_output("zstd", src, r["results"][0], tdir / "x.zst")


def test_csv_select_repeated_columns_offloaded_like_conventional(tdir):
    data = b"a\n" + b"x" * 100 + b"\n" + (b"y" * 100 + b"\n") * 20_000
    src = write_file(tdir / "rep.csv", data)
    want = csv_select_oracle(data, None, "a,a,a")[0]
    conv = exec_json("csv-select", [src], {"columns": "a,a,a"}, conventional=True)["results"][0]
    assert Path(conv["output"]).read_bytes() == want
    off = exec_json("csv-select", [src], {"columns": "a,a,a"})["results"][0]
    assert Path(off["output"]).read_bytes() == want

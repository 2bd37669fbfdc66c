# SPDX-License-Identifier: Apache-2.0
"""Errors of the command line: exit code 2, one message on stderr and as {"error": ...}
with --json, saying what is wrong and what to do; nothing written when a request is
refused.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

import insitu

from helpers import cli_error, cli_json, exec_args, exec_json, ref_checksum, run_cli, text_bytes, write_file


@pytest.fixture
def on_fs(ext4_fs, request) -> Path:
    d = ext4_fs.mkdir(request.node.name)
    write_file(d / "a.log", text_bytes(100_000, random.Random("a")))
    write_file(d / "b.log", text_bytes(100_000, random.Random("b")))
    return d


def test_file_not_on_a_loop_device(rootfs_dir):
    p = write_file(rootfs_dir / "plain.log", b"hello ERROR world\n" * 1000)
    for function in ("crc32c", "grep", "zstd"):
        args = {"pattern": "ERROR"} if function == "grep" else {}
        msg = cli_error(*exec_args(function, [p], args))
        assert "not a loop device" in msg and "--conventional" in msg and str(p) in msg
    assert not Path(f"{p}.zst").exists()
    for function in ("crc32c", "sha256", "blake3", "xxh3"):
        doc = exec_json(function, [p], conventional=True)
        assert doc["results"][0]["value"] == ref_checksum(function, p)
        assert doc["stats"]["bytes_to_host"] >= p.stat().st_size
    doc = exec_json("zstd", [p], conventional=True)
    assert Path(doc["results"][0]["output"]) == Path(f"{p}.zst.host")
    msg = cli_error("grep", "ERROR", p)
    assert "not a loop device" in msg
    assert cli_json("grep", "ERROR", p, "--conventional")["results"][0]["count"] == 1000


def test_unknown_function(on_fs):
    msg = cli_error("exec", "sha1", on_fs / "a.log")
    assert '"sha1"' in msg
    for name in ("crc32c", "xxh3", "sha256", "blake3", "md5", "grep", "wc", "zstd", "rs-encode", "sort", "csv-select"):
        assert name in msg, "the message should list the available functions"


@pytest.mark.parametrize(
    "function,arg,words",
    [
        ("zstd", "level=abc", ["level", "abc", "unsigned integer"]),
        ("zstd", "level=-3", ["level", "unsigned integer"]),
        ("zstd", "level=0", ["level", "1..=19"]),
        ("zstd", "level=20", ["level", "1..=19"]),
        ("grep", "regex=maybe", ["regex", "true or false"]),
        ("zstd", "lvl=3", ["lvl", "unknown argument", "level"]),
        ("crc32c", "seed=1", ["seed", "unknown argument"]),
        ("zstd", "level", ["key=value"]),
        ("csv-select", "where=amount", ["no operator"]),
        ("csv-select", "where=a!b", ["'!' must be followed by '='"]),
        ("csv-select", "where==3", ["no column name"]),
        ("csv-select", "columns=a,,b", ["empty column"]),
    ],
)
def test_bad_arguments(on_fs, function, arg, words):
    argv = ["exec", function, on_fs / "a.log", "--arg", arg]
    if function == "grep":
        argv += ["--arg", "pattern=x"]
    msg = cli_error(*argv)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    assert sorted(p.name for p in on_fs.iterdir()) == ["a.log", "b.log"], "a refused request wrote something"


def test_argument_given_twice(on_fs):
    msg = cli_error("exec", "zstd", on_fs / "a.log", "--arg", "level=3", "--arg", "level=4")
    assert "twice" in msg


@pytest.mark.parametrize("pattern", ["(", "[a-", "a{2,1}", "a)", "*x"])
def test_bad_regex(on_fs, pattern):
    msg = cli_error("exec", "grep", on_fs / "a.log", "--arg", f"pattern={pattern}", "--arg", "regex=true")
    assert "regex" in msg
    assert "regex" in cli_error("grep", "-E", pattern, on_fs / "a.log")
    # The same text as a literal is fine.
    assert exec_json("grep", [on_fs / "a.log"], {"pattern": pattern})["results"][0]["count"] == 0


def test_missing_pattern_and_newline_in_pattern(on_fs):
    assert "pattern" in cli_error("exec", "grep", on_fs / "a.log")
    assert "pattern" in cli_error("exec", "grep", on_fs / "a.log", "--arg", "pattern=a\nb")


def test_missing_file(on_fs):
    missing = on_fs / "nope.log"
    for argv in (["exec", "crc32c", on_fs / "a.log", missing], ["exec", "crc32c", missing, "--conventional"], ["wc", missing]):
        msg = cli_error(*argv)
        assert str(missing) in msg and "No such file" in msg
    # Refused before anything is written for the inputs that do exist.
    cli_error("exec", "zstd", on_fs / "a.log", missing)
    assert not (on_fs / "a.log.zst").exists()


def test_directory_as_input(on_fs):
    for extra in ([], ["--conventional"]):
        msg = cli_error("exec", "sha256", on_fs, *extra)
        assert "not a regular file" in msg and str(on_fs) in msg


def test_output_needs_exactly_one_input(on_fs):
    msg = cli_error("exec", "zstd", on_fs / "a.log", on_fs / "b.log", "--output", on_fs / "x.zst")
    assert "--output needs exactly one input" in msg
    assert not (on_fs / "x.zst").exists()
    msg = cli_error("exec", "crc32c", on_fs / "a.log", "--output", on_fs / "x")
    assert "takes no --output" in msg


def test_output_directory_missing(on_fs):
    msg = cli_error("exec", "sort", on_fs / "a.log", "--output", on_fs / "no" / "such" / "dir" / "out")
    assert "no/such/dir" in msg


def test_usage_errors_exit_2_without_running(on_fs):
    for argv in (["exec"], ["exec", "crc32c"], ["frobnicate"], ["exec", "crc32c", on_fs / "a.log", "--bogus"]):
        r = run_cli(*argv, json_out=False)
        assert r.rc == 2, argv
        assert "Usage" in r.stderr or "usage" in r.stderr
    assert run_cli("--help", json_out=False).rc == 0
    assert run_cli("--version", json_out=False).stdout.startswith("insitu ")


def test_image_errors(workdir):
    small = workdir / "too-small-xfs.img"
    msg = cli_error("image", "create", small, "--size", "100M", "--fs", "xfs")
    assert "300 MiB" in msg
    assert not small.exists()
    existing = write_file(workdir / "existing.img", b"not an image")
    msg = cli_error("image", "create", existing, "--size", "64M")
    assert "exists" in msg and "--force" in msg
    assert existing.read_bytes() == b"not an image"
    assert "size" in cli_error("image", "create", workdir / "bad-size.img", "--size", "lots")
    assert "mount" in cli_error("image", "mount", existing, workdir / "mnt-bad")


def test_target_errors_carry_the_status(on_fs):
    bad = write_file(on_fs / "bad.csv", b"a,b\n1,2\n3\n")
    msg = cli_error("exec", "csv-select", bad)
    assert "Function Failed" in msg and "has 1 fields but the header has 2" in msg
    # Conventionally, the same kernel fails the same way.
    assert "has 1 fields but the header has 2" in cli_error("exec", "csv-select", bad, "--conventional")
    assert "no column" in cli_error("exec", "csv-select", on_fs / "a.log", "--arg", "columns=zzz", "--force")


def test_inline_data_is_refused_with_advice(workdir):
    """ext4 with inline_data keeps small files in the inode: not readable as blocks."""
    image, mnt = workdir / "inline.img", workdir / "mnt-inline"
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "inline_data", str(image)], check=True)
    cli_json("image", "mount", image, mnt)
    try:
        p = write_file(mnt / "small.txt", b"hello inline\n")
        msg = cli_error("exec", "crc32c", p)
        assert "inline" in msg and "--conventional" in msg
        with pytest.raises(insitu.NotOffloadableError, match="inline"):
            insitu.checksum(str(p))
        assert exec_json("crc32c", [p], conventional=True)["results"][0]["value"] == ref_checksum("crc32c", p)
        # A file too large to be inline on the same file system offloads normally.
        big = write_file(mnt / "big.txt", b"x" * 100_000)
        assert exec_json("crc32c", [big])["results"][0]["value"] == ref_checksum("crc32c", big)
    finally:
        cli_json("image", "umount", mnt)
        image.unlink()

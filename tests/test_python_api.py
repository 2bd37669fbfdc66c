# SPDX-License-Identifier: Apache-2.0
"""The Python package: the same documents as the command line, the helpers, the exception
classes, and the descriptor decoder against the shared test vectors."""

from __future__ import annotations

import concurrent.futures
import json
import random
from pathlib import Path

import pytest

import insitu
from helpers import (
    CHECKSUMS,
    ROOT,
    cli_json,
    exec_json,
    ref_checksum,
    ref_grep,
    ref_wc,
    text_bytes,
    write_file,
)
from insitu import _native

VECTORS = ROOT / "docs" / "vectors"


@pytest.fixture
def files(tdir):
    rng = random.Random("py")
    return [write_file(tdir / f"f{i}.log", text_bytes(n, rng)) for i, n in enumerate([0, 1, 4097, 1 << 20, (3 << 20) + 5])]


def strip_stats(doc):
    return {k: v for k, v in doc.items() if k != "stats"}


@pytest.mark.parametrize("function", CHECKSUMS)
def test_exec_returns_the_cli_document(files, function):
    for conventional in (False, True):
        py = insitu.exec(function, [str(p) for p in files], conventional=conventional)
        cli = exec_json(function, files, conventional=conventional)
        assert strip_stats(py) == strip_stats(cli)
        assert set(py["stats"]) == {"bytes_to_host", "bytes_from_host", "media_bytes", "seconds", "commands"}
        assert [r["value"] for r in py["results"]] == [ref_checksum(function, p) for p in files]


def test_helpers(files):
    big = files[-1]
    assert insitu.checksum(big)["results"][0]["value"] == ref_checksum("crc32c", big)
    assert insitu.checksum([big], function="blake3")["results"][0]["value"] == ref_checksum("blake3", big)
    r = insitu.grep("status=5[0-9]+", big, regex=True, ignore_case=True)["results"][0]
    assert (r["count"], r["matches"]) == ref_grep(big, "status=5[0-9]+", regex=True, ignore_case=True)
    r = insitu.grep("ERROR", [big], max_matches=3)["results"][0]
    count, matches = ref_grep(big, "ERROR")
    assert (r["count"], r["matches"], r["truncated"]) == (count, matches[:3], True)
    docs = insitu.wc(files)
    assert [(r["lines"], r["words"], r["bytes"]) for r in docs["results"]] == [ref_wc(p) for p in files]
    conv = insitu.wc(files, conventional=True)
    assert conv["results"] == docs["results"] and conv["mode"] == "conventional"
    # Paths may be str, PathLike, or an iterable of either.
    assert insitu.exec("xxh3", (p for p in files))["results"] == insitu.exec("xxh3", [str(p) for p in files])["results"]


def test_functions_list():
    fns = insitu.functions()
    assert fns == cli_json("functions")
    by_name = {f["name"]: f for f in fns}
    assert set(by_name) == {
        "crc32c",
        "xxh3",
        "sha256",
        "blake3",
        "md5",
        "grep",
        "wc",
        "zstd",
        "rs-encode",
        "sort",
        "csv-select",
        "csv-select-piece",
        "count",
        "vector-add",
        "array-merge",
        "pagerank",
    }
    assert {a["key"]: a["type"] for a in by_name["grep"]["args"]}.keys() == {"pattern", "regex", "ignore_case", "max_matches", "edges", "edge_limit"}
    assert [a["required"] for a in by_name["grep"]["args"] if a["key"] == "pattern"] == [True]
    assert {f["name"] for f in fns if f["outputs"] == 1} == {"zstd", "rs-encode", "sort", "csv-select", "vector-add", "array-merge", "pagerank"}


def test_exception_classes():
    assert issubclass(insitu.InsituError, Exception)
    for cls in (insitu.RequestError, insitu.NotOffloadableError, insitu.TargetError, insitu.StorageIOError):
        assert issubclass(cls, insitu.InsituError)
        assert cls.__module__ == "insitu"
    assert len({insitu.RequestError, insitu.NotOffloadableError, insitu.TargetError, insitu.StorageIOError}) == 4
    assert not issubclass(insitu.RequestError, insitu.TargetError)


def test_request_errors(files, tdir):
    f = str(files[2])
    cases = [
        (lambda: insitu.exec("sha1", f), "unknown function"),
        (lambda: insitu.exec("zstd", f, level="abc"), "not an unsigned integer"),
        (lambda: insitu.exec("zstd", f, level=42), "1..=19"),
        (lambda: insitu.exec("zstd", f, speed=1), "unknown argument"),
        (lambda: insitu.grep("(", f, regex=True), "regex"),
        (lambda: insitu.exec("grep", f), "pattern"),
        (lambda: insitu.exec("crc32c", str(tdir)), "not a regular file"),
        (lambda: insitu.exec("crc32c", []), "no input files"),
        (lambda: insitu.exec("zstd", [f, str(files[3])], output=str(tdir / "x.zst")), "exactly one input"),
        (lambda: insitu.exec("crc32c", f, output=str(tdir / "x")), "no --output"),
        (lambda: insitu.exec("csv-select", f, where="nothing"), "no operator"),
        (lambda: insitu.exec("crc32c", str(tdir / "missing.log")), "No such file"),
    ]
    for call, words in cases:
        with pytest.raises(insitu.RequestError, match=words.replace(".", r"\.")):
            call()
    assert not (tdir / "x.zst").exists()


def test_not_offloadable(rootfs_dir):
    p = write_file(rootfs_dir / "py-plain.log", b"abc\n" * 100)
    with pytest.raises(insitu.NotOffloadableError, match="not a loop device") as e:
        insitu.checksum(str(p))
    assert "--conventional" in str(e.value)
    assert isinstance(e.value, insitu.InsituError)
    assert insitu.checksum(str(p), conventional=True)["results"][0]["value"] == ref_checksum("crc32c", p)


def test_target_errors(tdir):
    bad = write_file(tdir / "bad.csv", b"a,b\n1,2\n3\n")
    with pytest.raises(insitu.TargetError, match="has 1 fields") as e:
        insitu.exec("csv-select", bad)
    assert "Function Failed" in str(e.value)
    # On the host the kernel fails the same way, but that is a bad request, not a target.
    with pytest.raises(insitu.RequestError, match="has 1 fields"):
        insitu.exec("csv-select", bad, conventional=True)
    # More matches than the 16 MiB inline result holds: the target refuses the result.
    many = write_file(tdir / "many.txt", b"a\n" * 1_100_000)
    with pytest.raises(insitu.TargetError, match="Inline Result Too Large"):
        insitu.grep("a", many, max_matches=2_000_000)
    r = insitu.grep("a", many, max_matches=10)["results"][0]
    assert (r["count"], r["truncated"], len(r["matches"])) == (1_100_000, True, 10)


def test_output_in_a_missing_directory(tdir, files):
    with pytest.raises(insitu.InsituError, match="no-such-dir"):
        insitu.exec("sort", files[2], output=str(tdir / "no-such-dir" / "out"))


def test_concurrent_calls_from_threads(any_fs):
    """The package releases the GIL and shares one host library: threads calling it at
    once all get the right answers."""
    d = any_fs.mkdir("threads")
    rng = random.Random("threads")
    paths = [write_file(d / f"t{i}.bin", rng.randbytes(rng.randrange(1, 2 << 20))) for i in range(12)]
    want = {p: ref_checksum("sha256", p) for p in paths}

    def one(p):
        return insitu.checksum(str(p), function="sha256")["results"][0]["value"]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = dict(zip(paths * 3, pool.map(one, paths * 3)))
    assert got == want


def _vectors():
    if not (VECTORS / "vectors.json").exists():
        return []
    return [v for v in json.loads((VECTORS / "vectors.json").read_text()) if v["kind"] == "descriptor"]


@pytest.mark.skipif(not (VECTORS / "vectors.json").exists(), reason="docs/vectors/vectors.json is not there")
@pytest.mark.parametrize("vector", _vectors(), ids=lambda v: v["name"])
def test_descriptor_vectors(vector):
    data = bytes.fromhex("".join((VECTORS / vector["file"]).read_text().split()))
    if vector["valid"]:
        assert json.loads(_native.decode_descriptor(data)) == vector["descriptor"]
    else:
        with pytest.raises(insitu.RequestError) as e:
            _native.decode_descriptor(data)
        assert vector["error"] in str(e.value)


@pytest.mark.skipif(not (VECTORS / "vectors.json").exists(), reason="docs/vectors/vectors.json is not there")
def test_vectors_cover_valid_and_invalid_descriptors():
    vs = _vectors()
    assert any(v["valid"] for v in vs) and any(not v["valid"] for v in vs)
    for v in vs:
        assert (VECTORS / v["file"]).exists(), v["file"]


def test_image_replaced_under_the_same_path(workdir):
    """A long-lived process (this one) keeps targets open per image. When an image is
    unmounted, deleted and a new one made at the same path, offloads must read the new
    image, not the deleted one the old target still holds."""
    image, mnt = workdir / "replaced.img", workdir / "mnt-replaced"
    rng = random.Random("replaced")
    try:
        for round_ in range(3):
            if image.exists():
                image.unlink()
            cli_json("image", "create", image, "--size", "64M", "--fs", "ext4")
            cli_json("image", "mount", image, mnt)
            p = write_file(mnt / "f.bin", rng.randbytes((1 << 20) + round_))
            assert insitu.checksum(str(p), function="sha256")["results"][0]["value"] == ref_checksum("sha256", p), f"round {round_}"
            r = insitu.exec("sort", p)["results"][0]
            assert Path(r["output"]).stat().st_size == r["output_length"]
            cli_json("image", "umount", mnt)
    finally:
        if mnt.is_mount():
            cli_json("image", "umount", mnt)

# SPDX-License-Identifier: Apache-2.0
"""Bitrot scrubbing: record a manifest, verify it clean, then corrupt a file *behind the
file system* (bytes written straight into the image at the file's physical offset, found
with FIEMAP), delete another, add a third, and check that exactly those are reported.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import insitu
from helpers import (
    cli_error,
    cli_json,
    corrupt_behind_fs,
    fiemap,
    ref_checksum,
    run_cli,
    text_bytes,
    write_file,
    write_fragmented,
    write_sparse,
)


def populate(d: Path, rng: random.Random) -> dict:
    """A small tree: nested directories, odd sizes, a fragmented pair, a sparse file, an
    empty file, names with spaces and non-ASCII characters."""
    (d / "logs" / "old").mkdir(parents=True)
    (d / "bin").mkdir()
    files = {
        "logs/app.log": text_bytes(2 << 20, rng),
        "logs/old/2025 archive.log": text_bytes(300_001, rng),
        "bin/blob.bin": rng.randbytes(1_500_000),
        "bin/tiny": b"x",
        "bin/empty": b"",
        "données/été.txt": text_bytes(4097, rng),
    }
    (d / "données").mkdir()
    for rel, data in files.items():
        write_file(d / rel, data)
    write_fragmented(d / "logs" / "frag-a.log", d / "bin" / "frag-b.bin", 150, rng)
    write_sparse(d / "bin" / "sparse.log", rng)
    return {rel: d / rel for rel in [*files, "logs/frag-a.log", "bin/frag-b.bin", "bin/sparse.log"]}


def scrub(d: Path, manifest: Path, *extra, rc: int = 0) -> dict:
    r = run_cli("scrub", d, "--manifest", manifest, *extra)
    assert r.rc == rc, f"scrub exited {r.rc}, expected {rc}: {r.stderr}"
    return r.doc


def test_create_verify_corrupt_delete_add(tdir, any_fs, workdir):
    rng = random.Random(f"scrub-{any_fs.name}")
    files = populate(tdir, rng)
    manifest = workdir / f"manifest-{any_fs.name}.json"
    created = scrub(tdir, manifest, "--create")
    assert created["checked"] == len(files)
    m = json.loads(manifest.read_text())
    assert m["function"] == "blake3"
    assert sorted(m["files"]) == sorted(files)
    for rel, p in files.items():
        assert m["files"][rel] == {"size": p.stat().st_size, "digest": ref_checksum("blake3", p)}

    clean = scrub(tdir, manifest)
    assert (clean["checked"], clean["corrupted"], clean["missing"], clean["new"]) == (len(files), [], [], [])
    dense = sum(p.stat().st_size for rel, p in files.items() if rel != "bin/sparse.log")
    assert clean["stats"]["media_bytes"] >= dense
    assert clean["stats"]["bytes_to_host"] < dense / 100

    # Corrupt the fragmented file in a later extent, and the sparse file in its second
    # data island, by writing into the image directly.
    frag = files["logs/frag-a.log"]
    ext = fiemap(frag)
    assert len(ext) >= 2
    target = ext[len(ext) // 2]
    before_frag = ref_checksum("sha256", frag)
    corrupt_behind_fs(frag, target.logical + 100, 16)
    sparse = files["bin/sparse.log"]
    corrupt_behind_fs(sparse, (3 << 20) + 10, 8)
    # The corruption is real: reading through the file system (caches dropped) sees it.
    assert ref_checksum("sha256", frag) != before_frag
    files["logs/app.log"].unlink()
    write_file(tdir / "logs" / "new.log", b"new file\n")

    for mode in ([], ["--conventional"]):
        rep = scrub(tdir, manifest, *mode, rc=1)
        assert rep["corrupted"] == ["bin/sparse.log", "logs/frag-a.log"]
        assert rep["missing"] == ["logs/app.log"]
        assert rep["new"] == ["logs/new.log"]
        assert rep["checked"] == len(files) - 1
    text = run_cli("scrub", tdir, "--manifest", manifest, json_out=False)
    assert text.rc == 1
    assert "CORRUPTED logs/frag-a.log" in text.stdout and "MISSING   logs/app.log" in text.stdout


def test_corruption_in_a_file_on_its_first_and_last_byte(tdir, any_fs, workdir):
    rng = random.Random("edges")
    a = write_file(tdir / "a.bin", rng.randbytes(100_000))
    b = write_file(tdir / "b.bin", rng.randbytes(4097))
    c = write_file(tdir / "c.bin", rng.randbytes(4097))
    manifest = workdir / f"edges-{any_fs.name}.json"
    scrub(tdir, manifest, "--create", "--function", "crc32c")
    corrupt_behind_fs(a, 0, 1)
    corrupt_behind_fs(b, 4096, 1)  # the last byte, alone in its block
    rep = scrub(tdir, manifest, rc=1)
    assert rep["corrupted"] == ["a.bin", "b.bin"]  # not c.bin, identical in shape to b.bin
    assert ref_checksum("crc32c", c) == json.loads(manifest.read_text())["files"]["c.bin"]["digest"]


@pytest.mark.parametrize("function", ["crc32c", "xxh3", "sha256", "blake3"])
def test_manifest_digests_are_the_functions_digests(tdir, any_fs, workdir, function):
    rng = random.Random(function)
    paths = [write_file(tdir / f"f{i}", text_bytes(rng.randrange(0, 200_000), rng)) for i in range(5)]
    manifest = tdir / "manifest.json"  # inside the scrubbed tree: it must not scrub itself
    doc = scrub(tdir, manifest, "--create", "--function", function)
    assert doc["checked"] == len(paths)
    m = json.loads(manifest.read_text())
    assert m["function"] == function
    assert {k: v["digest"] for k, v in m["files"].items()} == {p.name: ref_checksum(function, p) for p in paths}
    # The pool of an output-producing command is not scrubbed either.
    cli_json("exec", "zstd", paths[0])
    rep = scrub(tdir, manifest)
    assert rep["new"] == ["f0.zst"] and rep["corrupted"] == [] and rep["missing"] == []
    # Changing a file through the file system is detected too.
    with open(paths[1], "ab") as f:
        f.write(b"!")
    rep = scrub(tdir, manifest, rc=1)
    assert rep["corrupted"] == ["f1"]


def test_python_scrub(tdir, any_fs, workdir):
    rng = random.Random("py-scrub")
    files = populate(tdir, rng)
    manifest = workdir / f"py-{any_fs.name}.json"
    rep = insitu.scrub(str(tdir), str(manifest), create=True, function="sha256")
    assert rep["checked"] == len(files)
    rep = insitu.scrub(tdir, manifest)
    assert (rep["corrupted"], rep["missing"], rep["new"]) == ([], [], [])
    corrupt_behind_fs(files["bin/blob.bin"], 1_000_000, 4)
    rep = insitu.scrub(tdir, manifest)
    assert rep["corrupted"] == ["bin/blob.bin"]
    rep = insitu.scrub(tdir, manifest, conventional=True)
    assert rep["corrupted"] == ["bin/blob.bin"]


def test_bad_manifests(tdir, workdir):
    write_file(tdir / "f", b"data")
    missing = workdir / "no-such-manifest.json"
    msg = cli_error("scrub", tdir, "--manifest", missing)
    assert str(missing) in msg
    junk = write_file(workdir / "junk.json", b"{not json")
    msg = cli_error("scrub", tdir, "--manifest", junk)
    assert "not an insitu scrub manifest" in msg
    v2 = write_file(workdir / "v2.json", json.dumps({"version": 2, "function": "crc32c", "files": {}}).encode())
    assert "version 2" in cli_error("scrub", tdir, "--manifest", v2)
    with pytest.raises(insitu.RequestError):
        insitu.scrub(tdir, junk)

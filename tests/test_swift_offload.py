# SPDX-License-Identifier: Apache-2.0
"""Offload on erasure-coded Swift objects: wc and grep equal the standard tools on the
downloaded object for data cut at every fragment and segment edge, healthy and with M
targets stopped; scrub finds a flipped byte, quarantines it as the auditor does, and Swift's
reconstructor restores it; bad input gets a clear error and changes nothing stored."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from swift_fixture import INSITU, swift_cluster  # noqa: F401  (the fixture)

SWIFT_EC = "3+2"
SWIFT_SEGMENT_SIZE = "3K"
SEGMENT = 3072
FRAG = SEGMENT // 3  # 1024: every fragment edge is a multiple of it

C_LOCALE = {**os.environ, "LC_ALL": "C"}


def edgy(length: int, seed: int) -> bytes:
    """Text whose records are cut at every fragment and segment edge: a newline, a CRLF cut
    between CR and LF, a multi-byte UTF-8 character and a word each straddle edges."""
    rng = random.Random(seed)
    pieces = [b"ab", b"a", b" ", b"\n", b"\r\n", b"\xc3\xa9", b"\xe2\x82\xac", b"\t", b"\x80", b"error", b"ERROR"]
    out = bytearray()
    while len(out) < length:
        out += rng.choice(pieces)
    out = out[:length]
    for edge in range(FRAG, length - 1, FRAG):
        kind = (edge // FRAG) % 4
        if kind == 0:
            out[edge - 1 : edge + 1] = b"\r\n"
        elif kind == 1:
            out[edge - 1 : edge + 1] = b"\xc3\xa9"
        elif kind == 2:
            out[edge - 1 : edge + 1] = b"ab"
        else:
            out[edge - 1 : edge + 1] = b"\n\n"
    return bytes(out)


def csv_object(rows: int, seed: int) -> bytes:
    """CSV with quoted fields holding commas, quotes, CR and LF, rows ending in LF, CRLF or
    CR, blank lines, and UTF-8, so that quoting and records are cut at fragment edges."""
    rng = random.Random(seed)
    notes = ['"a,b"', '"line\nbreak"', '"say ""hi"""', "plain", '"cr\r\nlf"', "\u00e9t\u00e9", "", '"\n"']
    ends = ["\n", "\r\n", "\r", "\n\n"]
    out = "id,name,note\r\n"
    for i in range(rows):
        out += f"{i},n{rng.randrange(100)},{rng.choice(notes)}" + rng.choice(ends)
    return out.encode()


CSV_OBJECTS = {"table": csv_object(300, 4), "tiny-table": b"id,name,note\n10,x,a", "header-only": b"id,name,note\r\n"}

OBJECTS = {
    "empty": b"",
    "one-byte": b"x",
    "smaller-than-a-fragment": b"error in a short line\nand ab\n",
    "short-last-segment": edgy(5 * SEGMENT + 700, 1),
    "whole-segments": edgy(4 * SEGMENT, 2),
    "no-newline": b"ab" * 5000,
    "trailing-newline-on-edge": edgy(2 * SEGMENT - 1, 3) + b"\n",
    **CSV_OBJECTS,
}

CSV_ARGS = [["--arg", "where=id>=10;note~a", "--arg", "columns=note,id"], []]

GREPS = [("ab", []), ("error", ["-i"]), ("^a.*b$", ["-E"]), ("é", []), ("", [])]


def insitu(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([INSITU, *args], capture_output=True, timeout=300)
    if check:
        assert p.returncode == 0, f"insitu {' '.join(args)}: {p.stderr.decode(errors='replace')}"
    return p


def system_wc(data: bytes) -> dict:
    out = subprocess.run(["wc"], input=data, capture_output=True, env=C_LOCALE, check=True).stdout.split()
    return {"lines": int(out[0]), "words": int(out[1]), "bytes": int(out[2])}


def system_grep(pattern: str, flags: list, data: bytes) -> tuple:
    p = subprocess.run(["grep", "-a", "-n", "-b", *flags, "-e", pattern], input=data, capture_output=True, env=C_LOCALE)
    matches = []
    for line in p.stdout.split(b"\n")[:-1]:
        n, at, _ = line.split(b":", 2)
        matches.append([int(n), int(at)])
    return len(matches), matches


@pytest.fixture(scope="module")
def stored(swift_cluster):
    url, token = swift_cluster.login()
    from insitu.swift import client

    client.put_container(url, token, "c")
    for name, data in OBJECTS.items():
        client.put_object(url, token, "c", name, data)
        assert client.get_object(url, token, "c", name) == data
    return swift_cluster


def check_csv(cluster, oracle_dir: Path) -> None:
    for name, data in CSV_OBJECTS.items():
        src = oracle_dir / f"{name}.csv"
        src.write_bytes(data)
        for n, args in enumerate(CSV_ARGS):
            want_path = oracle_dir / f"{name}.{n}.want.csv"
            want = json.loads(insitu("exec", "csv-select", str(src), "--conventional", "--output", str(want_path), "--force", "--json", *args).stdout)[
                "results"
            ][0]
            got_path = oracle_dir / f"{name}.{n}.got.csv"
            got = json.loads(
                insitu(
                    "exec", "csv-select", f"swift://AUTH_test/c/{name}", "--swift-dir", str(cluster.dir), "--output", str(got_path), "--force", "--json", *args
                ).stdout
            )["results"][0]
            assert got_path.read_bytes() == want_path.read_bytes(), (name, args)
            assert (got["rows_in"], got["rows_out"], got["output_length"]) == (want["rows_in"], want["rows_out"], want["output_length"])


def check_all(cluster, expect_down: int) -> None:
    url, token = cluster.login()
    from insitu.swift import client

    for name, data in OBJECTS.items():
        assert client.get_object(url, token, "c", name) == data
        swift_url = f"swift://AUTH_test/c/{name}"
        wc = json.loads(insitu("wc", swift_url, "--swift-dir", str(cluster.dir), "--json").stdout)
        fields = {k: wc["results"][0][k] for k in ("lines", "words", "bytes")}
        assert fields == system_wc(data), name
        assert len(wc["stats"]["devices_down"]) == expect_down
        for pattern, flags in GREPS:
            g = json.loads(insitu("grep", pattern, swift_url, "--swift-dir", str(cluster.dir), "--json", *flags).stdout)["results"][0]
            assert (g["count"], g["matches"]) == system_grep(pattern, flags, data), (name, pattern, flags)


def test_wc_and_grep_equal_the_tools_on_the_downloaded_object(stored):
    check_all(stored, expect_down=0)


def test_csv_select_equals_csv_select_on_the_downloaded_object(stored, ext4_fs):
    check_csv(stored, ext4_fs.mkdir("swift-csv"))


def test_pieces_are_scanned_on_the_targets(stored):
    data = OBJECTS["short-last-segment"]
    r = json.loads(insitu("wc", "swift://AUTH_test/c/short-last-segment", "--swift-dir", str(stored.dir), "--json").stdout)
    # One EXEC per data fragment archive, and the targets read the data, not the host.
    assert r["stats"]["commands"] == 3
    assert r["stats"]["media_bytes"] >= len(data)
    assert r["stats"]["fragments_rebuilt"] == []


def test_exec_refuses_functions_that_cannot_be_joined(stored):
    p = insitu("exec", "crc32c", "swift://AUTH_test/c/one-byte", "--swift-dir", str(stored.dir), check=False)
    assert p.returncode == 2 and b"cannot be joined" in p.stderr


def snapshot(root: Path) -> dict:
    """Every file under the devices, with its digest and xattrs."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if "quarantined" in p.parts or p.name.endswith(".pkl") or p.name in ("hashes.invalid", ".lock"):
                continue
            out[str(p)] = hashlib.md5(p.read_bytes()).hexdigest()
    return out


def test_bad_input_gets_a_clear_error_and_changes_nothing(stored, tmp_path):
    url, token = stored.login()
    from insitu.swift import client

    root = stored.dir / "node"
    before = snapshot(root)
    p = insitu("wc", "swift://AUTH_test/c/no-such-object", "--swift-dir", str(stored.dir), check=False)
    assert p.returncode == 2 and b"no such object" in p.stderr
    # A replicated object where an erasure-coded one is expected.
    client.put_container(url, token, "rep", headers={"X-Storage-Policy": "replicated"})
    client.put_object(url, token, "rep", "r", b"replicated\n")
    p = insitu("wc", "swift://AUTH_test/rep/r", "--swift-dir", str(stored.dir), check=False)
    assert p.returncode == 2 and b"replicated" in p.stderr
    before = snapshot(root)
    # A ring that names devices with no target behind them.
    fake = tmp_path / "devices"
    for name in stored.devices:
        (fake / name).mkdir(parents=True)
    p = insitu("wc", "swift://AUTH_test/c/one-byte", "--swift-dir", str(stored.dir), "--devices", str(fake), check=False)
    assert p.returncode == 2 and b"no target" in p.stderr
    # A corrupt fragment header.
    archive = stored.fragments("c", "whole-segments")[0]
    original = archive.read_bytes()
    with open(archive, "r+b") as f:
        f.seek(60)
        f.write(bytes([original[60] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
    try:
        p = insitu("wc", "swift://AUTH_test/c/whole-segments", "--swift-dir", str(stored.dir), check=False)
        assert p.returncode == 2 and b"corrupt fragment header" in p.stderr
    finally:
        with open(archive, "r+b") as f:
            f.write(original)
            f.flush()
            os.fsync(f.fileno())
    assert snapshot(root) == before
    p = subprocess.run([INSITU, "wc", "swift://nonsense", "--swift-dir", str(stored.dir)], capture_output=True)
    assert p.returncode == 2 and b"swift://ACCOUNT/CONTAINER/OBJECT" in p.stderr


def test_scrub_quarantines_a_flipped_byte_and_swift_rebuilds_it(stored):
    url, token = stored.login()
    from insitu.swift import client

    big = os.urandom(12 << 20)  # most bytes in large archives, as in a real store
    client.put_object(url, token, "c", "scrubbed", big)
    clean = json.loads(insitu("scrub", "--swift-dir", str(stored.dir), "--json").stdout)
    assert clean["corrupt"] == [] and clean["files"] >= 5
    # Only digests cross the link: under 1% of the data.
    assert clean["link_share"] < 0.01, clean
    assert clean["target_read_bytes"] >= clean["bytes"]
    victim = stored.fragments("c", "scrubbed")[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    with open(victim, "r+b") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    p = insitu("scrub", "--swift-dir", str(stored.dir), "--json", check=False)
    assert p.returncode == 1
    report = json.loads(p.stdout)
    assert [c["path"] for c in report["corrupt"]] == [str(victim)]
    quarantined = Path(report["corrupt"][0]["quarantined"])
    assert quarantined.is_dir() and "quarantined" in quarantined.parts
    assert not victim.exists()
    # Swift's reconstructor rebuilds the fragment from the others.
    stored.once("reconstructor")
    rebuilt = stored.fragments("c", "scrubbed")
    assert len(rebuilt) == stored.k + stored.m
    again = json.loads(insitu("scrub", "--swift-dir", str(stored.dir), "--json").stdout)
    assert again["corrupt"] == []
    assert client.get_object(url, token, "c", "scrubbed") == big


def test_results_are_exact_with_m_targets_stopped(stored, ext4_fs):
    """Last in the module: it stops M of the cluster's targets."""
    state = stored.state()
    stopped = 0
    for name, dev in sorted(stored.devices.items()):
        if stopped == stored.m:
            break
        listen = dev["target"].split("://", 1)[1].split("/", 1)[0]
        insitu("target", "stop", "--listen", listen)
        stopped += 1
    assert state
    check_all(stored, expect_down=stored.m)
    check_csv(stored, ext4_fs.mkdir("swift-csv-degraded"))

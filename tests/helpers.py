# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the integration tests: running the CLI, independent reference
implementations (hashlib, crc32c, xxhash, b3sum, GNU grep/wc/sort, zstd, a CSV oracle),
FIEMAP from Python, and writers for files of awkward shapes.

Nothing here uses insitu itself, so every reference is independent of the code under test.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import random
import re
import socket
import struct
import subprocess
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import crc32c as _crc32c
import xxhash

ROOT = Path(__file__).resolve().parent.parent
INSITU = os.environ.get("INSITU_BIN") or str(ROOT / ".venv" / "bin" / "insitu")
C_ENV = {**os.environ, "LC_ALL": "C"}
CHECKSUMS = ("crc32c", "xxh3", "sha256", "blake3")


# --------------------------------------------------------------------------- the CLI


@dataclasses.dataclass
class CliResult:
    rc: int
    stdout: str
    stderr: str
    doc: Optional[object]


def run_cli(*args: object, json_out: bool = True, timeout: float = 300) -> CliResult:
    """Runs `insitu ARGS [--json]`; parses stdout as JSON when it is JSON."""
    argv = [INSITU, *map(str, args)] + (["--json"] if json_out else [])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    doc = None
    if json_out and p.stdout.strip():
        try:
            doc = json.loads(p.stdout)
        except json.JSONDecodeError:
            doc = None
    return CliResult(p.returncode, p.stdout, p.stderr, doc)


def cli_json(*args: object, timeout: float = 300) -> dict:
    """Runs `insitu ARGS --json`, asserts exit 0, returns the document."""
    r = run_cli(*args, timeout=timeout)
    assert r.rc == 0, f"insitu {' '.join(map(str, args))} exited {r.rc}: {r.stderr.strip()}"
    assert isinstance(r.doc, (dict, list)), r.stdout
    return r.doc


def cli_error(*args: object, rc: int = 2) -> str:
    """Runs a command expected to fail with exit `rc`; returns its error message (checking
    that the JSON error document and stderr carry the same one)."""
    r = run_cli(*args)
    assert r.rc == rc, f"insitu {' '.join(map(str, args))}: expected exit {rc}, got {r.rc}; stdout={r.stdout[:2000]!r} stderr={r.stderr[:2000]!r}"
    assert isinstance(r.doc, dict) and "error" in r.doc, r.stdout
    assert r.doc["error"] in r.stderr
    return r.doc["error"]


def exec_args(
    function: str, paths: Sequence[object], args: Dict[str, object] = None, conventional: bool = False, output: object = None, force: bool = False
) -> List[str]:
    argv = ["exec", function, *map(str, paths)]
    for k, v in (args or {}).items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        argv += ["--arg", f"{k}={v}"]
    if conventional:
        argv.append("--conventional")
    if output is not None:
        argv += ["--output", str(output)]
    if force:
        argv.append("--force")
    return argv


def exec_json(function: str, paths: Sequence[object], args: Dict[str, object] = None, **kw) -> dict:
    doc = cli_json(*exec_args(function, paths, args, **kw))
    assert doc["function"] == function
    assert doc["mode"] == ("conventional" if kw.get("conventional") else "offload")
    assert [r["path"] for r in doc["results"]] == [str(p) for p in paths]
    return doc


def both_modes(function: str, paths: Sequence[object], args: Dict[str, object] = None) -> Tuple[dict, dict]:
    """The same request offloaded and conventionally."""
    return exec_json(function, paths, args), exec_json(function, paths, args, conventional=True)


_PORTS_GIVEN: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that this process has
    not been given before: the kernel may hand the same ephemeral port to two binds in a row
    once the first socket is closed, and two daemons told the same port collide."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


# --------------------------------------------------------------------------- references


def ref_checksum(function: str, path: Path) -> str:
    data = Path(path).read_bytes()
    if function == "crc32c":
        return "%08x" % _crc32c.crc32c(data)
    if function == "xxh3":
        return xxhash.xxh3_64_hexdigest(data)
    if function == "sha256":
        return hashlib.sha256(data).hexdigest()
    if function == "blake3":
        out = subprocess.run(["b3sum", "--no-names", str(path)], capture_output=True, text=True, check=True).stdout
        return out.split()[0]
    raise ValueError(function)


def ref_grep(path: Path, pattern: str, regex: bool = False, ignore_case: bool = False) -> Tuple[int, List[List[int]]]:
    """(count, [[line, byte offset of the line], ...]) from GNU grep in the C locale."""
    opts = ["-a", "-E" if regex else "-F"] + (["-i"] if ignore_case else [])
    c = subprocess.run(["grep", "-c", *opts, "-e", pattern, str(path)], capture_output=True, env=C_ENV)
    assert c.returncode in (0, 1), c.stderr
    nb = subprocess.run(["grep", "-n", "-b", *opts, "-e", pattern, str(path)], capture_output=True, env=C_ENV)
    assert nb.returncode in (0, 1), nb.stderr
    matches = []
    for line in nb.stdout.split(b"\n")[:-1]:
        no, off, _ = line.split(b":", 2)
        matches.append([int(no), int(off)])
    return int(c.stdout), matches


def read_chunks(path: Path, chunk: int = 16 << 20):
    """Yields memoryviews of one reused buffer over the file (no allocation per chunk)."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            yield view[:n]


def ref_grep_literal_stream(chunks: Iterable, pattern: bytes) -> Tuple[int, List[List[int]]]:
    """grep -c / -n -b of a literal over a stream of byte chunks, in Python: for contents
    whose lines are too long for GNU grep to be quick (GiB of zeros without a newline)."""
    k = len(pattern)
    assert k and b"\n" not in pattern
    count, matches = 0, []
    line_no, line_start, pos = 1, 0, 0
    carry, matched = b"", False  # carry: the current line's last k-1 bytes so far
    for view in chunks:
        if isinstance(view, memoryview):
            view = view.obj if len(view) == len(view.obj) else bytes(view)
        data, n, i = view, len(view), 0
        while True:
            nl = data.find(b"\n", i, n)
            end = n if nl < 0 else nl
            if not matched and (pattern in carry + bytes(data[i : min(end, i + k - 1)]) or data.find(pattern, i, end) >= 0):
                matched = True
            if nl < 0:
                carry = (carry + bytes(data[max(i, end - (k - 1)) : end]))[-(k - 1) :] if k > 1 else b""
                break
            if matched:
                count += 1
                matches.append([line_no, line_start])
            line_no, line_start = line_no + 1, pos + nl + 1
            carry, matched, i = b"", False, nl + 1
        pos += n
    if pos > line_start and matched:  # a last line without a newline
        count += 1
        matches.append([line_no, line_start])
    return count, matches


def virtual_chunks(regions: Sequence[Tuple[int, bytes]], length: int, chunk: int = 16 << 20):
    """The bytes of a sparse file made of `regions` (offset, data) and zeros elsewhere,
    without reading it: the reference for files too large to read quickly."""
    zeros = bytes(chunk)
    pos = 0
    for off, data in sorted(regions) + [(length, b"")]:
        while pos < off:
            n = min(chunk, off - pos)
            yield zeros if n == chunk else zeros[:n]
            pos += n
        if data:
            yield data
            pos += len(data)


def ref_wc(path: Path) -> Tuple[int, int, int]:
    with open(path, "rb") as f:
        out = subprocess.run(["wc", "-l", "-w", "-c"], stdin=f, capture_output=True, env=C_ENV, check=True).stdout
    lines, words, nbytes = map(int, out.split())
    return lines, words, nbytes


def ref_sort(path: Path) -> bytes:
    return subprocess.run(["sort", str(path)], capture_output=True, env=C_ENV, check=True).stdout


def zstd_decompress(path: Path) -> bytes:
    p = subprocess.run(["zstd", "-q", "-d", "-c", str(path)], capture_output=True)
    assert p.returncode == 0, p.stderr
    return p.stdout


# --------------------------------------------------------------------------- CSV oracle
#
# Written from the module documentation of crates/offload/src/csv_select.rs, not from the
# code: header row; ';'-joined AND predicates; numeric comparison when VALUE parses as a
# Rust f64; output fields quoted exactly when they contain , " \r \n or are the only,
# empty field of the record; '\n' terminators.

_RUST_F64 = re.compile(rb"[+-]?(?:inf|infinity|nan|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\Z", re.IGNORECASE)


def rust_f64(text: bytes) -> Optional[float]:
    """Like Rust's `str::parse::<f64>` (None where it fails)."""
    if not _RUST_F64.match(text):
        return None
    return float(text.decode("ascii"))


def parse_csv(data: bytes) -> List[List[bytes]]:
    records: List[List[bytes]] = []
    i, n = 0, len(data)
    while i < n:
        if data[i] in b"\r\n":  # a blank line
            i += 2 if data[i : i + 2] == b"\r\n" else 1
            continue
        rec: List[bytes] = []
        while True:
            if i < n and data[i] == 0x22:  # a quoted field
                i += 1
                field = bytearray()
                while True:
                    j = data.index(b'"', i)
                    field += data[i:j]
                    if data[j + 1 : j + 2] == b'"':
                        field += b'"'
                        i = j + 2
                    else:
                        i = j + 1
                        break
                rec.append(bytes(field))
            else:
                j = i
                while j < n and data[j] not in b",\r\n":
                    j += 1
                rec.append(data[i:j])
                i = j
            if i < n and data[i] == 0x2C:
                i += 1
                continue
            if i < n:
                i += 2 if data[i : i + 2] == b"\r\n" else 1
            break
        records.append(rec)
    return records


def _predicate(text: str):
    at = min((text.find(c) for c in "=!<>~" if c in text), default=-1)
    assert at >= 0, text
    two = text[at + 1 : at + 2] == "="
    c = text[at]
    if c == "=":
        op, ln = "=", 1
    elif c == "!":
        assert two
        op, ln = "!=", 2
    elif c in "<>":
        op, ln = (c + "=", 2) if two else (c, 1)
    else:
        op, ln = "~", 1
    column = text[:at].strip()
    value = text[at + ln :].strip().encode()
    number = None if op == "~" else rust_f64(value)
    return column, op, value, number


def _holds(op: str, value: bytes, number: Optional[float], field: bytes) -> bool:
    if op == "~":
        return value in field
    if number is not None:
        f = rust_f64(field.strip(b" \t\n\r\x0c"))
        if f is None:
            return False
        a, b = f, number
    else:
        a, b = field, value
    return {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _quote(field: bytes, only: bool) -> bytes:
    if any(c in field for c in (b",", b'"', b"\r", b"\n")) or (only and field == b""):
        return b'"' + field.replace(b'"', b'""') + b'"'
    return field


def csv_select_oracle(data: bytes, where: Optional[str] = None, columns: Optional[str] = None) -> Tuple[bytes, int, int]:
    """(output bytes, rows_in, rows_out) of csv-select by the documented rules."""
    records = parse_csv(data)
    if not records:
        return b"", 0, 0
    header, rows = records[0], records[1:]
    idx = {}
    for i, h in enumerate(header):
        idx.setdefault(h, i)
    preds = [_predicate(p) for p in where.split(";")] if where is not None else []
    tests = [(idx[c.encode()], op, v, num) for c, op, v, num in preds]
    proj = [idx[c.strip().encode()] for c in columns.split(",")] if columns is not None else list(range(len(header)))

    def emit(rec):
        fields = [rec[i] for i in proj]
        return b",".join(_quote(f, len(fields) == 1) for f in fields) + b"\n"

    out = [emit(header)]
    selected = 0
    for r in rows:
        assert len(r) == len(header), r
        if all(_holds(op, v, num, r[i]) for i, op, v, num in tests):
            selected += 1
            out.append(emit(r))
    return b"".join(out), len(rows), selected


# --------------------------------------------------------------------------- FIEMAP

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_UNWRITTEN = 0x800
FIEMAP_EXTENT_SHARED = 0x2000


@dataclasses.dataclass
class Extent:
    logical: int
    physical: int
    length: int
    flags: int

    @property
    def unwritten(self) -> bool:
        return bool(self.flags & FIEMAP_EXTENT_UNWRITTEN)


def fiemap(path: Path) -> List[Extent]:
    """The file's extents, from the FIEMAP ioctl (after a sync)."""
    out: List[Extent] = []
    count = 256
    start = 0
    with open(path, "rb") as f:
        while True:
            buf = bytearray(32 + 56 * count)
            struct.pack_into("=QQIIII", buf, 0, start, 0xFFFFFFFFFFFFFFFF - start, FIEMAP_FLAG_SYNC, 0, count, 0)
            fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, buf, True)
            mapped = struct.unpack_from("=I", buf, 20)[0]
            last = False
            for k in range(mapped):
                lo, ph, ln, _, _, fl = struct.unpack_from("=QQQQQI", buf, 32 + 56 * k)
                out.append(Extent(lo, ph, ln, fl))
                last = bool(fl & FIEMAP_EXTENT_LAST)
            if mapped == 0 or last:
                return out
            start = out[-1].logical + out[-1].length


def device_offset(path: Path) -> Tuple[Path, int]:
    """The loop device's backing file of the file system holding `path`, and where the file
    system starts in it (loop offset plus partition start)."""
    st = os.stat(path)
    sys_dir = Path(os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"))
    part = 0
    if (sys_dir / "partition").exists():
        part = int((sys_dir / "start").read_text()) * 512
        sys_dir = sys_dir.parent
    backing = Path((sys_dir / "loop" / "backing_file").read_text().strip())
    return backing, int((sys_dir / "loop" / "offset").read_text()) + part


def image_offset(path: Path, logical: int) -> int:
    """Byte offset in the image file that holds byte `logical` of the file at `path`."""
    _, base = device_offset(path)
    for e in fiemap(path):
        if e.logical <= logical < e.logical + e.length:
            assert not e.unwritten, "byte is in an unwritten extent"
            return base + e.physical + (logical - e.logical)
    raise AssertionError(f"byte {logical} of {path} is in a hole")


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def corrupt_behind_fs(path: Path, logical: int, length: int = 16) -> None:
    """Flips `length` bytes of `path` at `logical` by writing straight into the image file
    (not through the file system), then drops the caches."""
    image, _ = device_offset(path)
    off = image_offset(path, logical)
    assert image_offset(path, logical + length - 1) == off + length - 1, "range crosses an extent"
    with open(image, "r+b") as f:
        f.seek(off)
        old = f.read(length)
        f.seek(off)
        f.write(bytes(b ^ 0xFF for b in old))
        f.flush()
        os.fsync(f.fileno())
    drop_caches()


# --------------------------------------------------------------------------- file shapes

WORDS = [
    b"ERROR",
    b"error",
    b"Error",
    b"WARN",
    b"warning",
    b"INFO",
    b"status=503",
    b"status=200",
    b"status=5xx",
    b"abc",
    b"abcabc",
    b"ab",
    b"c",
    b"e",
    b"GET",
    b"/api/v2/orders",
    b"x" * 40,
    b"\t",
    b"caf\xc3\xa9",
    b"\xff\xfe",
]


def text_bytes(n: int, rng: random.Random) -> bytes:
    """About `n` bytes of log-like lines (exactly n; the last line is usually cut)."""
    out = bytearray()
    while len(out) < n:
        k = rng.randrange(0, 12)
        out += b" ".join(rng.choice(WORDS) for _ in range(k))
        out += b"\n" if rng.random() < 0.97 else b"\n\n"
    return bytes(out[:n])


def write_file(path: Path, data: bytes) -> Path:
    with open(path, "wb") as f:
        f.write(data)
    return path


def write_fragmented(pa: Path, pb: Path, rounds: int, rng: random.Random, text: bool = True, min_extents: int = 3) -> None:
    """Two files grown by interleaved small appends with an fsync after each.

    Whether that fragments them is up to the allocator: ext4 reliably interleaves them,
    but xfs may place the two files far apart and keep each contiguous. A file left with
    fewer than `min_extents` extents is then fragmented by copy-on-write (see
    `ensure_fragmented`), which keeps its contents."""
    with open(pa, "wb") as fa, open(pb, "wb") as fb:
        for _ in range(rounds):
            for f, is_text in ((fa, text), (fb, False)):
                n = rng.randrange(500, 6000)
                f.write(text_bytes(n, rng) if is_text else rng.randbytes(n))
                f.flush()
                os.fsync(f.fileno())
    for p in (pa, pb):
        ensure_fragmented(p, min_extents)


def ensure_fragmented(path: Path, min_extents: int) -> None:
    """Where the file system supports reflinks (xfs), splits a file into many extents
    without changing its bytes: clone it, rewrite one block in every 64 KiB of the original
    with the same bytes (copy-on-write moves each to new blocks), drop the clone."""
    if len(fiemap(path)) >= min_extents:
        return
    clone = Path(f"{path}.clone")
    if subprocess.run(["cp", "--reflink=always", str(path), str(clone)], capture_output=True).returncode != 0:
        return  # no reflinks (ext4): keep what the appends gave
    try:
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            for off in range(0, size, 64 << 10):
                f.seek(off)
                block = f.read(4096)
                f.seek(off)
                f.write(block)
                f.flush()
                os.fsync(f.fileno())
    finally:
        clone.unlink()


def write_sparse(path: Path, rng: random.Random) -> None:
    """Holes at the start, in the middle and at the end (none block aligned at the end)."""
    with open(path, "wb") as f:
        f.seek((1 << 20) + 123)
        f.write(text_bytes(10_000, rng))
        f.seek(3 << 20)
        f.write(text_bytes(5_000, rng))
        f.truncate((6 << 20) + 7)


def write_fallocated(path: Path, rng: random.Random) -> None:
    """Written data, an allocated but never written range, written data again."""
    with open(path, "wb") as f:
        f.write(text_bytes(10_000, rng))
        f.flush()
        os.posix_fallocate(f.fileno(), 10_000, 2 << 20)
        f.seek(10_000 + (2 << 20))
        f.write(text_bytes(7_777, rng))


def write_fallocated_islands(path: Path, rng: random.Random) -> None:
    """A 1 MiB fallocated file with two written islands: unwritten, data, unwritten, data,
    unwritten."""
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 1 << 20)
        f.seek(300_000)
        f.write(text_bytes(3_000, rng))
        f.flush()
        os.fsync(f.fileno())
        f.seek(700_001)
        f.write(rng.randbytes(4_099))


def write_many_extents(path: Path, rng: random.Random, islands: int = 700) -> None:
    """Hundreds of small written and fallocated islands separated by holes: more extents
    than one FIEMAP call of the host returns (256)."""
    with open(path, "wb") as f:
        for i in range(islands):
            off = i * 20_000 + rng.randrange(3000)
            if i % 5 == 3:
                os.posix_fallocate(f.fileno(), off, 2500)
            else:
                f.seek(off)
                f.write(text_bytes(rng.randrange(1, 3000), rng))
        f.truncate(islands * 20_000 + 777)

# SPDX-License-Identifier: Apache-2.0
"""Offloaded functions on erasure-coded Swift objects: ``insitu wc|grep|exec ...
swift://ACCOUNT/CONTAINER/OBJECT --swift-dir DIR``.

The object is resolved through Swift's ring (:mod:`.resolve`); every data fragment of every
segment is a byte range of a fragment archive, which the target holding that archive scans
with one EXEC per batch of ranges (``exec_ranges``), all archives at once. Kernels run with
``edges=true`` and report how each piece begins and ends, so the host joins the pieces into
the result for the whole object: a word or line cut at a fragment or segment edge counts
once. With up to M devices unreachable, their data fragments are rebuilt from the others
with the policy's own code (liberasurecode through pyeclib) and computed on the host by the
same kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import _native
from .resolve import HEADER_LEN, SwiftError, SwiftObject, resolve

#: Functions whose results over consecutive pieces can be joined into the whole object's.
JOINABLE = ("wc", "grep", "csv-select")

#: Where Debian's pyeclib lives (for the system Python that Swift runs on).
SYSTEM_SITE = "/usr/lib/python3/dist-packages"


def _attachments() -> Dict[str, str]:
    """Mounted directory -> target URL of every ``insitu attach``."""
    out = {}
    run = Path("/run/insitu/attach")
    for p in run.glob("*.json") if run.is_dir() else []:
        try:
            a = json.loads(p.read_text())
            out[os.path.realpath(a["dir"])] = a["url"]
        except (OSError, ValueError, KeyError):
            continue
    return out


def _reachable(url: str, timeout: float = 1.0) -> bool:
    hostport = url.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def device_check() -> Callable[[Path], bool]:
    """``readable(dev_dir)`` for :func:`resolve`: a device attached from a target is readable
    when its target answers; a device that is neither attached nor mounted has no target."""
    attached = _attachments()

    answered: Dict[str, bool] = {}  # every policy's ring names the same devices

    def readable(dev_dir: Path) -> bool:
        real = os.path.realpath(dev_dir)
        url = attached.get(real)
        if url is not None:
            if real not in answered:
                answered[real] = _reachable(url)
            return answered[real]
        if os.path.ismount(real):
            return True  # a local image, served by an embedded target
        raise SwiftError(f"the ring names device {dev_dir.name}, which has no target: {dev_dir} is not a mounted insitu namespace")

    return readable


def _ec_driver(obj: SwiftObject):
    if SYSTEM_SITE not in sys.path:
        sys.path.append(SYSTEM_SITE)  # after the environment's own packages
    try:
        from pyeclib.ec_iface import ECDriver
    except ImportError as e:
        raise SwiftError(f"rebuilding fragments needs pyeclib (Debian's python3-pyeclib): {e}") from None
    p = obj.policy
    return ECDriver(k=p.k, m=p.m, ec_type=p.ec_type)


def rebuild(obj: SwiftObject, wanted: Sequence[Tuple[int, int, int, int]]) -> Tuple[List[bytes], int]:
    """The bytes of the pieces ``(segment, fragment, offset, length)`` whose archives are
    missing, decoded from any K archives that are there; returns them and the bytes read."""
    if len(obj.archives) < obj.policy.k:
        raise SwiftError(
            f"{obj.url}: only {len(obj.archives)} of its fragment archives can be read and {obj.policy.k} are needed (devices down: {', '.join(sorted(obj.missing.values())) or 'none'})"
        )
    driver = _ec_driver(obj)
    sources = sorted(obj.archives.values(), key=lambda a: a.index)[: obj.policy.k]
    files = {a.index: open(a.path, "rb") for a in sources}
    out, read = [], 0
    try:
        by_segment: Dict[int, bytes] = {}
        for s, i, _off, n in wanted:
            if s not in by_segment:
                at, size = obj.record_offset(s), HEADER_LEN + obj.frag_size(s)
                frags = [os.pread(f.fileno(), size, at) for f in files.values()]
                read += sum(len(x) for x in frags)
                by_segment = {s: driver.decode(frags)}
            fs = obj.frag_size(s)
            out.append(by_segment[s][i * fs : i * fs + n])
    finally:
        for f in files.values():
            f.close()
    return out, read


def new_stats() -> Dict[str, Any]:
    """The stats of a run that has done nothing yet."""
    return {"bytes_to_host": 0, "bytes_from_host": 0, "media_bytes": 0, "seconds": 0.0, "commands": 0, "rebuild_bytes_read": 0, "fragments_rebuilt": []}


#: Ranges per EXEC when a function's arguments name each input (csv-select-piece's starts).
BATCH = 64
#: Piece bytes per EXEC whose results may carry them back (see exec_ranges).
BATCH_BYTES = 16 << 20


def run_pieces(
    obj: SwiftObject,
    function: str,
    args: List[str],
    pieces: Optional[List[Tuple[int, int, int, int]]] = None,
    skips: Optional[List[int]] = None,
    per_input: Optional[Callable[[List[int]], List[str]]] = None,
    stats: Optional[Dict[str, Any]] = None,
) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """Runs ``function`` with ``args`` over pieces of the object (default: all, with
    ``edges=true``), offloaded where its archive can be read, rebuilt and run on the host
    where not; returns the results in object order and the summed stats. ``skips`` drops
    leading bytes of pieces; ``per_input(indices)`` adds arguments for the pieces of one
    EXEC, in their order (then at most :data:`BATCH` pieces go in one). Pieces are
    ``(segment, fragment, offset, length)`` as :meth:`SwiftObject.pieces` gives them."""
    if pieces is None:
        pieces, args = obj.pieces(), [*args, "edges=true"]
    skips = skips or [0] * len(pieces)
    by_archive: Dict[int, List[int]] = {}
    lost: List[int] = []
    for n, (s, i, _off, _len) in enumerate(pieces):
        (by_archive.setdefault(i, []) if i in obj.archives else lost).append(n)
    results: List[Optional[Dict[str, Any]]] = [None] * len(pieces)
    if stats is None:
        stats = new_stats()
    largest = max([p[3] for p in pieces] or [1])
    per = max(1, min(BATCH, BATCH_BYTES // max(1, largest))) if per_input else len(pieces) or 1

    def offload(i: int) -> List[Tuple[List[int], Dict[str, Any]]]:
        done = []
        idx_all = by_archive[i]
        for at in range(0, len(idx_all), per):
            idx = idx_all[at : at + per]
            ranges = [(obj.record_offset(pieces[n][0]) + HEADER_LEN + skips[n], pieces[n][3] - skips[n]) for n in idx]
            extra = per_input(idx) if per_input else []
            done.append((idx, json.loads(_native.exec_ranges_json(function, str(obj.archives[i].path), ranges, [*args, *extra]))))
        return done

    with ThreadPoolExecutor(max_workers=max(1, len(by_archive))) as pool:
        for batches in pool.map(offload, sorted(by_archive)):
            for idx, report in batches:
                for n, r in zip(idx, report["results"]):
                    results[n] = r
                for k in ("bytes_to_host", "bytes_from_host", "media_bytes", "commands"):
                    stats[k] += report["stats"][k]
    if lost:
        data, rebuilt_bytes = rebuild(obj, [pieces[n] for n in lost])
        data = [d[skips[n] :] for n, d in zip(lost, data)]
        extra = per_input(lost) if per_input else []
        for n, r in zip(lost, json.loads(_native.run_json(function, data, [*args, *extra]))):
            results[n] = r
        stats["bytes_to_host"] += rebuilt_bytes
        stats["rebuild_bytes_read"] += rebuilt_bytes
        stats["fragments_rebuilt"] = sorted(set(stats["fragments_rebuilt"]) | {pieces[n][1] for n in lost})
    return [r for r in results if r is not None], stats


def join_wc(records: List[Dict[str, Any]]) -> Dict[str, int]:
    lines = words = size = 0
    open_word = False
    for r in records:
        lines += r["lines"]
        size += r["bytes"]
        words += r["words"] - (1 if open_word and r["lead"] == 2 else 0)
        if r["lead"] != 0:
            open_word = bool(r["in_word"])
    return {"lines": lines, "words": words, "bytes": size}


def join_grep(records: List[Dict[str, Any]], pieces: List[Tuple[int, int, int, int]], args: List[str], max_matches: int) -> Dict[str, Any]:
    count, matches, truncated = 0, [], False
    lines, line, line_at = 0, bytearray(), 0
    joined: List[Tuple[int, int, bytes]] = []  # (line number, offset, bytes) of lines across edges
    for r, (_s, _i, off, n) in zip(records, pieces):
        if not line:
            line_at = off
        line += bytes.fromhex(r["head"])
        if r["newlines"]:
            lines += 1
            joined.append((lines, line_at, bytes(line)))
            count += r["count"]
            truncated |= r["truncated"]
            matches.extend([ln + lines, o + off] for ln, o in r["matches"])
            lines += r["newlines"] - 1
            line = bytearray(bytes.fromhex(r["tail"]))
            line_at = off + n - len(line)
    if line:
        joined.append((lines + 1, line_at, bytes(line)))
    if joined:
        found = json.loads(_native.run_json("grep", [b for _, _, b in joined], args))
        for (ln, at, _), f in zip(joined, found):
            if f["count"]:
                count += 1
                matches.append([ln, at])
    matches.sort()
    if len(matches) > max_matches:
        matches, truncated = matches[:max_matches], True
    return {"count": count, "matches": matches, "truncated": truncated}


def _piece_bytes(obj: SwiftObject, piece: Tuple[int, int, int, int]) -> bytes:
    """A piece read by the host (through the attached file system), or rebuilt."""
    s, i, _off, n = piece
    if i in obj.archives:
        with open(obj.archives[i].path, "rb") as f:
            return os.pread(f.fileno(), n, obj.record_offset(s) + HEADER_LEN)
    return rebuild(obj, [piece])[0][0]


def csv_header(obj: SwiftObject, pieces: List[Tuple[int, int, int, int]]) -> Tuple[str, int, int]:
    """The object's header record (its first record that is not blank), as text, where the
    data after it starts, and the bytes read to find it: the host reads the object's first
    pieces until the record ends, with the quoting rules of csv-select-piece."""
    buf, read = bytearray(), 0
    state, start = "f", None
    for piece in pieces:
        data = _piece_bytes(obj, piece)
        read += len(data)
        for b in data:
            at = len(buf)
            buf.append(b)
            if state == "q":
                state = "c" if b == 0x22 else "q"
                continue
            if b == 0x22:
                if state == "m":
                    raise SwiftError(f"{obj.url}: a quote inside an unquoted field of the header (not RFC 4180 quoting)")
                state = "q"
            elif b in (0x0A, 0x0D):
                if start is not None:
                    try:
                        return bytes(buf[start:at]).decode("utf-8"), at + 1, read
                    except UnicodeDecodeError:
                        raise SwiftError(f"{obj.url}: the CSV header is not UTF-8") from None
                state = "f"
                continue
            else:
                state = "f" if b == 0x2C else "m"
            if start is None:
                start = at
    if start is None:
        return "", len(buf), read
    try:
        return bytes(buf[start:]).decode("utf-8"), len(buf), read
    except UnicodeDecodeError:
        raise SwiftError(f"{obj.url}: the CSV header is not UTF-8") from None


def run_csv(obj: SwiftObject, args: List[str], output: Path) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """csv-select over the object: the header found by the host, each piece's quote count
    (a first pass on the targets), then each piece selected from the state it starts in
    (a second pass), and the records cut at edges selected on the host."""
    header, data_at, header_read = csv_header(obj, obj.pieces())
    if not header:
        output.write_bytes(b"")
        return {"output_length": 0, "rows_in": 0, "rows_out": 0, "output": str(output)}, new_stats()
    pieces, skips = [], []
    for p in obj.pieces():
        s, i, off, n = p
        if off + n <= data_at:
            continue
        pieces.append(p)
        skips.append(max(0, data_at - off))
    base = [f"header={header}", *args]
    stats: Optional[Dict[str, Any]] = None
    starts: List[str] = []
    if pieces:
        scanned, stats = run_pieces(obj, "csv-select-piece", ["scan=true"], pieces, skips)
        quotes, prev = 0, 0x0A
        for r in scanned:
            starts.append("q" if quotes % 2 else "c" if prev == 0x22 else "f" if prev in (0x2C, 0x0A, 0x0D) else "m")
            quotes += r["quotes"]
            prev = r["last"] if r["last"] != 256 else prev
        results, stats = run_pieces(obj, "csv-select-piece", base, pieces, skips, lambda idx: ["starts=" + "".join(starts[n] for n in idx)], stats)
    else:
        results = []
    # Records cut at edges, in order, selected on the host with the same kernel.
    joined: List[bytes] = []
    order: List[Tuple[str, int]] = []  # ("joined", j) or ("piece", n)
    carry = bytearray()
    for n, r in enumerate(results):
        carry += bytes.fromhex(r["head"])
        if r["cut"]:
            joined.append(bytes(carry))
            order += [("joined", len(joined) - 1), ("piece", n)]
            carry = bytearray(bytes.fromhex(r["tail"]))
    if carry:
        joined.append(bytes(carry))
        order.append(("joined", len(joined) - 1))
    host = json.loads(_native.run_json("csv-select-piece", joined or [b""], [*base, "whole=true"]))
    out = bytearray(bytes.fromhex(host[0]["header_out"]))
    rows_in = rows_out = 0
    for kind, j in order:
        r = host[j] if kind == "joined" else results[j]
        out += bytes.fromhex(r["rows"])
        rows_in += r["rows_in"]
        rows_out += r["rows_out"]
    output.write_bytes(bytes(out))
    stats = stats or new_stats()
    stats["bytes_to_host"] += header_read
    return {"output_length": len(out), "rows_in": rows_in, "rows_out": rows_out, "output": str(output)}, stats


def run(function: str, url: str, swift_dir: Path, devices: Optional[Path], args: List[str], output: Optional[Path] = None) -> Dict[str, Any]:
    """Runs ``function`` over the Swift object ``url``; the report has the shape of a plain
    file's (``insitu exec ... --json``), with ``fragments_rebuilt`` in its stats."""
    started = time.monotonic()
    if function not in JOINABLE:
        raise SwiftError(f"{function} cannot be joined across fragment edges; on Swift objects: {', '.join(JOINABLE)}")
    obj = resolve(url, swift_dir, devices, readable=device_check())
    if obj.missing and len(obj.missing) > obj.policy.m:
        raise SwiftError(
            f"{url}: {len(obj.missing)} devices are down ({', '.join(sorted(obj.missing.values()))}), more than the policy's {obj.policy.m} parity fragments can cover"
        )
    if function == "csv-select":
        fields, stats = run_csv(obj, args, output or Path(url.rsplit("/", 1)[1] + ".select.csv"))
        stats["seconds"] = time.monotonic() - started
        stats["devices_down"] = sorted(obj.missing.values())
        return {"function": function, "mode": "offload", "results": [{"path": url, **fields}], "stats": stats}
    records, stats = run_pieces(obj, function, args) if obj.length else ([], new_stats())
    if function == "wc":
        fields: Dict[str, Any] = join_wc(records)
    else:
        max_matches = next((int(a.split("=", 1)[1]) for a in args if a.startswith("max_matches=")), 1_000_000)
        fields = join_grep(records, obj.pieces(), args, max_matches)
    stats["seconds"] = time.monotonic() - started
    stats["devices_down"] = sorted(obj.missing.values())
    return {"function": function, "mode": "offload", "results": [{"path": url, **fields}], "stats": stats}


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def main(argv: List[str]) -> int:
    """``insitu wc|grep|exec ... swift://A/C/O --swift-dir DIR``; ``argv`` starts with the verb."""
    verb, rest = argv[0], argv[1:]
    p = argparse.ArgumentParser(
        prog=f"insitu {verb}",
        description=f"{verb} on erasure-coded Swift objects, offloaded to the targets that hold their fragments; results equal running on the whole object.",
    )
    if verb == "exec":
        p.add_argument("function", help=f"function to run: {', '.join(JOINABLE)}")
    if verb == "grep":
        p.add_argument("pattern", help="literal text, or a regular expression with -E")
    p.add_argument("objects", nargs="+", metavar="swift://ACCOUNT/CONTAINER/OBJECT")
    p.add_argument(
        "--swift-dir",
        type=Path,
        default=Path("/etc/swift"),
        help="directory with swift.conf and the rings (default /etc/swift; an `insitu swift up` directory works as is)",
    )
    p.add_argument("--devices", type=Path, help="where the devices are mounted (default: SWIFT_DIR/node if present, else /srv/node)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    if verb == "grep":
        p.add_argument("-E", "--regex", action="store_true", help="PATTERN is a regular expression")
        p.add_argument("-i", "--ignore-case", action="store_true", help="ignore case")
        p.add_argument("-c", "--count", action="store_true", help="print only the count")
    if verb == "exec":
        p.add_argument("--arg", dest="args", action="append", default=[], metavar="KEY=VALUE", help="function argument (repeatable)")
        p.add_argument("-o", "--output", type=Path, help="csv-select: where to write the result (default: OBJECT.select.csv here)")
        p.add_argument("--force", action="store_true", help="replace an existing result file")
    a = p.parse_args(rest)
    if verb == "grep":
        function = "grep"
        args = [f"pattern={a.pattern}", f"regex={str(a.regex).lower()}", f"ignore_case={str(a.ignore_case).lower()}"]
    elif verb == "wc":
        function, args = "wc", []
    else:
        function, args = a.function, a.args
    reports = []
    output = getattr(a, "output", None)
    if function == "csv-select":
        if len(a.objects) != 1 and output is not None:
            print("insitu: --output needs exactly one object", file=sys.stderr)
            return 2
        dest = output or Path(a.objects[0].rsplit("/", 1)[-1] + ".select.csv")
        if dest.exists() and not a.force:
            print(f"insitu: {dest} exists; remove it or pass --force to replace it", file=sys.stderr)
            return 2
    try:
        for url in a.objects:
            reports.append(run(function, url, a.swift_dir, a.devices, args, output))
    except (SwiftError, _native.InsituError) as e:
        print(f"insitu: {e}", file=sys.stderr)
        return 2
    report = (
        reports[0]
        if len(reports) == 1
        else {
            "function": function,
            "mode": "offload",
            "results": [r for rep in reports for r in rep["results"]],
            "stats": {k: sum(rep["stats"][k] for rep in reports) for k in ("bytes_to_host", "bytes_from_host", "media_bytes", "seconds", "commands")},
        }
    )
    if a.json:
        print(json.dumps(report, indent=2))
        return 0
    for r in report["results"]:
        if function == "csv-select":
            print(f"{r['path']}: {r['rows_out']} of {r['rows_in']} rows -> {r['output']}")
        elif function == "wc":
            print(f"{r['lines']:>8} {r['words']:>8} {r['bytes']:>10} {r['path']}")
        else:
            print(f"{r['path']}:{r['count']}")
            if not getattr(a, "count", False):
                for ln, at in r["matches"]:
                    print(f"  line {ln} at byte {at}")
    s = report["stats"]
    print(
        f"{function} (offload): {_human(s['bytes_to_host'])} to host, {_human(s['bytes_from_host'])} from host, target read {_human(s['media_bytes'])}, {s['seconds']:.3f}s",
        file=sys.stderr,
    )
    return 0

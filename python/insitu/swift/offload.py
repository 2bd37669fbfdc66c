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
JOINABLE = ("wc", "grep")

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

    def readable(dev_dir: Path) -> bool:
        real = os.path.realpath(dev_dir)
        url = attached.get(real)
        if url is not None:
            return _reachable(url)
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
        raise SwiftError(f"{obj.url}: only {len(obj.archives)} of its fragment archives can be read and {obj.policy.k} are needed (devices down: {', '.join(sorted(obj.missing.values())) or 'none'})")
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


def run_pieces(obj: SwiftObject, function: str, args: List[str]) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """Runs ``function`` with ``edges=true`` over every piece of the object, offloaded where
    its archive can be read; returns the results in object order and the summed stats."""
    pieces = obj.pieces()
    edge_args = [*args, "edges=true"]
    by_archive: Dict[int, List[int]] = {}
    lost: List[int] = []
    for n, (s, i, _off, _len) in enumerate(pieces):
        (by_archive.setdefault(i, []) if i in obj.archives else lost).append(n)
    results: List[Optional[Dict[str, Any]]] = [None] * len(pieces)
    stats = {"bytes_to_host": 0, "bytes_from_host": 0, "media_bytes": 0, "seconds": 0.0, "commands": 0}

    def offload(i: int) -> Tuple[List[int], Dict[str, Any]]:
        idx = by_archive[i]
        ranges = [(obj.record_offset(pieces[n][0]) + HEADER_LEN, pieces[n][3]) for n in idx]
        return idx, json.loads(_native.exec_ranges_json(function, str(obj.archives[i].path), ranges, edge_args))

    with ThreadPoolExecutor(max_workers=max(1, len(by_archive))) as pool:
        for idx, report in pool.map(offload, sorted(by_archive)):
            for n, r in zip(idx, report["results"]):
                results[n] = r
            for k in ("bytes_to_host", "bytes_from_host", "media_bytes", "commands"):
                stats[k] += report["stats"][k]
    rebuilt_bytes = 0
    if lost:
        data, rebuilt_bytes = rebuild(obj, [pieces[n] for n in lost])
        for n, r in zip(lost, json.loads(_native.run_json(function, data, edge_args))):
            results[n] = r
        stats["bytes_to_host"] += rebuilt_bytes
    stats["fragments_rebuilt"] = sorted({pieces[n][1] for n in lost})
    stats["rebuild_bytes_read"] = rebuilt_bytes
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


def run(function: str, url: str, swift_dir: Path, devices: Optional[Path], args: List[str]) -> Dict[str, Any]:
    """Runs ``function`` over the Swift object ``url``; the report has the shape of a plain
    file's (``insitu exec ... --json``), with ``fragments_rebuilt`` in its stats."""
    started = time.monotonic()
    if function not in JOINABLE:
        raise SwiftError(f"{function} cannot be joined across fragment edges; on Swift objects: {', '.join(JOINABLE)}")
    obj = resolve(url, swift_dir, devices, readable=device_check())
    if obj.missing and len(obj.missing) > obj.policy.m:
        raise SwiftError(f"{url}: {len(obj.missing)} devices are down ({', '.join(sorted(obj.missing.values()))}), more than the policy's {obj.policy.m} parity fragments can cover")
    records, stats = run_pieces(obj, function, args) if obj.length else ([], {"bytes_to_host": 0, "bytes_from_host": 0, "media_bytes": 0, "commands": 0, "fragments_rebuilt": [], "rebuild_bytes_read": 0})
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
    p = argparse.ArgumentParser(prog=f"insitu {verb}", description=f"{verb} on erasure-coded Swift objects, offloaded to the targets that hold their fragments; results equal running on the whole object.")
    if verb == "exec":
        p.add_argument("function", help=f"function to run: {', '.join(JOINABLE)}")
    if verb == "grep":
        p.add_argument("pattern", help="literal text, or a regular expression with -E")
    p.add_argument("objects", nargs="+", metavar="swift://ACCOUNT/CONTAINER/OBJECT")
    p.add_argument("--swift-dir", type=Path, default=Path("/etc/swift"), help="directory with swift.conf and the rings (default /etc/swift; an `insitu swift up` directory works as is)")
    p.add_argument("--devices", type=Path, help="where the devices are mounted (default: SWIFT_DIR/node if present, else /srv/node)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    if verb == "grep":
        p.add_argument("-E", "--regex", action="store_true", help="PATTERN is a regular expression")
        p.add_argument("-i", "--ignore-case", action="store_true", help="ignore case")
        p.add_argument("-c", "--count", action="store_true", help="print only the count")
    if verb == "exec":
        p.add_argument("--arg", dest="args", action="append", default=[], metavar="KEY=VALUE", help="function argument (repeatable)")
    a = p.parse_args(rest)
    if verb == "grep":
        function = "grep"
        args = [f"pattern={a.pattern}", f"regex={str(a.regex).lower()}", f"ignore_case={str(a.ignore_case).lower()}"]
    elif verb == "wc":
        function, args = "wc", []
    else:
        function, args = a.function, a.args
    reports = []
    try:
        for url in a.objects:
            reports.append(run(function, url, a.swift_dir, a.devices, args))
    except (SwiftError, _native.InsituError) as e:
        print(f"insitu: {e}", file=sys.stderr)
        return 2
    report = reports[0] if len(reports) == 1 else {
        "function": function, "mode": "offload", "results": [r for rep in reports for r in rep["results"]],
        "stats": {k: sum(rep["stats"][k] for rep in reports) for k in ("bytes_to_host", "bytes_from_host", "media_bytes", "seconds", "commands")},
    }
    if a.json:
        print(json.dumps(report, indent=2))
        return 0
    for r in report["results"]:
        if function == "wc":
            print(f"{r['lines']:>8} {r['words']:>8} {r['bytes']:>10} {r['path']}")
        else:
            print(f"{r['path']}:{r['count']}")
            if not getattr(a, "count", False):
                for ln, at in r["matches"]:
                    print(f"  line {ln} at byte {at}")
    s = report["stats"]
    print(f"{function} (offload): {_human(s['bytes_to_host'])} to host, {_human(s['bytes_from_host'])} from host, target read {_human(s['media_bytes'])}, {s['seconds']:.3f}s", file=sys.stderr)
    return 0

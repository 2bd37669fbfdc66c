# SPDX-License-Identifier: Apache-2.0
"""Swift's object audit, offloaded: ``insitu scrub --swift-dir DIR [--devices DIR]``.

``swift-object-auditor`` reads every ``.data`` file through the host and compares its MD5
with the ``ETag`` in the file's metadata. Here each target computes the MD5 of the files it
holds (the ``md5`` kernel, one EXEC per file) and only the digests cross the link. A file
whose digest differs is quarantined the way the auditor does it: its hash directory moves to
``DEVICE/quarantined/objects-N/HASH`` and its suffix is marked in the partition's
``hashes.invalid``, so Swift's replicator or reconstructor restores it from the others.

Devices are audited independently, all at once. A device that cannot be read (its target
does not answer, it is not mounted, its file system fails), before or during the audit, is
skipped and reported under ``unreachable``, and the others are audited: Swift's auditor
does the same with an unmounted device. The exit status tells the outcomes apart
(:data:`EXIT_STATUSES`).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .. import _native
from .resolve import SwiftError, devices_root, read_metadata
from .offload import _attachments, _human, _reachable


#: Exit statuses of ``insitu scrub --swift-dir``. 1 and 4 are bits, as in fsck's statuses:
#: 5 is both. 2 is alone: nothing was scrubbed.
EXIT_CLEAN = 0  # every device audited, nothing corrupt
EXIT_CORRUPT = 1  # corrupt files found and quarantined
EXIT_ERROR = 2  # bad usage, or no devices directory: nothing was scrubbed
EXIT_INCOMPLETE = 4  # some devices unreachable or some files unreadable: not everything was audited

EXIT_STATUSES = f"""\
exit status:
  {EXIT_CLEAN}  every device was audited and every file matched its ETag
  {EXIT_CORRUPT}  corrupt files were found and quarantined; every device was audited
  {EXIT_ERROR}  usage error, or no devices directory: nothing was scrubbed
  {EXIT_INCOMPLETE}  not everything was audited: some devices are unreachable (skipped, listed under
     "unreachable") or some files could not be read ("unreadable"); no corruption in the rest
  {EXIT_CORRUPT | EXIT_INCOMPLETE}  both: corrupt files were quarantined, and not everything was audited

A device is unreachable when its target does not answer, when it is not a mounted insitu
namespace, or when its file system fails (EIO after the target went away), also when that
happens during the scrub. The other devices are audited as usual, as swift-object-auditor
skips an unmounted device and audits the rest."""


def device_problem(dev: Path, attached: Dict[str, str]) -> Optional[str]:
    """Why device directory ``dev`` cannot be audited now, or None when it can: its target
    (``attached``: mount -> URL, see :func:`insitu.swift.offload._attachments`) does not
    answer, it is not a mounted insitu namespace, or its file system fails."""
    real = os.path.realpath(dev)
    url = attached.get(real)
    if url is not None:
        if not _reachable(url):
            return f"its target {url} does not answer"
    elif not os.path.ismount(real):
        return f"not a mounted insitu namespace: {dev} has no target"
    try:
        os.listdir(dev)  # a file system shut down after I/O errors fails here
    except OSError as e:
        return f"its file system cannot be read: {e.strerror or e} ({dev}); one shut down after I/O errors (see dmesg) must be mounted again"
    return None


def device_files(dev: Path) -> List[Path]:
    """Every ``.data`` file under the object directories of device ``dev``, in a stable
    order; an ``OSError`` if any directory cannot be listed."""
    out: List[Path] = []

    def fail(e: OSError) -> None:
        raise e

    for name in sorted(os.listdir(dev)):
        if name != "objects" and not name.startswith("objects-"):
            continue
        for dirpath, dirs, files in os.walk(dev / name, onerror=fail):
            dirs.sort()
            out.extend(Path(dirpath) / f for f in sorted(files) if f.endswith(".data"))
    return out


def devices_under(root: Path) -> List[Path]:
    """The device directories under ``root``. A mount point whose file system fails is a
    device too (it is audited as unreachable), not a reason to stop."""
    out = []
    with os.scandir(root) as it:
        for entry in it:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = True  # cannot even be stat'ed: a device whose file system failed
            if is_dir:
                out.append(root / entry.name)
    return sorted(out)


def quarantine(device: Path, data_file: Path) -> Path:
    """Moves the object's hash directory to quarantine and invalidates its suffix, as
    Swift's ``quarantine_renamer`` does; returns where it went."""
    hash_dir = data_file.parent
    suffix_dir = hash_dir.parent
    partition_dir = suffix_dir.parent
    objects = partition_dir.parent.name
    with open(partition_dir / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(partition_dir / "hashes.invalid", "a") as inv:
            inv.write(suffix_dir.name + "\n")
    dest = device / "quarantined" / objects / hash_dir.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(hash_dir, dest)
    except OSError:
        dest = dest.with_name(f"{dest.name}-{uuid.uuid4().hex}")
        os.rename(hash_dir, dest)
    return dest


def _md5(paths: List[Path], conventional: bool) -> Dict[str, Any]:
    return json.loads(_native.exec_json("md5", [str(f) for f in paths], [], conventional, None, False))


def _add_stats(total: Dict[str, int], s: Dict[str, Any]) -> None:
    for k in total:
        total[k] += s[k]


def audit_device(dev: Path, attached: Dict[str, str], conventional: bool) -> Dict[str, Any]:
    """Audits one device: MD5 of every ``.data`` file on its target, compared with the
    file's ETag, mismatches quarantined. Never raises for the device's own failures: a
    device that cannot be read (before or during the audit) comes back with ``unreachable``
    set, a file that cannot be read while its device can is in ``unreadable``."""
    out: Dict[str, Any] = {
        "device": dev.name,
        "files": 0,
        "bytes": 0,
        "corrupt": [],
        "unreadable": [],
        "unreachable": None,
        "stats": {"bytes_to_host": 0, "bytes_from_host": 0, "media_bytes": 0, "commands": 0},
    }
    problem = device_problem(dev, attached)
    if problem is not None:
        out["unreachable"] = problem
        return out
    try:
        files = device_files(dev)
    except OSError as e:
        out["unreachable"] = device_problem(dev, attached) or f"its objects cannot be listed: {e}"
        return out
    digests: List[Tuple[Path, str]] = []
    try:
        report = _md5(files, conventional) if files else {"results": [], "stats": out["stats"]}
        digests = [(f, r["value"]) for f, r in zip(files, report["results"])]
        _add_stats(out["stats"], report["stats"])
    except (_native.InsituError, OSError) as e:
        # The device went away, or one file failed: which one, file by file.
        problem = device_problem(dev, attached)
        if problem is not None:
            out["unreachable"] = f"{problem} (during the scrub: {e})"
            return out
        for f in files:
            try:
                one = _md5([f], conventional)
            except (_native.InsituError, OSError) as e1:
                problem = device_problem(dev, attached)
                if problem is not None:
                    out["unreachable"] = f"{problem} (during the scrub: {e1})"
                    break
                out["unreadable"].append({"path": str(f), "device": dev.name, "error": str(e1)})
                continue
            digests.append((f, one["results"][0]["value"]))
            _add_stats(out["stats"], one["stats"])
    out["files"] = len(digests)  # audited: their MD5 was computed
    for f, md5 in digests:
        try:
            out["bytes"] += f.stat().st_size
            etag = read_metadata(f).get("ETag")
        except (SwiftError, OSError) as e:
            out["unreadable"].append({"path": str(f), "device": dev.name, "error": str(e)})
            continue
        if etag != md5:
            entry = {"path": str(f), "device": dev.name, "etag": etag, "md5": md5}
            try:
                entry["quarantined"] = str(quarantine(dev, f))
            except OSError as e:
                entry["quarantined"] = None
                entry["error"] = f"could not be quarantined: {e}"
            out["corrupt"].append(entry)
    return out


def scrub(swift_dir: Path, devices: Optional[Path], conventional: bool = False) -> Dict[str, Any]:
    """Verifies every ``.data`` file on every device that can be read, all devices at once;
    returns the report. Devices that cannot be read are listed in ``unreachable``."""
    started = time.monotonic()
    root = devices_root(swift_dir, devices)
    if not root.is_dir():
        raise SwiftError(f"{root}: no devices directory (pass --devices)")
    attached = _attachments()
    devs = devices_under(root)
    with ThreadPoolExecutor(max_workers=max(1, min(64, len(devs)))) as pool:
        audits = list(pool.map(lambda d: audit_device(d, attached, conventional), devs))
    s = {"bytes_to_host": 0, "bytes_from_host": 0, "media_bytes": 0, "commands": 0}
    for a in audits:
        _add_stats(s, a["stats"])
    size = sum(a["bytes"] for a in audits)
    link = s["bytes_to_host"] + s["bytes_from_host"]
    return {
        "mode": "conventional" if conventional else "offload",
        "devices": len(devs),
        "files": sum(a["files"] for a in audits),
        "bytes": size,
        "corrupt": [c for a in audits for c in a["corrupt"]],
        "unreadable": [u for a in audits for u in a["unreadable"]],
        "unreachable": [{"device": a["device"], "error": a["unreachable"]} for a in audits if a["unreachable"] is not None],
        "bytes_to_host": s["bytes_to_host"],
        "bytes_from_host": s["bytes_from_host"],
        "link_bytes": link,
        "link_share": link / size if size else 0.0,
        "target_read_bytes": s["media_bytes"],
        "commands": s["commands"],
        "seconds": time.monotonic() - started,
    }


def exit_status(report: Dict[str, Any]) -> int:
    """The exit status of a scrub that ran (see :data:`EXIT_STATUSES`)."""
    rc = EXIT_CORRUPT if report["corrupt"] else EXIT_CLEAN
    if report["unreachable"] or report["unreadable"]:
        rc |= EXIT_INCOMPLETE
    return rc


def main(argv: List[str]) -> int:
    """``insitu scrub --swift-dir DIR ...``; ``argv`` follows the word ``scrub``."""
    p = argparse.ArgumentParser(
        prog="insitu scrub",
        description="Swift's object audit offloaded: every fragment archive's and object file's MD5 is computed on\n"
        "the target that holds it and checked against its ETag; a mismatch is quarantined as\n"
        "swift-object-auditor does, for Swift to rebuild. A device that cannot be read is skipped\n"
        'and reported ("unreachable: device dN skipped, not audited: WHY"); the others are audited.',
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--swift-dir", type=Path, required=True, help="directory with swift.conf and the rings (an `insitu swift up` directory works as is)")
    p.add_argument("--devices", type=Path, help="where the devices are mounted (default: SWIFT_DIR/node if present, else /srv/node)")
    p.add_argument("--conventional", action="store_true", help="read every file through the host instead (the auditor's way), for comparison")
    p.add_argument("--json", action="store_true", help='print the report as JSON (unreachable devices under "unreachable": [{"device", "error"}])')
    a = p.parse_args(argv)
    try:
        r = scrub(a.swift_dir, a.devices, a.conventional)
    except (SwiftError, _native.InsituError, OSError) as e:
        print(f"insitu: {e}", file=sys.stderr)
        return EXIT_ERROR
    if a.json:
        print(json.dumps(r, indent=2))
        for u in r["unreachable"]:
            print(f"insitu: device {u['device']} skipped, not audited: {u['error']}", file=sys.stderr)
    else:
        for c in r["corrupt"]:
            where = c["quarantined"] if c["quarantined"] else f"NOT quarantined: {c['error']}"
            print(f"corrupt: {c['path']} (md5 {c['md5']}, ETag {c['etag']}) -> {where}")
        for u in r["unreadable"]:
            print(f"unreadable: {u['path']}: {u['error']}")
        for u in r["unreachable"]:
            print(f"unreachable: device {u['device']} skipped, not audited: {u['error']}")
        down = r["unreachable"]
        devices = f"{r['devices'] - len(down)} of {r['devices']} devices" + (
            f" ({len(down)} unreachable: {', '.join(u['device'] for u in down)})" if down else ""
        )
        print(
            f"{r['files']} files, {_human(r['bytes'])} on {devices}; {len(r['corrupt'])} quarantined; link {_human(r['link_bytes'])} ({100 * r['link_share']:.3f}% of the data), target read {_human(r['target_read_bytes'])}, {r['seconds']:.2f}s"
        )
    return exit_status(r)

# SPDX-License-Identifier: Apache-2.0
"""Swift's object audit, offloaded: ``insitu scrub --swift-dir DIR [--devices DIR]``.

``swift-object-auditor`` reads every ``.data`` file through the host and compares its MD5
with the ``ETag`` in the file's metadata. Here each target computes the MD5 of the files it
holds (the ``md5`` kernel, one EXEC per file) and only the digests cross the link. A file
whose digest differs is quarantined the way the auditor does it: its hash directory moves to
``DEVICE/quarantined/objects-N/HASH`` and its suffix is marked in the partition's
``hashes.invalid``, so Swift's replicator or reconstructor restores it from the others.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .. import _native
from .resolve import SwiftError, devices_root, read_metadata
from .offload import _human, device_check


def data_files(root: Path) -> List[Tuple[Path, Path]]:
    """Every ``.data`` file under the object directories of every device: (device, file)."""
    out = []
    check = device_check()
    for dev in sorted(p for p in root.iterdir() if p.is_dir()):
        if not check(dev):
            print(f"insitu: skipping {dev.name}: its target does not answer", file=sys.stderr)
            continue
        for objects in sorted(d for d in dev.iterdir() if d.name == "objects" or d.name.startswith("objects-")):
            for dirpath, _dirs, files in os.walk(objects):
                out.extend((dev, Path(dirpath) / f) for f in sorted(files) if f.endswith(".data"))
    return out


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


def scrub(swift_dir: Path, devices: Optional[Path], conventional: bool = False) -> Dict[str, Any]:
    """Verifies every ``.data`` file; returns the report."""
    started = time.monotonic()
    root = devices_root(swift_dir, devices)
    if not root.is_dir():
        raise SwiftError(f"{root}: no devices directory (pass --devices)")
    files = data_files(root)
    report = json.loads(_native.exec_json("md5", [str(f) for _, f in files], [], conventional, None, False)) if files else {"results": [], "stats": {"bytes_to_host": 0, "bytes_from_host": 0, "media_bytes": 0, "commands": 0}}
    corrupt, unreadable, size = [], [], 0
    for (dev, f), r in zip(files, report["results"]):
        size += f.stat().st_size
        try:
            etag = read_metadata(f).get("ETag")
        except SwiftError as e:
            unreadable.append({"path": str(f), "error": str(e)})
            continue
        if etag != r["value"]:
            to = quarantine(dev, f)
            corrupt.append({"path": str(f), "device": dev.name, "etag": etag, "md5": r["value"], "quarantined": str(to)})
    s = report["stats"]
    return {
        "mode": "conventional" if conventional else "offload",
        "files": len(files),
        "bytes": size,
        "corrupt": corrupt,
        "unreadable": unreadable,
        "bytes_to_host": s["bytes_to_host"],
        "bytes_from_host": s["bytes_from_host"],
        "link_bytes": s["bytes_to_host"] + s["bytes_from_host"],
        "link_share": (s["bytes_to_host"] + s["bytes_from_host"]) / size if size else 0.0,
        "target_read_bytes": s["media_bytes"],
        "commands": s["commands"],
        "seconds": time.monotonic() - started,
    }


def main(argv: List[str]) -> int:
    """``insitu scrub --swift-dir DIR ...``; ``argv`` follows the word ``scrub``."""
    p = argparse.ArgumentParser(prog="insitu scrub", description="Swift's object audit offloaded: every fragment archive's and object file's MD5 is computed on the target that holds it and checked against its ETag; a mismatch is quarantined as swift-object-auditor does, for Swift to rebuild. Exits 1 when anything was quarantined.")
    p.add_argument("--swift-dir", type=Path, required=True, help="directory with swift.conf and the rings (an `insitu swift up` directory works as is)")
    p.add_argument("--devices", type=Path, help="where the devices are mounted (default: SWIFT_DIR/node if present, else /srv/node)")
    p.add_argument("--conventional", action="store_true", help="read every file through the host instead (the auditor's way), for comparison")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    a = p.parse_args(argv)
    try:
        r = scrub(a.swift_dir, a.devices, a.conventional)
    except (SwiftError, _native.InsituError, OSError) as e:
        print(f"insitu: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(r, indent=2))
    else:
        for c in r["corrupt"]:
            print(f"corrupt: {c['path']} (md5 {c['md5']}, ETag {c['etag']}) -> {c['quarantined']}")
        for u in r["unreadable"]:
            print(f"unreadable: {u['path']}: {u['error']}")
        print(f"{r['files']} files, {_human(r['bytes'])}; {len(r['corrupt'])} quarantined; link {_human(r['link_bytes'])} ({100 * r['link_share']:.3f}% of the data), target read {_human(r['target_read_bytes'])}, {r['seconds']:.2f}s")
    return 1 if r["corrupt"] else 0

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Swift's object audit offloaded vs swift-object-auditor, on one erasure-coded cluster.

Brings up `insitu swift up DIR --ec K+M` over embedded targets, stores OBJECTS objects of
SIZE random bytes, and verifies every fragment archive three ways: `insitu scrub
--swift-dir` (MD5 on the target holding each file, only digests on the link), `insitu
scrub --conventional` (the host reads every file through the attached file system), and one
full pass of Swift's own `swift-object-auditor` (unthrottled). Caches are dropped before
each. Writes bench/results/swift-scrub.{json,md}. The paper reports offloaded scrubbing 2x
faster with 99% less traffic.

Usage: bench/swift_scrub.py [--objects N] [--size 16M] [--ec 4+2]; --from-json FILE
re-renders. $INSITU overrides the insitu command (default: .venv/bin/insitu).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import report
from insitu._units import parse_size


def drop_caches() -> None:
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def measure(a: argparse.Namespace) -> dict:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
    from insitu.swift import client

    d = tempfile.mkdtemp(prefix="insitu-swift-bench-", dir="/var/tmp")
    try:
        up, _ = report.run(["swift", "up", d, "--ec", a.ec, "--size", a.device_size])
        url, token = client.auth(up["auth"], up["user"], up["key"])
        client.put_container(url, token, "bench")
        size = parse_size(a.size)
        for i in range(a.objects):
            client.put_object(url, token, "bench", f"o{i}", os.urandom(size))
        runs = {}
        for name, args in (("offload", ["scrub", "--swift-dir", d]), ("conventional", ["scrub", "--swift-dir", d, "--conventional"])):
            drop_caches()
            runs[name], _ = report.run(args)
        drop_caches()
        t0 = time.monotonic()
        auditor, _ = report.run(["swift", "once", d, "auditor"])
        auditor["bench_wall_s"] = time.monotonic() - t0
        return {
            "ec": a.ec,
            "objects": a.objects,
            "object_bytes": size,
            "cpus": os.cpu_count(),
            "files": runs["offload"]["files"],
            "bytes": runs["offload"]["bytes"],
            "offload": runs["offload"],
            "conventional": runs["conventional"],
            "auditor": auditor,
            "auditor_s": auditor["wall_s"],
            "offload_speedup_vs_auditor": auditor["wall_s"] / runs["offload"]["seconds"],
            "offload_speedup_vs_conventional": runs["conventional"]["seconds"] / runs["offload"]["seconds"],
            "link_reduction_vs_conventional": 1 - runs["offload"]["link_bytes"] / max(1, runs["conventional"]["link_bytes"]),
        }
    finally:
        subprocess.run([report.INSITU, "swift", "down", d], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def markdown(r: dict) -> str:
    o, c = r["offload"], r["conventional"]
    s = "# Swift object audit: offloaded vs on the host\n\n"
    s += f"`bench/swift_scrub.py --objects {r['objects']} --size {r['object_bytes'] >> 20}M --ec {r['ec']}` on {r['cpus']} CPUs: "
    s += f"{r['files']} fragment archives, {r['bytes'] / 1e6:.1f} MB, one XFS on an insitu target per device, caches dropped before each pass.\n\n"
    s += "| pass | seconds | link bytes | link share of the data |\n|---|---:|---:|---:|\n"
    s += f"| `insitu scrub --swift-dir` (MD5 on the targets) | {o['seconds']:.2f} | {o['link_bytes']} | {100 * o['link_share']:.3f}% |\n"
    s += f"| `insitu scrub --swift-dir --conventional` (host reads) | {c['seconds']:.2f} | {c['link_bytes']} | {100 * c['link_share']:.1f}% |\n"
    s += f"| `swift-object-auditor` once (unthrottled, Python start included) | {r['auditor_s']:.2f} | every byte | 100% |\n\n"
    s += f"Offloaded scrub: {r['offload_speedup_vs_auditor']:.2f}x the auditor's speed, {r['offload_speedup_vs_conventional']:.2f}x the host's, "
    s += f"{100 * r['link_reduction_vs_conventional']:.2f}% less link traffic.\n"
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_options(ap)
    ap.add_argument("--objects", type=int, default=8)
    ap.add_argument("--size", default="16M")
    ap.add_argument("--ec", default="4+2")
    ap.add_argument("--device-size", default="512M")
    a = ap.parse_args()
    if a.from_json:
        report.rerender(a.from_json, markdown, None, a.out)
        return 0
    report.write(measure(a), "swift-scrub", markdown, None, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

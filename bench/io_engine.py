#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The offload kernels' I/O engine: an embedded crc32c EXEC (its read path, end to end) vs
crc32c over the same bytes read on one thread through io_uring (direct I/O, registered
buffers, several reads in flight, polled completions). io-engine-pread.* is the run made
before EXEC's read path moved from one pread at a time to io_uring.

Runs `insitu bench io-engine ARGS` and writes bench/results/io-engine.{json,md,png}.
Usage: bench/io_engine.py [--out DIR] [-- --size 1G --repeat 3 --dir DIR]; --from-json FILE
re-renders a result. $INSITU overrides the insitu command (default: .venv/bin/insitu).
"""

import sys

import report


def label(x: dict) -> str:
    return f"{x['engine']}, {x['chunk_bytes'] >> 10} KiB x {x['depth']}"


def markdown(r: dict) -> str:
    s = "# I/O engine for offload kernels: EXEC's read path vs io_uring scans\n\n"
    s += f"`{r['command']}` on {r['machine']['cpus']} CPUs, kernel {r['machine']['kernel']}; {r['size_bytes'] >> 20} MiB file, "
    s += f"direct I/O {'on' if r['direct_io'] else 'off'}, {r['kernel']} over all of it, median of {r['repeat']}, cold caches. "
    s += f"All digests agree ({r['digest']}).\n\n| engine, chunk x reads in flight | GB/s | vs the first row |\n|---|---:|---:|\n"
    today = r["results"][0]["gbps"]
    for x in r["results"]:
        s += f"| {label(x)} | {x['gbps']:.3f} | {x['gbps'] / today:.2f}x |\n"
    best = r.get("best_uring_to_exec", r.get("best_uring_to_today"))
    s += f"\nBest io_uring scan: **{best:.2f}x** the first row.\n"
    return s


def plot(r: dict, plt):
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    labels = [label(x) for x in r["results"]]
    vals = [x["gbps"] for x in r["results"]]
    ax.barh(labels, vals, color=["#888888"] + ["#2a7ab9"] * (len(vals) - 1))
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.2f}", va="center")
    ax.set_xlim(0, max(vals) * 1.2)
    ax.invert_yaxis()
    ax.set_xlabel("GB/s (median, cold cache)")
    ax.set_title("crc32c over a file: read path of offload kernels")
    return fig


if __name__ == "__main__":
    sys.exit(report.passthrough_main("io-engine", __doc__, markdown, plot))

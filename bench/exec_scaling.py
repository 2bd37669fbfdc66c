#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Concurrent EXECs: crc32c throughput on one memory-backed namespace with 1, 2, 4 and 8
EXECs at once, with the namespace's buffer pool and without it, and the pool's memory.

Runs `insitu bench exec-scaling` and writes bench/results/exec-scaling.{json,md,png}.
Usage: bench/exec_scaling.py [--object-size 4M] [--objects 64] [--rounds 4] [--repeat 3]
[--dir DIR] [--out DIR]; --from-json FILE re-renders a result. $INSITU overrides the
insitu command (default: .venv/bin/insitu).
"""

import argparse
import sys

import report


def markdown(r: dict) -> str:
    rows = r["results"]
    s = "# Concurrent EXECs on one namespace: the buffer pool\n\n"
    s += f"`{r['command']}` on {r['machine']['cpus']} CPUs ({r['machine']['cpu_model']}), kernel {r['machine']['kernel']}; "
    s += f"{r['function']} EXECs of {r['object_size_bytes'] >> 20} MiB each over {r['objects']} objects, {r['rounds']} passes per "
    s += f"measurement, median of {r['repeat']}, file in {r['work_dir'].rsplit('/', 1)[0]} (memory). Device model: {r['model']}.\n\n"
    s += "| EXECs at once | with the pool, GB/s | EXECs/s | without a pool, GB/s | pool / no pool |\n|---:|---:|---:|---:|---:|\n"
    for n in r["streams"]:
        p = next(x for x in rows if x["streams"] == n and x["pooled"])
        u = next(x for x in rows if x["streams"] == n and not x["pooled"])
        s += f"| {n} | {p['gbps']:.3f} | {p['execs_per_s']:.0f} | {u['gbps']:.3f} | {p['gbps'] / u['gbps']:.2f}x |\n"
    sc, pool = r["scaling"], r["pool"]
    s += f"\n{sc['to_streams']} EXECs at once vs {sc['from_streams']}: **{sc['pooled_max_to_one']:.2f}x** with the pool, "
    s += f"{sc['unpooled_max_to_one']:.2f}x without. The pool's buffers are {pool['buffer_bytes'] >> 10} KiB; it keeps at most "
    s += f"{pool['max_idle']} idle and held at most {pool['peak_bytes'] / 2**20:.1f} MiB; {pool['reuses']} of "
    s += f"{pool['reuses'] + pool['allocations']} buffer takes reused a buffer.\n"
    return s


def plot(r: dict, plt):
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for pooled, label, color in ((True, "buffer pool", "#2a7ab9"), (False, "fresh buffers", "#b0b0b0")):
        pts = sorted((x["streams"], x["gbps"]) for x in r["results"] if x["pooled"] == pooled)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, color=color)
    ax.set_xlabel("EXECs at once")
    ax.set_ylabel("GB/s (median)")
    ax.set_xticks(r["streams"])
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title(f"crc32c EXECs of {r['object_size_bytes'] >> 20} MiB, memory-backed namespace")
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--object-size", default="4M")
    ap.add_argument("--objects", default="64")
    ap.add_argument("--rounds", default="4")
    ap.add_argument("--repeat", default="3")
    ap.add_argument("--dir", default=None)
    report.add_options(ap)
    a = ap.parse_args()
    if a.from_json:
        report.rerender(a.from_json, markdown, plot, a.out)
        return 0
    args = ["bench", "exec-scaling", "--object-size", a.object_size, "--objects", a.objects, "--rounds", a.rounds, "--repeat", a.repeat]
    if a.dir:
        args += ["--dir", a.dir]
    r, _ = report.run(args)
    report.write(r, "exec-scaling", markdown, plot, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

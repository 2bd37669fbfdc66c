#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Key-value stacks (HAYAGUI): the same engine on the target's direct stack, on the host over
an attached remote namespace (redirect) and over the kernel's file system on a loop device
(syscall); YCSB A-F and db_bench fills and reads; throughput and p50/p99 latency.

Runs `insitu bench kv` (as root: the redirection stack attaches a namespace) and writes
bench/results/kv.{json,md,png}. Usage: bench/kv.py [-- --records N --operations N
--workloads a,b,... --systems direct,redirect,syscall --link 25gbe]; --from-json FILE
re-renders a result. $INSITU overrides the insitu command (default: .venv/bin/insitu).
"""

import json
import sys

import report

SYSTEMS = ["direct", "redirect", "syscall"]


def _workloads(r: dict) -> list:
    seen = []
    for row in r["results"]:
        if row["workload"] not in seen:
            seen.append(row["workload"])
    return seen


def markdown(r: dict) -> str:
    rows = {(x["workload"], x["system"]): x for x in r["results"]}
    s = "# Key-value stacks: direct vs redirection vs system calls\n\n"
    s += f"`{r['command']}` on {r['machine']['cpus']} CPUs, kernel {r['machine']['kernel']}. {r['engine']}. "
    s += f"YCSB: {r['records']} records of {r['ycsb']['field_count']} x {r['ycsb']['field_bytes']} B, "
    s += f"{r['operations']} operations per workload, Zipfian {r['ycsb']['zipfian_constant']}; db_bench: {r['db_bench']['entries']} entries. "
    s += f"Redirection crosses NVMe/TCP paced as {r['link']}. Every value read was checked against what was written.\n\n"
    if "drive_applied" in r:
        s += f"Drive model `{r['drive']}` on every stack:\n\n"
        for sname in SYSTEMS:
            if sname in r["drive_applied"]:
                how = r["drive_applied"][sname]
                s += f"- {sname}: {how if isinstance(how, str) else json.dumps(how)}\n"
        s += "\n"
    s += "| workload | system | ops/s | p50 µs | p99 µs | direct / this |\n|---|---|---:|---:|---:|---:|\n"
    for w in _workloads(r):
        d = rows.get((w, "direct"))
        for sname in SYSTEMS:
            x = rows.get((w, sname))
            if not x:
                continue
            ratio = f"{d['ops_per_s'] / x['ops_per_s']:.2f}x" if d and sname != "direct" else ""
            s += f"| {w} | {sname} | {x['ops_per_s']:.0f} | {x['p50_us']:.1f} | {x['p99_us']:.1f} | {ratio} |\n"
    return s


def plot(r: dict, plt):
    import numpy as np

    names = _workloads(r)
    rows = {(x["workload"], x["system"]): x for x in r["results"]}
    fig, ax = plt.subplots(figsize=(max(6.4, 0.7 * len(names) + 2), 3.6))
    width = 0.27
    colors = {"direct": "#2a7ab9", "redirect": "#d98c3a", "syscall": "#8a8a8a"}
    for i, sname in enumerate(SYSTEMS):
        vals = [rows[(w, sname)]["ops_per_s"] if (w, sname) in rows else 0 for w in names]
        ax.bar(np.arange(len(names)) + (i - 1) * width, vals, width, label=sname, color=colors[sname])
    ax.set_xticks(np.arange(len(names)))
    ax.set_xticklabels(names, rotation=45, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("operations/s (log)")
    ax.set_title("Same engine, three storage stacks")
    ax.legend()
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(report.passthrough_main("kv", __doc__, markdown, plot))

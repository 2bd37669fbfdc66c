#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Scan benchmark: raw direct reads vs offloaded checksum vs conventional host path.

Runs `insitu bench scan` (all three measured in one run, cold caches, medians) and writes
bench/results/scan-FUNCTION.{json,md,png}. Usage: bench/scan.py [--function crc32c]
[--size 512M] [--repeat 3] [--out DIR]; bench/scan.py --from-json FILE re-renders a result.
"""

import argparse
import sys

import report


def markdown(r: dict) -> str:
    fn = r["function"]
    s = f"# Scan: offloaded {fn} vs raw read\n\n"
    s += f"`{r['command']}` on {r['machine']['cpus']} CPUs, kernel {r['machine']['kernel']}; "
    s += f"{r['size_bytes'] >> 20} MiB file on a loop-mounted ext4 image, median of {r['repeat']}, cold caches. "
    s += f"Device model: {r['model']}.\n\n"
    s += "| path | GB/s | vs raw |\n|---|---:|---:|\n"
    for k, label in (
        ("raw_read_gbps", "raw direct read of the file's extents"),
        ("offload_gbps", f"offloaded {fn} (EXEC)"),
        ("conventional_gbps", f"host {fn}, read through the file system"),
    ):
        s += f"| {label} | {r[k]:.3f} | {r[k] / r['raw_read_gbps']:.1%} |\n"
    return s


def plot(r: dict, plt):
    fig, ax = plt.subplots(figsize=(6, 3.2))
    labels = ["raw read", f"offload {r['function']}", "conventional"]
    vals = [r["raw_read_gbps"], r["offload_gbps"], r["conventional_gbps"]]
    ax.barh(labels, vals, color=["#888888", "#2a7ab9", "#d9822b"])
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.2f}", va="center")
    ax.set_xlabel("GB/s (median, cold cache)")
    ax.set_title(f"Scan of {r['size_bytes'] >> 20} MiB — no device model, real speed")
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--function", default="crc32c")
    ap.add_argument("--size", default="512M")
    ap.add_argument("--repeat", default="3")
    report.add_options(ap)
    a = ap.parse_args()
    if a.from_json:
        report.rerender(a.from_json, markdown, plot, a.out)
        return 0
    r, _ = report.run(["bench", "scan", "--function", a.function, "--size", a.size, "--repeat", a.repeat])
    report.write(r, f"scan-{a.function}", markdown, plot, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

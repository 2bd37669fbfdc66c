#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fabric benchmark: what NVMe/TCP costs next to local access to the same file.

Runs `insitu bench fabric` (raw direct reads, 1 MiB at QD1, 128 KiB at QD32 and 1 MiB in 4 streams, vs 128 KiB reads at queue depth 32 over
NVMe/TCP on loopback (host reads from the page cache, and with direct I/O) vs plain TCP on loopback serving the same file with the same requests,
and from a buffer in cache; embedded EXEC crc32c
vs the same EXEC over the fabric; all measured in one run, cold caches, medians) and writes bench/results/fabric.{json,md,png}.
Usage: bench/fabric.py [--size 1G] [--repeat 3] [--dir DIR] [--name NAME] [--out DIR]; bench/fabric.py
--from-json FILE re-renders a result. $INSITU overrides the insitu command (default:
.venv/bin/insitu).
"""

import argparse
import sys

import report


def markdown(r: dict) -> str:
    q = r["requests"]
    s = "# Fabric: NVMe/TCP on loopback vs local access\n\n"
    s += f"`{r['command']}` on {r['machine']['cpus']} CPUs, kernel {r['machine']['kernel']}; "
    s += f"{r['size_bytes'] >> 20} MiB file, direct I/O {'on' if r['direct_io'] else 'off'}, "
    s += f"median of {r['repeat']}, cold caches, odd rounds in the reverse order. {r['transport']}. Device model: {r['model']}.\n\n"
    s += "| path | GB/s | ratio |\n|---|---:|---:|\n"
    s += f"| raw direct read, {q['raw_read_bytes'] >> 10} KiB requests, QD{q['raw_queue_depth']} | {r['raw_read_gbps']:.3f} | |\n"
    if "raw_read_shaped_gbps" in r:
        s += f"| raw direct read, {q['fabric_read_bytes'] >> 10} KiB requests, QD{q['fabric_queue_depth']} (the fabric read's shape) | {r['raw_read_shaped_gbps']:.3f} | |\n"
    if "raw_read_streams_gbps" in r:
        s += (
            f"| raw direct read, {q['raw_read_bytes'] >> 10} KiB requests in {q['io_queues']} streams of 8 MiB spans (as the fabric "
            f"read's queues read the file) | {r['raw_read_streams_gbps']:.3f} | |\n"
        )
    cached = " (host reads from the page cache, the target's default)" if "fabric_read_direct_gbps" in r else ""
    s += (
        f"| fabric read, {q['fabric_read_bytes'] >> 10} KiB requests, QD{q['fabric_queue_depth']} on {q['io_queues']} queues{cached} "
        f"| {r['fabric_read_gbps']:.3f} | {r['fabric_read_to_raw']:.1%} of raw"
        + (f", {r['fabric_read_to_raw_shaped']:.1%} of raw at its shape" if "raw_read_shaped_gbps" in r else "")
        + (f", {r['fabric_read_to_raw_streams']:.1%} of raw in its streams" if "raw_read_streams_gbps" in r else "")
        + " |\n"
    )
    if "fabric_read_to_raw_paired" in r:
        s += (
            f"| fabric read over raw within each round (median of the rounds' ratios) | | "
            f"{r['fabric_read_to_raw_paired']:.1%} of raw, {r['fabric_read_to_raw_shaped_paired']:.1%} of raw at its shape"
            + (f", {r['fabric_read_to_raw_streams_paired']:.1%} of raw in its streams" if "raw_read_streams_gbps" in r else "")
            + " |\n"
        )
    if "fabric_read_direct_gbps" in r:
        how = " (media in memory: it sends from the page cache all the same)" if r.get("in_memory") else ""
        s += (
            f"| fabric read, the same, from a target started with `--direct-reads`{how} | {r['fabric_read_direct_gbps']:.3f} | "
            f"{r['fabric_read_direct_to_raw']:.1%} of raw, {r['fabric_read_direct_to_raw_paired']:.1%} within each round; "
            f"the default's fabric read is {r['fabric_read_to_direct_paired']:.2f}x it within each round |\n"
        )
    if "tcp_loopback_cached_gbps" in r:
        s += f"| plain TCP on loopback serving the file (sendfile), the same requests, connections and buffers, no NVMe framing | {r['tcp_loopback_gbps']:.3f} | "
        s += f"fabric read {r['fabric_read_to_tcp']:.1%} of it |\n"
        s += f"| plain TCP on loopback from a buffer in cache (what iperf3 measures) | {r['tcp_loopback_cached_gbps']:.3f} | "
        s += f"fabric read {r['fabric_read_to_tcp_cached']:.1%} of it |\n"
    elif "tcp_loopback_gbps" in r:
        s += f"| plain TCP on loopback, the same requests and connections, no NVMe framing | {r['tcp_loopback_gbps']:.3f} | "
        s += f"fabric read {r['fabric_read_to_tcp']:.1%} of it |\n"
    s += f"| embedded EXEC crc32c | {r['embedded_exec_gbps']:.3f} | |\n"
    s += f"| fabric EXEC crc32c + result read | {r['fabric_exec_gbps']:.3f} | {r['fabric_exec_to_embedded']:.1%} of embedded |\n"
    if "fabric_exec_to_embedded_paired" in r:
        s += f"| fabric EXEC over embedded within each round (median of the rounds' ratios) | | {r['fabric_exec_to_embedded_paired']:.1%} of embedded |\n"
    s += "\n"
    s += f"Bytes on the wire for one fabric EXEC over {r['size_bytes'] >> 20} MiB: {r['fabric_exec_wire_bytes']} "
    s += f"(descriptor, completion, result read and PDU headers; {r['fabric_exec_wire_bytes'] / r['size_bytes']:.2e} of the data).\n"
    return s


def plot(r: dict, plt):
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    labels = ["raw read", "fabric read QD32", "embedded EXEC", "fabric EXEC"]
    vals = [r["raw_read_gbps"], r["fabric_read_gbps"], r["embedded_exec_gbps"], r["fabric_exec_gbps"]]
    colors = ["#888888", "#b0b0b0", "#2a7ab9", "#6aa8d8"]
    if "raw_read_shaped_gbps" in r:
        labels.insert(1, "raw read 128K QD32")
        vals.insert(1, r["raw_read_shaped_gbps"])
        colors.insert(1, "#9c9c9c")
    if "raw_read_streams_gbps" in r:
        labels.insert(2, "raw read 1M in 4 streams")
        vals.insert(2, r["raw_read_streams_gbps"])
        colors.insert(2, "#a6a6a6")
    if "fabric_read_direct_gbps" in r:
        at = labels.index("fabric read QD32") + 1
        labels.insert(at, "fabric read, direct I/O")
        vals.insert(at, r["fabric_read_direct_gbps"])
        colors.insert(at, "#c4c4c4")
    at = labels.index("embedded EXEC")  # the TCP ceilings go after the reads
    if "tcp_loopback_cached_gbps" in r:
        labels[at:at] = ["TCP serving the file", "TCP from cache"]
        vals[at:at] = [r["tcp_loopback_gbps"], r["tcp_loopback_cached_gbps"]]
        colors[at:at] = ["#d9d9d9", "#eeeeee"]
    elif "tcp_loopback_gbps" in r:
        labels.insert(at, "TCP loopback")
        vals.insert(at, r["tcp_loopback_gbps"])
        colors.insert(at, "#d9d9d9")
    ax.barh(labels, vals, color=colors)
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.2f}", va="center")
    ax.set_xlim(0, max(vals) * 1.15)
    ax.invert_yaxis()
    ax.set_xlabel("GB/s (median, cold cache)")
    ax.set_title(f"{r['size_bytes'] >> 20} MiB over NVMe/TCP loopback — real speed")
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--repeat", default="3")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--name", default="fabric", help="result name (default fabric), e.g. fabric-memory for a run with --dir /dev/shm/...")
    report.add_options(ap)
    a = ap.parse_args()
    if a.from_json:
        report.rerender(a.from_json, markdown, plot, a.out)
        return 0
    args = ["bench", "fabric", "--size", a.size, "--repeat", a.repeat]
    if a.dir:
        args += ["--dir", a.dir]
    r, _ = report.run(args)
    report.write(r, a.name, markdown, plot, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

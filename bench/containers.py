#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Containers on the target vs the host: grep over a text file (I/O-heavy) and sha256sum
(compute-heavy), each in a container next to the data and on the host reading over the
fabric, with the device model on (DockerSSD reports 1.3x for I/O-heavy work).

Runs `insitu bench containers` (root) and writes bench/results/containers.{json,md,png}.
Usage: bench/containers.py [-- ARGS of insitu bench containers]; --from-json FILE
re-renders a result. $INSITU overrides the insitu command (default: .venv/bin/insitu).
"""

import sys

import report


def markdown(r: dict) -> str:
    dm = r["device_model"]
    d = dm.get("derived", {})
    s = "# Containers on the target vs the host over the fabric\n\n"
    s += f"`{r['command']}` on {r['machine']['cpus']} CPUs, kernel {r['machine']['kernel']}. "
    s += f"Device model `{dm['name']}`: flash {d.get('flash_read_mb_s') or 0:.0f} MB/s, "
    s += f"to its engine {d.get('internal_read_mb_s') or 0:.0f} MB/s, to the host {d.get('host_read_mb_s') or 0:.0f} MB/s"
    c = dm.get("compute")
    if c:
        s += f"; its cores: {c['workers']} x {c['cpu_share']:g} of a host core (the containers' CPU limit)"
    s += ". A container reads `/data` through its cgroup's block-I/O throttle at the engine rate; the host reads "
    s += "through `insitu attach` (FUSE, loop device, ext4) over NVMe/TCP with the flash and link paced. "
    s += f"Cold caches, median of {r['repeat']}; container times include starting it "
    s += f"({r['container_start_s']:.2f} s for `docker run --rm IMAGE true`). Outputs agree on both sides.\n\n"
    s += "| workload | bytes | host s | container s | host MB/s | container MB/s | container / host |\n"
    s += "|---|---:|---:|---:|---:|---:|---:|\n"
    sizes = {"grep": r["size_bytes"], "sha256": r["compute_size_bytes"]}
    for x in r["results"]:
        s += (
            f"| {x['workload']} | {sizes.get(x['workload'], 0) >> 20} MiB | {x['host_s']:.2f} | {x['container_s']:.2f} | "
            f"{x['host_mb_s']:.0f} | {x['container_mb_s']:.0f} | {x['container_vs_host']:.2f}x |\n"
        )
    link = d.get("host_read_mb_s") or 0
    slow = [x["workload"] for x in r["results"] if x["workload"] == "grep" and link and x["host_mb_s"] < link / 2]
    if slow:
        s += (
            f"\nOn the host, {', '.join(slow)} ran at less than half the modelled {link:.0f} MB/s: there the limit is this "
            "machine's host software path (FUSE, loop device and the NVMe/TCP initiator sharing its cores with the target), "
            "not the modelled link. The container skips that path, which is where its advantage comes from here.\n"
        )
    return s


def plot(r: dict, plt):
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    names = [x["workload"] for x in r["results"]]
    ys = range(len(names))
    ax.barh([y - 0.2 for y in ys], [x["host_mb_s"] for x in r["results"]], height=0.4, color="#b0b0b0", label="host over the fabric")
    ax.barh([y + 0.2 for y in ys], [x["container_mb_s"] for x in r["results"]], height=0.4, color="#2a7ab9", label="container on the target")
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xlabel("MB/s (cold cache, container start included)")
    ax.set_title(f"device model {r['device_model']['name']}")
    ax.legend(loc="lower right")
    return fig


if __name__ == "__main__":
    sys.exit(report.passthrough_main("containers", __doc__, markdown, plot))

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Emulated-drive benchmarks: runs `insitu bench scrub-scaling|break-even|latency|model-check`
and writes bench/results/NAME.{json,md,png}.

Usage:
  bench/model.py all                     # the standard set (about 10 minutes on 2 cores)
  bench/model.py BENCH [--name NAME] [-- INSITU-ARGS...]
      e.g. bench/model.py scrub-scaling --name scrub-scaling-p4600-40gbe -- --drive intel-p4600 --link 40gbe
  bench/model.py scrub-scaling --name scrub-scaling-16m -- --file-size 16M
      # the paper's full size, 100 x 16 MiB per target: 12.5 GiB of images in /dev/shm

The standard set scales the scrub data down to 100 x 4 MiB per target (3.2 GiB of images).

  bench/model.py --from-json bench/results/latency.json [--out DIR]
      # re-renders the Markdown and PNG of a result

$INSITU overrides the insitu command (default: .venv/bin/insitu). The Markdown names the
drive model and link, the data sizes, the machine and the exact command.
"""

import argparse
import sys

import report

# The standard set: (result name, benchmark, arguments).
STANDARD = [
    ("model-check", "model-check", []),
    ("scrub-scaling", "scrub-scaling", ["--file-size", "4M", "--repeat", "3", "--ceiling"]),
    ("scrub-scaling-p4600-40gbe", "scrub-scaling", ["--drive", "intel-p4600", "--link", "40gbe", "--file-size", "4M", "--repeat", "3", "--ceiling"]),
    ("break-even-newport", "break-even", ["--drive", "newport"]),
    ("break-even-smartssd", "break-even", ["--drive", "smartssd"]),
    ("latency", "latency", []),
]


def drive_of(r):
    d = r.get("models", {}).get("drive")
    if not d:
        return "none (real speed)"
    der = d.get("derived", {})
    parts = [f"`{d['name']}`"]
    if der.get("internal_read_mb_s"):
        parts.append(f"{der['internal_read_mb_s']:.0f} MB/s internal read")
    if der.get("host_read_mb_s"):
        parts.append(f"{der['host_read_mb_s']:.0f} MB/s host read")
    if d.get("compute"):
        c = d["compute"]
        parts.append(f"CPU {c['workers']} x {c['cpu_share']} host core")
    return ", ".join(parts)


def link_of(r):
    link = r.get("models", {}).get("link", {})
    cfg = link.get("config")
    return f"`{link.get('name')}`" + (f" ({cfg['mb_s']:.0f} MB/s, {cfg['latency_us']} us)" if cfg else "")


def header(r, title):
    m = r["machine"]
    s = f"# {title}\n\n"
    s += f"`{r['command']}`\n\n"
    if "models" in r:
        s += f"Drive model: {drive_of(r)}. Link: {link_of(r)}.\n"
    s += f"Machine: {m['cpus']} cores ({m['cpu_model']}), {m['memory_bytes'] / 2**30:.0f} GiB, kernel {m['kernel']}.\n\n"
    return s


def scrub_md(r):
    d = r["data"]
    pts = r["points"]
    last = pts[-1]
    s = header(r, "Scrub scaling: conventional vs offloaded checksums")
    s += (
        f"{d['files_per_target']} files x {d['file_size_bytes'] / 2**20:.0f} MiB per target "
        f"({d['extents_per_file']} extent(s) each), {r['function']}, median of {r['repeat']}; images in {d['work_dir']}.\n"
        f"Conventional: {r['method']['conventional']}. Offload: {r['method']['offload']}.\n\n"
    )
    s += "| targets | conventional GB/s | offload GB/s | offload / conv. | traffic reduction | model conv. | model offload | CPU busy conv./off. | machine-limited |\n"
    s += "|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    for p in pts:
        ml = [k for k, v in p["machine_limited"].items() if v]
        em = lambda k: f"{p[k]:.3f}" if p.get(k) is not None else "-"
        s += (
            f"| {p['targets']} | {p['conventional_gbps']:.3f} | {p['offload_gbps']:.3f} | {p['offload_to_conventional']:.2f} "
            f"| {100 * p['traffic_reduction']:.4f} % | {em('expected_conventional_gbps')} | {em('expected_offload_gbps')} "
            f"| {p['cpu_busy']['conventional']:.0%} / {p['cpu_busy']['offload']:.0%} | {', '.join(ml) or '-'} |\n"
        )
    s += (
        f"\nAt {last['targets']} targets offload runs {last['offload_to_conventional']:.2f}x the conventional rate and moves "
        f"{last['offload_link_bytes']} instead of {last['conventional_link_bytes']} bytes over the link "
        f"({100 * last['traffic_reduction']:.4f} % less). Machine-limited: the pass kept at least 85 % of the cores busy, "
        "or the model asks for more than 90 % of what this machine does unpaced (`--ceiling`).\n"
    )
    return s


def scrub_plot(r, plt):
    pts = r["points"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    n = [x["targets"] for x in pts]
    ax.plot(n, [x["conventional_gbps"] for x in pts], "o-", color="#d9822b", label="conventional (pull + host checksum)")
    ax.plot(n, [x["offload_gbps"] for x in pts], "s-", color="#2a7ab9", label="offload (EXEC per file)")
    if pts[0].get("expected_conventional_gbps") is not None:
        ax.plot(n, [x["expected_conventional_gbps"] for x in pts], ":", color="#d9822b", label="model: min(N x drive, link)")
    if pts[0].get("expected_offload_gbps") is not None:
        ax.plot(n, [x["expected_offload_gbps"] for x in pts], ":", color="#2a7ab9", label="model: N x drive internal")
    if "ceiling_offload_gbps" in pts[0]:
        ax.plot(n, [x["ceiling_offload_gbps"] for x in pts], "-.", color="#999999", label="this machine, no model (offload)")
    for x in pts:
        if x["machine_limited"]["offload"]:
            ax.plot(x["targets"], x["offload_gbps"], "x", color="black", ms=9)
    seen = [x[k] for x in pts for k in ("offload_gbps", "conventional_gbps", "ceiling_offload_gbps") if x.get(k) is not None]
    top = max(seen) * 1.25
    ax.set_ylim(0, top)
    model_top = pts[-1].get("expected_offload_gbps")
    if model_top is not None and model_top > top:
        ax.annotate(
            f"model offload: {model_top:.1f} GB/s at {pts[-1]['targets']} (off scale)",
            xy=(0.98, 0.97),
            xycoords="axes fraction",
            ha="right",
            va="top",
            fontsize=8,
            color="#2a7ab9",
        )
    ax.set_xticks(n)
    ax.set_xlabel("targets behind one link")
    ax.set_ylabel("checksum throughput, GB/s")
    ax.set_title(
        f"Scrub, drive {r['models']['drive']['name'] if r['models']['drive'] else 'none'}, link {r['models']['link']['name']} (x = machine-limited)",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    return fig


def breakeven_md(r):
    ks = r["kernels"]
    s = header(r, "Kernel break-even: host vs computational drives (CSDPLAN)")
    d = r["data"]
    s += f"{d['size_bytes'] / 2**20:.0f} MiB per kernel ({d['graph_bytes'] / 2**20:.0f} MiB of PageRank edges), split evenly over 1..{d['max_drives']} drives; median of {r['repeat']}.\n\n"
    s += f"Host: {r['method']['host']}. Offload: {r['method']['offload']}. Model: {r['method']['model']}.\n\n"
    s += "| kernel | host compute s | device compute s | device/host measured | budget 1/rate (measured wall/CPU) | paper (CSDPLAN-EC Fig. 3) | T_csd(1) s | one-drive pull s | BEP model | BEP spec | BEP measured |\n"
    s += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    for k in ks:
        paper = f"{k['paper_device_to_host_ratio']:.1f}" if k["paper_device_to_host_ratio"] else "-"
        be = lambda v: str(v) if v is not None else f"> {d['max_drives']}"
        budget = f"{k['model_device_to_host_ratio']:.2f}" if k["model_device_to_host_ratio"] else "-"
        s += (
            f"| {k['kernel']} | {k['host_compute_s']:.3f} | {k['device_compute_s']:.3f} | {k['device_to_host_compute_ratio']:.2f} "
            f"| {budget} ({k['device_wall_per_cpu']:.2f}) | {paper} "
            f"| {k['csd_one_s']:.3f} | {k['model']['transfer_one_s']:.3f} | {k['break_even_model'] if k['break_even_model'] is not None else 'never'} "
            f"| {k['break_even_spec'] if k['break_even_spec'] is not None else 'never'} | {be(k['break_even_measured'])} |\n"
        )
    s += (
        "\nDevice/host measured: the kernel's wall time under the drive's CPU budget per host CPU second, data in memory "
        "(fastest of the repeats); in brackets, the budget's own ratio of wall time to the CPU time the kernel used under it "
        "(a kernel that sleeps between chunks runs on colder caches, so it can use more CPU than on the host). The budget is one number per device, so it reproduces the paper's average slowdown, "
        "not its per-kernel spread. BEP model: CSDPLAN's break-even with the measured one-drive pull; BEP spec: with the "
        "drive's specified host read rate; BEP measured: the first N at which the drives beat the host in the series below.\n"
    )
    s += "\nMeasured series (seconds; * = machine-limited: the host's pull or the offload pass kept at least 85 % of the cores busy):\n\n"
    s += "| kernel | " + " | ".join(f"N={p['drives']} host / offload" for p in ks[0]["series"]) + " |\n"
    s += "|---|" + "---:|" * len(ks[0]["series"]) + "\n"
    for k in ks:
        s += (
            f"| {k['kernel']} | "
            + " | ".join(
                f"{p['host_s']:.3f}{'*' if p.get('host_machine_limited') else ''} / {p['offload_s']:.3f}{'*' if p['machine_limited'] else ''}"
                for p in k["series"]
            )
            + " |\n"
        )
    return s


def breakeven_plot(r, plt):
    ks = r["kernels"]
    fig, axes = plt.subplots(1, len(ks), figsize=(3.4 * len(ks), 3.6), squeeze=False)
    for ax, k in zip(axes[0], ks):
        n = [x["drives"] for x in k["series"]]
        ax.plot(n, [x["host_s"] for x in k["series"]], "o-", color="#d9822b", label="host (pull + 1 core)")
        ax.plot(n, [x["offload_s"] for x in k["series"]], "s-", color="#2a7ab9", label="CSDs (EXEC)")
        ax.plot(n, [x["model_host_s"] for x in k["series"]], ":", color="#d9822b", label="model T_host(M)")
        ax.plot(n, [x["model_csd_s"] for x in k["series"]], ":", color="#2a7ab9", label="model T_csd(M)")
        for x in k["series"]:
            if x["machine_limited"]:
                ax.plot(x["drives"], x["offload_s"], "x", color="black", ms=8)
            if x.get("host_machine_limited"):
                ax.plot(x["drives"], x["host_s"], "x", color="black", ms=8)
        if k["break_even_model"] is not None and k["break_even_model"] <= n[-1]:
            ax.axvline(k["break_even_model"], color="#555555", ls="--", lw=0.8)
        ax.set_title(f"{k['kernel']} (BEP {k['break_even_model']})", fontsize=10)
        ax.set_xticks(n)
        ax.set_xlabel("drives")
        ax.set_ylim(0, None)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("seconds")
    axes[0][0].legend(fontsize=7)
    drive = r["models"]["drive"]["name"] if r["models"]["drive"] else "none"
    fig.suptitle(f"Break-even, drive {drive}, link {r['models']['link']['name']} (x = machine-limited)", fontsize=11)
    return fig


def latency_md(r):
    q = r["query"]
    s = header(r, "Latency breakdown of one scan query")
    s += f"grep `{q['pattern']}` over {q['file_bytes'] / 2**20:.0f} MiB ({q['matches']} matching lines); the query with the median total of {r['repeat']}.\n\n"
    s += "| path | total ms | compute | media | link | protocol | link bytes |\n|---|---:|---:|---:|---:|---:|---:|\n"
    for name in ("conventional", "offload"):
        x = r[name]
        s += f"| {name} | {1e3 * x['total_s']:.2f} | {1e3 * x['compute_s']:.2f} | {1e3 * x['media_s']:.2f} | {1e3 * x['link_s']:.2f} | {1e3 * x['protocol_s']:.2f} | {x['link_bytes']} |\n"
    s += f"\nOffload is {r['speedup']:.2f}x faster. Parts, measured on the critical path:\n\n"
    for k, v in r["parts"].items():
        s += f"- {k}: {v}\n"
    m = r["model_s"]
    fmt = lambda v: f"{1e3 * v:.2f} ms" if v is not None else "-"
    s += (
        f"\nWhat the models alone need: media {fmt(m['media_engine'])} (engine) / {fmt(m['media_host'])} (host), "
        f"link {fmt(m['link_conventional'])} (conventional) / {fmt(m['link_offload'])} (offload). "
        "The target overlaps reading and computing, so a part can hide behind another.\n"
    )
    return s


def latency_plot(r, plt):
    q = r["query"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    colors = {"compute": "#2a7ab9", "media": "#5aa469", "link": "#d9822b", "protocol": "#999999"}
    for i, name in enumerate(("conventional", "offload")):
        left = 0.0
        for part, c in colors.items():
            w = 1e3 * r[name][part + "_s"]
            ax.barh(i, w, left=left, color=c, label=part if i == 0 else None)
            left += w
        ax.text(left, i, f" {left:.1f} ms", va="center")
    ax.set_yticks([0, 1], ["conventional", "offload"])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    drive = r["models"]["drive"]["name"] if r["models"]["drive"] else "none"
    ax.set_title(f"grep over {q['file_bytes'] >> 20} MiB, drive {drive}, link {r['models']['link']['name']}", fontsize=10)
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.set_xlim(0, max(1e3 * r[n]["total_s"] for n in ("conventional", "offload")) * 1.25)
    return fig


def check_md(r):
    s = header(r, "Model check: do emulated drives and links deliver their configured rates?")
    c = r["ceilings"]
    s += (
        f"{r['size_bytes'] / 2**20:.0f} MiB per measurement, median of {r['repeat']}, tolerance ±{100 * r['tolerance']:.0f} %"
        + (f" (±{100 * r['path_tolerance']:.0f} % for the image --model and target --model scans)" if "path_tolerance" in r else "")
        + ". "
        f"This machine with no model: offloaded scan {c['offload_scan_gbps']:.3f} GB/s, conventional reads {c['conventional_read_gbps']:.3f} GB/s.\n\n"
    )
    s += "| check | model | configured GB/s | measured GB/s | measured / configured | status |\n|---|---|---:|---:|---:|---|\n"
    for x in r["checks"]:
        if "configured_gbps" in x:
            s += f"| {x['kind']} | {x['name']} | {x['configured_gbps']:.3f} | {x['measured_gbps']:.3f} | {x['ratio']:.3f} | {x['status']} |\n"
        else:
            s += f"| {x['kind']} | {x['name']} | - | - | slept {x['slept_ns']} ns | {x['status']} |\n"
    m = r["method"]
    s += f"\n{r['failed']} check(s) failed. Drive: {m['drive']}. Link: {m['link']}. "
    if "image" in m:
        s += f"Image: {m['image']}. Target: {m['target']}. "
    s += f"{m['limit'][:1].upper() + m['limit'][1:]}.\n"
    return s


def check_plot(r, plt):
    xs = [x for x in r["checks"] if "ratio" in x]
    fig, ax = plt.subplots(figsize=(max(7, 0.42 * len(xs)), 3.8))
    colors = {"pass": "#5aa469", "fail": "#c0392b", "machine-limited": "#999999"}
    ax.bar(range(len(xs)), [x["ratio"] for x in xs], color=[colors[x["status"]] for x in xs])
    ax.axhspan(1 - r["tolerance"], 1 + r["tolerance"], color="#5aa469", alpha=0.12)
    ax.axhline(1, color="#555555", lw=0.8)
    short = {"drive internal read": "", "image --model scan": "image ", "target --model scan": "target ", "link": ""}
    ax.set_xticks(range(len(xs)), [f"{short.get(x['kind'], '')}{x['name']}\n{x['configured_gbps']:.2f} GB/s" for x in xs], fontsize=6, rotation=60)
    ax.set_ylabel("measured / configured")
    ax.set_ylim(0, 1.3)
    ax.set_title("Drives (internal read; image and target paths), links; grey = machine-limited", fontsize=10)
    return fig


WRITERS = {
    "scrub-scaling": (scrub_md, scrub_plot),
    "break-even": (breakeven_md, breakeven_plot),
    "latency": (latency_md, latency_plot),
    "model-check": (check_md, check_plot),
}


def one(name, bench, args, out=report.RESULTS):
    r, code = report.run(["bench", bench] + args, ok=(0, 1))
    r["script"] = "bench/model.py " + bench + (" --name " + name if name != bench else "") + (" -- " + " ".join(args) if args else "")
    report.write(r, name, *WRITERS[bench], out=out)
    return code


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench", nargs="?", choices=["all"] + list(WRITERS))
    ap.add_argument("--name", help="result name (default: the benchmark's)")
    report.add_options(ap)
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    a = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if a.from_json:
        report.rerender(a.from_json, *WRITERS[report.load(a.from_json)["benchmark"]], out=a.out)
        return 0
    if a.bench is None:
        ap.error("name a benchmark, all, or --from-json FILE")
    if a.bench == "all":
        return max([one(n, b, args, a.out) for n, b, args in STANDARD])
    return one(a.name or a.bench, a.bench, extra, a.out)


if __name__ == "__main__":
    sys.exit(main())

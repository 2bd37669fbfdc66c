# SPDX-License-Identifier: Apache-2.0
"""Figures of the planner's results, drawn with a caller's matplotlib ``pyplot`` (so the
command line and ``bench/plan.py`` draw the same pictures). Each function returns the
figure."""

from __future__ import annotations

from .output import fmt_bytes

__all__ = ["ec_sweep", "llm_sweep", "llm_models", "validation"]

_SYS_COLORS = {"h-nocache": "#d9822b", "h-cache": "#e8b04a", "d-nocache": "#2a7ab9", "d-cache": "#5fb0e6"}


def ec_sweep(r: dict, plt):
    """One encode's time on each side, and the break-even point, over the swept input."""
    param, pts = r["sweep"], r["points"]
    xs = [p[param] / (1 << 20) if param == "block-size" else p[param] for p in pts]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    ax1.plot(xs, [p["host_encode_s"] for p in pts], "o-", color="#d9822b", label="host core, one encode")
    ax1.plot(xs, [p["csd_encode_s"] for p in pts], "s-", color="#2a7ab9", label="CSD, one encode")
    ax1.set_ylabel("seconds")
    ax1.legend(fontsize=8)
    ax2.plot(xs, [p["break_even"] or 0 for p in pts], "o-", color="#333333")
    for x, p in zip(xs, pts):
        ax2.annotate(str(p["break_even"] or "-"), (x, p["break_even"] or 0), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=8)
    ax2.set_ylabel("break-even drives (BEP)")
    ax2.set_ylim(0, max(p["break_even"] or 0 for p in pts) + 1.5)
    label = {"blocks": "encoded blocks n + k (n = 2k)", "block-size": "block size (MiB)", "device-compute": "CSD computational power (x)"}[param]
    for ax in (ax1, ax2):
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    i = r["inputs"]
    fixed = {
        "blocks": f"{fmt_bytes(i['block_bytes'])} blocks",
        "block-size": f"{i['blocks']} blocks",
        "device-compute": f"{i['blocks']} blocks of {fmt_bytes(i['block_bytes'])}",
    }[param]
    fig.suptitle(f"CSDPLAN-EC, drive {i['drive']}: {fixed}", fontsize=10)
    return fig


def llm_sweep(r: dict, plt):
    """Seconds per step of every system, and D-Cache's speedup over H-Cache."""
    param = r["sweep"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10.5, 4))
    styles = ["-", "--", ":", "-."]
    for mi, model in enumerate(r["models"]):
        pts = [p for p in r["points"] if p["model"] == model]
        xs = [p[param] for p in pts]
        for sysname in r["systems"]:
            ys = [(p[sysname] or {}).get("step_s") for p in pts]
            ax1.plot(
                [x for x, y in zip(xs, ys) if y],
                [y for y in ys if y],
                styles[mi % 4],
                marker="o",
                ms=3,
                color=_SYS_COLORS.get(sysname),
                label=f"{model} {sysname}",
            )
        sp = [p["speedup"]["d_cache_over_h_cache"] for p in pts]
        ax2.plot([x for x, y in zip(xs, sp) if y], [y for y in sp if y], styles[mi % 4], marker="o", label=model)
    ax1.set_yscale("log")
    ax1.set_ylabel("seconds per decode step")
    ax1.legend(fontsize=6)
    ax2.axhline(1.0, color="#999999", lw=0.8)
    ax2.set_ylabel("D-Cache speedup over H-Cache (x)")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel({"seq-len": "sequence length (tokens)", "batch": "sequences per node", "devices": "nodes in the pool"}[param])
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"Storage-pool LLM inference: {r['devices']} nodes, sequence {r['seq_len']}, {r['batch_per_device']} sequence(s) per node (unless swept)", fontsize=10
    )
    return fig


def llm_models(r: dict, plt):
    """Fig. 12b: seconds per step of every system for every model (log scale)."""
    plans = r["models"]
    fig, ax = plt.subplots(figsize=(10, 4))
    systems = list(plans[0]["systems"])
    w = 0.8 / len(systems)
    for si, s in enumerate(systems):
        ys = [(p["systems"][s] or {}).get("step_s") or 0 for p in plans]
        ax.bar([i + si * w for i in range(len(plans))], ys, w, color=_SYS_COLORS.get(s), label=s)
    ax.set_yscale("log")
    bottom = ax.get_ylim()[0]
    for i, p in enumerate(plans):
        for si, s in enumerate(systems):
            v = p["systems"][s]
            ax.annotate(
                "x" if v is None else f"{v['dp']}/{v['tp']}/{v['pp']}",
                (i + si * w, v["step_s"] if v else bottom),
                rotation=90,
                fontsize=5,
                ha="center",
                va="bottom",
            )
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(plans))])
    ax.set_xticklabels([p["model"] for p in plans], fontsize=8, rotation=15)
    ax.set_ylabel("seconds per decode step")
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * 30)  # room for the legend above the bars
    ax.legend(fontsize=8, ncol=4, loc="upper left")
    ax.grid(alpha=0.3, axis="y")
    p0 = plans[0]
    ax.set_title(f"{p0['devices']} nodes, sequence {p0['seq_len']}, {p0['batch_per_device']} per node; labels: dp/tp/pp, x = does not fit", fontsize=9)
    return fig


def validation(r: dict, plt):
    """Measured against predicted series, one panel per kernel and one for erasure coding."""
    ks = r["kernels"]
    n = len(ks) + (1 if r.get("ec") else 0)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 3.4), squeeze=False)
    for ax, k in zip(axes[0], ks):
        xs = [p["drives"] for p in k["measured"]]
        ax.plot(xs, [p["host_s"] for p in k["measured"]], "o", color="#d9822b", label="host, measured")
        ax.plot(xs, [p["offload_s"] for p in k["measured"]], "s", color="#2a7ab9", label="drives, measured")
        ax.plot(xs, [p["host_s"] for p in k["predicted"]], "-", color="#d9822b", label="host, predicted")
        ax.plot(xs, [p["csd_s"] for p in k["predicted"]], "-", color="#2a7ab9", label="drives, predicted")
        ax.set_title(f"{k['kernel']}: mean error {k['error']['mean']:.0%}", fontsize=9)
        ax.set_xlabel("drives")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("seconds")
    axes[0][0].legend(fontsize=6)
    if r.get("ec"):
        e, ax = r["ec"], axes[0][-1]
        xs = [p["drives"] for p in e["measured"]]
        ax.plot(xs, [p["host_s"] for p in e["measured"]], "o", color="#d9822b")
        ax.plot(xs, [p["csd_s"] for p in e["measured"]], "s", color="#2a7ab9")
        ax.plot(xs, [p["host_s"] for p in e["predicted"]], "-", color="#d9822b")
        ax.plot(xs, [p["csd_s"] for p in e["predicted"]], "-", color="#2a7ab9")
        c = e["config"]
        ax.set_title(f"EC ({c['n']},{c['k']}) x {fmt_bytes(c['block_bytes'])}: {e['error']['mean']:.0%}", fontsize=9)
        ax.set_xlabel("drives")
        ax.grid(alpha=0.3)
    fig.suptitle("Planner predictions (lines) against runs on this machine (markers)", fontsize=10)
    return fig

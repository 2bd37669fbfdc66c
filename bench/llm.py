#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""LLM decoding: tokens/s and link bytes per generated token of host-memory attention,
FlexGen-style offloading (dense and host-side SparF) and in-storage attention (dense and
SparF 1/8) at growing batch x context, over 1, 2 and 4 targets with the device model on.

Runs `insitu bench llm` and writes bench/results/llm.{json,md,png}.
Usage: bench/llm.py [-- ARGS of insitu bench llm]; --from-json FILE re-renders a result.
$INSITU overrides the insitu command (default: .venv/bin/insitu).
"""

import sys

import report

ORDER = ["memory", "flexgen", "flexgen-sparf", "insitu", "insitu-sparf"]


def _row(r, backend, b, s, n):
    for x in r["rows"]:
        if x["backend"] == backend and x["batch"] == b and x["context"] == s and (x["targets"] == n or backend == "memory"):
            return x
    return None


def ratios(r: dict) -> list:
    """(batch, context, targets, name, value) of the ratios the acceptance asks for."""
    out = []
    pts = sorted({(x["batch"], x["context"]) for x in r["rows"]})
    ns = sorted({x["targets"] for x in r["rows"] if x["targets"]})
    for b, s in pts:
        for n in ns:
            fg, fs = _row(r, "flexgen", b, s, n), _row(r, "flexgen-sparf", b, s, n)
            idn, isp = _row(r, "insitu", b, s, n), _row(r, "insitu-sparf", b, s, n)
            if fg and isp:
                out.append((b, s, n, "insitu SparF / flexgen dense", isp["tokens_per_s"] / fg["tokens_per_s"]))
            if fg and idn:
                out.append((b, s, n, "insitu dense / flexgen dense", idn["tokens_per_s"] / fg["tokens_per_s"]))
            if fs and isp:
                out.append((b, s, n, "insitu SparF / flexgen SparF", isp["tokens_per_s"] / fs["tokens_per_s"]))
        one = {k: _row(r, k, b, s, ns[0]) for k in ("insitu", "insitu-sparf")} if ns else {}
        for n in ns[1:]:
            for k in ("insitu", "insitu-sparf"):
                x = _row(r, k, b, s, n)
                if x and one.get(k):
                    out.append((b, s, n, f"{k} {n} targets / {ns[0]}", x["tokens_per_s"] / one[k]["tokens_per_s"]))
    return out


def markdown(r: dict) -> str:
    m = r.get("machine", {})
    dm = (r.get("device_model") or {}).get("name", "none")
    s = "# LLM decoding with the KV cache on targets\n\n"
    s += f"`{r.get('command', 'insitu bench llm')}`; model {r.get('model', '')}; device model `{dm}` on every target "
    s += f"(flash and PCIe link paced); {r.get('steps')} greedy decode steps per point measured after {r.get('warm_up_steps', 0)} untimed; host-memory budget for the KV cache "
    s += f"{r.get('host_budget_bytes', 0) / 2**20:.0f} MiB; KV cache {r.get('kv_bytes_per_token', 0) / 1024:.0f} KiB per token "
    s += f"(f32); on the targets (in-storage pages, FlexGen-style blocks) {r.get('kv_dtype', 'f32')}, each sequence's tokens split over the targets "
    mbs = sorted({x.get("micro_batches", 1) for x in r["rows"] if x["backend"].startswith("insitu")})
    s += f"({r.get('split', 'heads')}); micro-batches decoded at once by the in-storage backends: {r.get('micro_batches', 1)} "
    s += f"({' or '.join(map(str, mbs)) or '-'} in the rows, as the backend column says). "
    img = r.get("images")
    if img:
        if img.get("in_memory"):
            s += f"Target images in memory ({img['dir']}): the device model alone paces the reads. "
        else:
            s += f"Target images on a disk ({img['dir']}): the in-storage engine reads them with direct I/O, FlexGen-style reads come from the target's page cache. "
    s += f"Machine: {m.get('cpus', '?')} CPUs ({m.get('cpu_model', '?')}).\n\n"
    if r.get("note"):
        s += f"**Note:** {r['note']}\n\n"
    s += "| batch x context | KV cache | targets | backend | tokens/s | link bytes / token | media bytes / token | step s | attention s "
    s += "| drive wait s | device-model bound s | step / bound | limited by |\n"
    s += "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    rows = sorted(r["rows"], key=lambda x: (x["batch"] * x["context"], x["targets"], ORDER.index(x["backend"])))
    for x in rows:
        bound = "" if x.get("model_bound_s") is None else f"{x['model_bound_s']:.4f}"
        over = "" if x.get("step_over_bound") is None else f"{x['step_over_bound']:.2f}"
        att = "" if x.get("attention_s") is None else f"{x['attention_s']:.3f}"
        drive = "" if x.get("drive_wait_s") is None else f"{x['drive_wait_s']:.3f}"
        budget = " (over budget)" if x.get("over_budget") else ""
        mb = f" ({x['micro_batches']} micro-batches)" if x.get("micro_batches", 1) > 1 else ""
        s += f"| {x['batch']} x {x['context']} | {x['kv_cache_bytes'] / 2**20:.0f} MiB{budget} | {x['targets'] or '-'} | {x['backend']}{mb} | "
        s += f"{x['tokens_per_s']:.2f} | {x['link_bytes_per_token']:,.0f} | {x['media_bytes_per_token']:,.0f} | {x['step_s']:.3f} | {att} | {drive} | "
        s += f"{bound} | {over} | {x.get('limit') or ''} |\n"
    s += "\n## Ratios (tokens/s)\n\n| batch x context | targets | ratio | value |\n|---|---:|---|---:|\n"
    for b, c, n, name, v in ratios(r):
        s += f"| {b} x {c} | {n} | {name} | {v:.2f}x |\n"
    if r.get("limits"):
        s += "\n**Limited by** says which resource sets each row's pace: "
        s += "; ".join(f"*{k}*: {v}" for k, v in r["limits"].items()) + ".\n\n"
    s += "\nThe drive-wait column is how long a step's attention waited on the modelled drive once the targets' engines "
    s += "were done (per exchange the longest wait of a target, summed over a step's exchanges; with several micro-batches, "
    s += "their mean): the rest of the attention column is the engines, the transport and the host's part of attention. "
    s += "The attention column is the part of a step beyond the host's own model compute: the time in which every "
    s += "micro-batch waits on its targets. On a few cores the host model and every embedded target's engine share "
    s += "the CPU, so tokens/s ratios between backends are capped by the host's compute. The link-bytes column is what "
    s += "the design changes: FlexGen-style decoding moves the whole cache per token, in-storage attention only q/k/v "
    s += "and outputs.\n"
    return s


def plot(r: dict, plt):
    fig, ax = plt.subplots(figsize=(7.2, 3.8))
    pts = sorted({(x["batch"], x["context"], x["targets"]) for x in r["rows"] if x["targets"]})
    width = 0.8 / len(ORDER)
    colors = ["#777777", "#d9822b", "#f0b27a", "#2a7ab9", "#7fb3e0"]
    for i, (k, c) in enumerate(zip(ORDER, colors)):
        ys = []
        for b, s, n in pts:
            x = _row(r, k, b, s, n)
            ys.append(x["tokens_per_s"] if x else 0)
        ax.bar([j + i * width for j in range(len(pts))], ys, width, label=k, color=c)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(pts))])
    ax.set_xticklabels([f"{b}x{s}\n{n} tgt" for b, s, n in pts], fontsize=7)
    ax.set_ylabel("tokens/s")
    ax.set_title("decode throughput by attention backend")
    ax.legend(fontsize=7)
    return fig


if __name__ == "__main__":
    sys.exit(report.passthrough_main("llm", __doc__, markdown, plot))

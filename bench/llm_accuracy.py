#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Accuracy of sparse in-storage attention: decode-style perplexity and greedy agreement
with dense in-memory attention, computed by the targets' attention engine on real English
text, over several windows of it. Rows: dense; SparF with its page cap at 1/2, 1/4, 1/8
and 1/16 (the kept tokens carrying all the weight, the default); SparF 1/8 mixed with the
mean of V by α (the paper's step 11); SparF 1/8 without the page cap; and SparQ 1/8 (no
page groups, media counted element by element). Also the media bytes each read.

With --targets N each sequence's tokens are split over N embedded targets (SparF then
chooses its pages over the whole sequence from every target's page scores); --kv-dtype
f16 keeps the pages in half precision; --rows picks rows by label (e.g. "dense,SparF 1/8").

Writes bench/results/llm-accuracy.{json,md} (NAME.{json,md} with --name NAME).
Usage: bench/llm_accuracy.py [--text FILE] [--prefill N] [--context N] [--starts A,B,..] [--targets N] [--kv-dtype f32|f16] [--rows LABELS] [--out DIR] [--name NAME]
"""

import argparse
import math
import os
import sys
import time

import report

# (label, method, ratio, page cap, mean of V)
ROWS = [("dense", "dense", None, True, False)]
ROWS += [("SparF", "sparf", r, True, False) for r in (0.5, 0.25, 0.125, 0.0625)]
ROWS += [
    ("SparF, mixed with mean(V) (paper's step 11)", "sparf", 0.125, True, True),
    ("SparF, no page cap", "sparf", 0.125, False, False),
    ("SparQ (no page groups)", "sparq", 0.125, False, False),
]


def _label(row) -> str:
    """A row's label with its ratio, as --rows names it (``SparF 1/8``)."""
    return row[0] if row[2] is None else f"{row[0]} 1/{round(1 / row[2])}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3", help="English text (default: the GPL-3 text every Debian has)")
    ap.add_argument("--prefill", type=int, default=1024, help="tokens prefilled per window (default 1024)")
    ap.add_argument("--context", type=int, default=1152, help="tokens per window, prefill included (default 1152: 127 scored)")
    ap.add_argument("--starts", default="0,3000,6000", help="token offsets of the windows in the text (default 0,3000,6000)")
    ap.add_argument("--dir", default=".insitu/accuracy")
    ap.add_argument("--out", default=report.RESULTS)
    ap.add_argument("--name", default="llm-accuracy", help="results file name, without extension (default llm-accuracy)")
    ap.add_argument("--targets", type=int, default=1, help="embedded targets the cache is split over (default 1)")
    ap.add_argument("--kv-dtype", choices=["f32", "f16"], default="f16", help="element type of the targets' pages (default f16, as insitu llm's)")
    ap.add_argument("--rows", help="comma-separated row labels to run, e.g. 'dense,SparF 1/8' (default: all)")
    a = ap.parse_args()
    rows_wanted = None if not a.rows else {x.strip() for x in a.rows.split(",")}
    table = [r for r in ROWS if rows_wanted is None or _label(r) in rows_wanted or r[0] in rows_wanted]
    if not table or table[0][1] != "dense":
        ap.error("--rows must include dense (the other rows are compared with it)")
    starts = [int(x) for x in a.starts.split(",")]

    from insitu.llm import remote, run
    from insitu.llm.targets import TargetPool

    m = run.load()
    text = open(a.text, encoding="utf-8").read()
    base_params, base_store = remote.params, remote.TargetStore

    def variant(method, capped, mean_v):
        class Store(base_store):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **{**kwargs, "mean_v": mean_v})
                if self.method != "dense":
                    self.method = method

        remote.TargetStore = Store
        remote.params = (lambda *x, **y: base_params(*x, **{**y, "paged": False})._replace(pages=0)) if not capped else base_params

    windows = []
    pool = TargetPool.embedded(a.targets, a.dir, 1 << 30, 1 << 30, None)
    try:
        for start in starts:
            kw = {"context": a.context, "prefill": a.prefill, "start": start}
            ref = run.evaluate(m, text, "memory", **kw)
            rows = [{"method": "memory (reference)", "ratio": None, "mean_v": False, "perplexity": ref["perplexity"], "agreement": 1.0, "media_bytes": 0}]
            for label, method, ratio, capped, mean_v in table:
                variant(method, capped, mean_v)
                t0 = time.perf_counter()
                r = run.evaluate(m, text, "insitu", pool=pool, sparf=ratio, reference=ref, kv_dtype=a.kv_dtype, **kw)
                print(
                    f"window at {start}: {label} {ratio}: ppl {r['perplexity']:.3f} agreement {r['agreement']:.3f} "
                    f"media {r['stats']['media_bytes']:,} ({time.perf_counter() - t0:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
                rows.append(
                    {
                        "method": label,
                        "ratio": ratio,
                        "mean_v": mean_v,
                        "perplexity": r["perplexity"],
                        "agreement": r["agreement"],
                        "media_bytes": r["stats"]["media_bytes"],
                    }
                )
            windows.append({"start": start, "scored_tokens": ref["tokens"], "rows": rows})
    finally:
        remote.TargetStore, remote.params = base_store, base_params
        pool.close()

    # Over the windows: perplexity ratios to dense by geometric mean (each window's text has
    # its own perplexity), agreement and media ratios by plain mean.
    summary = []
    dense = [next(x for x in w["rows"] if x["method"] == "dense") for w in windows]
    for i, row in enumerate(windows[0]["rows"]):
        per = [w["rows"][i] for w in windows]
        vs = [x["perplexity"] / d["perplexity"] for x, d in zip(per, dense)]
        media = [x["media_bytes"] / d["media_bytes"] for x, d in zip(per, dense) if d["media_bytes"] and x["media_bytes"]]
        summary.append(
            {
                "method": row["method"],
                "ratio": row["ratio"],
                "mean_v": row["mean_v"],
                "perplexity_vs_dense": math.exp(sum(map(math.log, vs)) / len(vs)) - 1,
                "perplexity_vs_dense_worst": max(vs) - 1,
                "perplexity_vs_dense_per_window": [v - 1 for v in vs],
                "agreement": sum(x["agreement"] for x in per) / len(per),
                "media_to_dense": sum(media) / len(media) if media else None,
            }
        )
    result = {
        "model": m.path,
        "text": a.text,
        "prefill": a.prefill,
        "context": a.context,
        "starts": starts,
        "windows": windows,
        "summary": summary,
        "targets": a.targets,
        "kv_dtype": a.kv_dtype,
        "command": "bench/llm_accuracy.py " + " ".join(sys.argv[1:]),
    }

    def markdown(r):
        s = "# Accuracy of sparse in-storage attention\n\n"
        s += f"`{r['command']}`: {os.path.basename(r['model'])} (fp32, CPU) on `{r['text']}`, {len(r['windows'])} windows "
        s += f"(at tokens {', '.join(str(x) for x in r['starts'])}): in each, {r['prefill']} tokens prefilled, then "
        s += f"{r['windows'][0]['scored_tokens']} tokens scored through decode steps (teacher forcing), attention computed by "
        s += f"the targets' engines ({r.get('targets', 1)} target(s), each sequence's tokens split over them; {r.get('kv_dtype', 'f32')} pages). "
        s += "Perplexity vs dense: geometric mean over the windows, the worst window, and each. "
        s += "Agreement: share of positions whose greedy next token equals dense in-memory attention's. Media: what the "
        s += "targets read for the scored steps, over dense's (SparQ: element-granular, as a store without page groups "
        s += "would read).\n\n"
        s += "| method | ratio | perplexity vs dense | worst window | per window | agreement | media vs dense |\n"
        s += "|---|---:|---:|---:|---|---:|---:|\n"
        for x in r["summary"]:
            rat = "" if x["ratio"] is None else f"1/{round(1 / x['ratio'])}"
            per = ", ".join(f"{v:+.1%}" for v in x["perplexity_vs_dense_per_window"])
            mb = "" if x["media_to_dense"] is None else f"{x['media_to_dense']:.3f}"
            s += f"| {x['method']} | {rat} | {x['perplexity_vs_dense']:+.1%} | {x['perplexity_vs_dense_worst']:+.1%} | {per} | {x['agreement']:.3f} | {mb} |\n"
        s += (
            "\nDense perplexity per window: "
            + ", ".join(f"{next(x for x in w['rows'] if x['method'] == 'dense')['perplexity']:.3f} (at {w['start']})" for w in r["windows"])
            + ".\n"
        )
        return s

    report.write(result, a.name, markdown, None, a.out)


if __name__ == "__main__":
    main()

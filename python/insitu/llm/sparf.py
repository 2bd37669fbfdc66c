# SPDX-License-Identifier: Apache-2.0
"""SparF and SparQ attention in PyTorch: the host-side reference of the targets' engine.

SparF is InstInfer's Algorithm 1 (SparQ with flash-page groups and dual-step loading). For
one KV head with cache ``K``, ``V`` (``[S, D]``) and a query row ``q`` (``[D]``):

1. ``dims``: the ``r`` largest ``|q|`` components (ties: the lower index); with a page cap,
   one choice shared by the KV head's query rows (see :func:`select_dims`);
2. approximate scores ``ŝ = softmax(q[dims]·K[:, dims]ᵀ · scale / √(‖q[dims]‖₁ / ‖q‖₁))``
   (the paper's temperature: a partial dot product underestimates the spread of the full
   one);
3. ``toks``: the ``k`` best tokens by ``ŝ``, the last ``local`` tokens always first (the
   paper's ``ŝ + m``); ``α = Σ ŝ[toks]``. With a page cap, the token pages are chosen
   before the tokens, by approximate mass (see :func:`select_tokens`), as the target does
   for grouped-query heads;
4. ``out = α · softmax(q·K[toks]ᵀ · scale) · V[toks] + (1 − α) · mean(V)`` with
   ``mean_v`` (the paper's step 11, SparQ's mean value reallocation), else
   ``softmax(q·K[toks]ᵀ · scale) · V[toks]``: the kept tokens carry all the weight. The
   latter is the default: on SmolLM2-135M the mean of V stands in poorly for the tokens
   left out (GPL-3, 1,024 tokens prefilled, 127 scored, SparF 1/8: +19% perplexity with
   the mix, +2.5% without; see docs/llm.md).

With ``k ≥ S`` every token is kept and the result is dense attention. SparF and SparQ
compute the same thing; they differ only in what they read (pages vs. elements), which
:func:`pages_needed` counts for the page-granular store.

The functions work on one KV head with ``R`` query rows (grouped-query attention: the
query heads sharing the KV head), in float64 as the target does (it accumulates in f64
so that a generated token does not flip on rounding). They are split into steps so that a
store that loads only what a step needs (the FlexGen baseline in :mod:`insitu.llm.flexgen`)
can run them on partial tensors: :func:`approx_scores` reads only the selected columns of
``K``, :func:`attend_selected` only the selected rows of ``K`` and ``V``.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch

__all__ = [
    "SparseParams",
    "params",
    "select_dims",
    "approx_scores",
    "select_tokens",
    "attend_selected",
    "sparf",
    "dense",
    "log_sum_exp",
    "approx_logits",
    "page_log_mass",
    "pages_needed",
]


class SparseParams(NamedTuple):
    """``r`` query components, ``k`` tokens and the ``local`` most recent tokens kept, the
    cap on token pages read besides the local tokens' (0: none), and whether the result is
    mixed with the mean of V by α."""

    r: int
    k: int
    local: int
    pages: int = 0
    mean_v: bool = False


def params(ratio: float, head_dim: int, tokens: int, tokens_per_page: int = 16, paged: bool = True, mean_v: bool = False) -> SparseParams:
    """The parameters of SparF (``paged``) or SparQ at a nominal ``ratio`` at ``tokens``
    tokens.

    ``ratio`` is the share kept of each part of the cache: ``r = max(1, round(ratio·D))``
    query components (for SparF, shared by the query rows of a KV head), and, for SparQ,
    ``k = max(1, ⌈ratio·S/2⌉)`` tokens, so that its elements read, ``r·S + 2·k·D``, are
    about ``ratio · 2·S·D`` (dense reads ``2·S·D``: all of K and V). ``local = k/4``, at
    least 1: the current token (appended just before) always takes part, as in SparQ's
    local window.

    SparF reads whole pages, so it keeps pages rather than tokens: ``pages = ⌈9/8 ·
    ratio·S / tokens_per_page⌉`` token pages chosen by approximate mass, besides the first
    page and the local tokens' pages, and every token of a page read (``k`` covers them
    all). Its media bytes are then about ``9/8·ratio`` of dense's token pages plus the ``r``
    dimension-indexed pages: at 1/8 on SmolLM2-135M over 1,500 tokens about 0.22 of dense's
    media bytes, within a bound of 1/4. The 1/8 beyond ``ratio`` buys back part of the
    accuracy the page granularity costs (GPL-3, 1,500 tokens prefilled, 31 scored: +2%
    perplexity with ``9/8·ratio``, +7% with ``ratio``).
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"sparse ratio {ratio}: use a value in (0, 1], e.g. 0.125")
    r = max(1, min(head_dim, round(ratio * head_dim)))
    k = max(1, math.ceil(ratio * tokens / 2))
    local = max(1, k // 4)
    pages = max(1, math.ceil(9 * ratio * tokens / (8 * tokens_per_page)))
    if paged:
        # The first page, `pages` chosen ones and the local tokens' (at most one more page
        # than they fill): the reach, all of it used.
        k = (pages + 2) * tokens_per_page + local
    return SparseParams(r, k, local, pages, mean_v)


def _top(key: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the ``n`` largest values of each row of ``key``, ties to the lower index,
    returned ascending (as the target's top-k)."""
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :n]
    return torch.sort(order, dim=-1).values


def select_dims(q: torch.Tensor, r: int, shared: bool = False) -> torch.Tensor:
    """Step 1: the ``r`` largest-magnitude components of each row of ``q`` (``[R, D]``),
    ascending, ``[R, r]``.

    ``shared`` (SparF with a page cap): one choice for all rows, the ``r`` largest of
    ``Σ |q_row| / ‖q_row‖₁``, so a grouped-query head reads ``r`` dimension pages rather
    than up to ``R·r``. Summed in row and component order, as the target sums, so that both
    rank near-equal components alike.
    """
    r = min(r, q.shape[-1])
    if not shared:
        return _top(q.abs(), r)
    weight = [0.0] * q.shape[-1]
    for row in q.double().abs().tolist():
        l1 = 0.0
        for x in row:
            l1 += x
        if l1 > 0:
            for d, x in enumerate(row):
                weight[d] += x / l1
    dims = _top(torch.tensor(weight, dtype=torch.float64)[None], r)
    return dims.expand(q.shape[0], -1)


def approx_logits(q: torch.Tensor, dims: torch.Tensor, k_cols: torch.Tensor, scale: float) -> torch.Tensor:
    """Steps 2–4 before the softmax: ``ŝ``'s logits (``[R, S]``, float64) from the selected
    columns of K, scaled by the paper's temperature.

    ``k_cols`` is K transposed, ``[D, S]``; only the rows named in ``dims`` are read, so a
    caller may leave the others unfilled.
    """
    q = q.double()
    rows = []
    for qr, ds in zip(q, dims):
        s = qr[ds] @ k_cols[ds].double()
        l1, kept = qr.abs().sum(), qr[ds].abs().sum()
        factor = scale / math.sqrt(float(kept / l1)) if kept > 0 else scale
        rows.append(s * factor)
    return torch.stack(rows)


def approx_scores(q: torch.Tensor, dims: torch.Tensor, k_cols: torch.Tensor, scale: float) -> torch.Tensor:
    """Steps 2–4: ``ŝ`` (``[R, S]``), the softmax of :func:`approx_logits`."""
    return torch.softmax(approx_logits(q, dims, k_cols, scale), dim=-1)


def page_log_mass(logits: torch.Tensor, tokens_per_page: int) -> torch.Tensor:
    """Per row and page of ``tokens_per_page`` tokens (the last one may be short), the log
    of its approximate mass before normalisation, ``log Σ exp(ŝ)`` over the page
    (``[R, pages]``): what a target holding part of a sequence reports for SparF's page
    choice over the whole sequence."""
    n = logits.shape[-1]
    pages = math.ceil(n / tokens_per_page)
    padded = torch.full((logits.shape[0], pages * tokens_per_page), -math.inf, dtype=torch.float64)
    padded[:, :n] = logits
    return torch.logsumexp(padded.view(logits.shape[0], pages, tokens_per_page), dim=-1)


def select_tokens(shat: torch.Tensor, k: int, local: int, pages: int = 0, tokens_per_page: int = 16) -> Tuple[torch.Tensor, torch.Tensor]:
    """Steps 5–7: the ``k`` best tokens of each row by ``ŝ`` with the last ``local`` first,
    ascending (``[R, k]``), and ``α``, the approximate mass on them (``[R]``).

    With a page cap (``pages > 0``) the token pages are chosen first, for all rows
    together: the first page (the attention sink), those of the local tokens, and the
    ``pages`` others on which some row puts the most approximate mass (the sum of its
    ``ŝ`` over the page); each row's tokens then come from those pages only (``k``
    shrinks if they hold fewer). This bounds the pages a grouped-query head reads, whose
    rows' separate choices would otherwise touch most of the pages.
    """
    n = shat.shape[-1]
    local = min(local, n)
    # ŝ ≤ 1, so +2 ranks the local tokens ahead of all others and +4 the reachable ones
    # ahead of those, each still ordered by ŝ (the target's order).
    key = shat.clone()
    key[:, n - local :] += 2.0
    if pages > 0:
        groups = math.ceil(n / tokens_per_page)
        padded = torch.zeros(shat.shape[0], groups * tokens_per_page, dtype=shat.dtype)
        padded[:, :n] = shat
        padded = padded.view(shat.shape[0], groups, tokens_per_page)
        # Summed token by token, in the target's order, so both rank near-equal pages alike.
        mass = padded[..., 0].clone()
        for i in range(1, tokens_per_page):
            mass += padded[..., i]
        mass = mass.max(0).values
        candidates = min((n - local) // tokens_per_page, groups) if local > 0 else groups
        allowed = torch.ones(groups, dtype=torch.bool)
        allowed[1:candidates] = False
        if candidates > 1:
            allowed[1 + _top(mass[1:candidates], min(pages, candidates - 1))] = True
        reach = allowed.repeat_interleave(tokens_per_page)[:n]
        key[:, reach] += 4.0
        k = max(1, min(k, int(reach.sum())))
    toks = _top(key, min(k, n))
    return toks, shat.gather(-1, toks).sum(-1)


def attend_selected(
    q: torch.Tensor, toks: torch.Tensor, alpha: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, v_mean: Optional[torch.Tensor], scale: float
) -> torch.Tensor:
    """Steps 8–11: exact attention over the chosen tokens, mixed with ``mean(V)`` by ``α``;
    with ``v_mean`` None, not mixed (the kept tokens carry all the weight, ``α`` unused).

    ``k_rows``/``v_rows`` are K and V (``[S, D]``); only the rows named in ``toks`` are
    read. Returns ``[R, D]`` float64.
    """
    q = q.double()
    out = []
    for qr, t, a in zip(q, toks, alpha):
        w = torch.softmax((k_rows[t].double() @ qr) * scale, dim=-1)
        kept = w @ v_rows[t].double()
        out.append(kept if v_mean is None else a * kept + (1 - a) * v_mean.double())
    return torch.stack(out)


def dense(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, scale: float) -> torch.Tensor:
    """Dense attention of the rows of ``q`` (``[R, D]``) over ``K``, ``V`` (``[S, D]``), in
    float64."""
    w = torch.softmax((q.double() @ K.double().T) * scale, dim=-1)
    return w @ V.double()


def log_sum_exp(q: torch.Tensor, k_rows: torch.Tensor, scale: float, toks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Each query row's log-sum-exp of its scaled scores over the rows of ``k_rows``
    (``[S, D]``), or over the rows ``toks[row]`` of it: ``[R]`` float64. With the output
    of :func:`dense` or :func:`attend_selected` (unmixed) over the same tokens, it is a
    part that :func:`insitu.llm.targets.merge` combines with parts over other tokens."""
    q = q.double()
    if toks is None:
        return torch.logsumexp((q @ k_rows.double().T) * scale, dim=-1)
    return torch.stack([torch.logsumexp((k_rows[t].double() @ qr) * scale, dim=-1) for qr, t in zip(q, toks)])


def sparf(
    q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, scale: float, r: int, k: int, local: int, pages: int = 0, mean_v: bool = False, tokens_per_page: int = 16
) -> torch.Tensor:
    """SparF (or, with ``pages = 0``, SparQ) attention of the rows of ``q`` over the whole
    ``K``, ``V``: ``[R, D]`` float64. Dense when ``k ≥ S``, as on the target. ``mean_v``:
    mix with the mean of V by α (else α is taken as 1)."""
    if r < 1 or k < 1:
        raise ValueError(f"sparse attention needs r and k above 0 (got r = {r}, k = {k})")
    if K.shape[0] == 0:
        raise ValueError("attention over an empty cache (append the current token first)")
    if k >= K.shape[0]:
        return dense(q, K, V, scale)
    dims = select_dims(q, r, shared=pages > 0)
    shat = approx_scores(q, dims, K.T, scale)
    toks, alpha = select_tokens(shat, k, local, pages, tokens_per_page)
    return attend_selected(q, toks, alpha, K, V, V.double().mean(0) if mean_v else None, scale)


def pages_needed(dims: torch.Tensor, toks: torch.Tensor, tokens: int, tokens_per_page: int = 16, tokens_per_dim_page: int = 1024) -> Tuple[int, int]:
    """(dimension-indexed pages, token-indexed pages of K and V) a page-granular store
    reads for these selections over ``tokens`` tokens: every page holding a selected unit,
    once (the first step of dual-step loading; the second filters inside the page)."""
    dim_pages = len(set(dims.flatten().tolist())) * math.ceil(tokens / tokens_per_dim_page)
    groups = len({t // tokens_per_page for t in toks.flatten().tolist()})
    return dim_pages, 2 * groups

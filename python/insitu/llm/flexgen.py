# SPDX-License-Identifier: Apache-2.0
"""The FlexGen-style baseline: the KV cache as plain blocks on the same targets, read back to
the host at every decode step and attended there.

This separates the two gains of in-storage attention: ``flexgen`` dense moves the whole
cache over the link each step; ``flexgen`` with SparF moves only the pages SparF needs but
still moves them; ``insitu`` moves neither, only q, k, v and the outputs.

**Layout.** On each target's sharable namespace (NSID 1, 512-byte blocks), every
(batch slot, layer, KV head of the target) owns a region sized for ``max_tokens``, at
``region_bytes · ((slot · layers + layer) · heads_on_target + head)``:

* a token area of page pairs, ``[K page g][V page g]`` for ``g = 0, 1, …``; a page is 4 KiB
  and holds ``4096 / (element size · head_dim)`` consecutive tokens (32 for 64-dimension
  f16 heads, 16 in f32), so a dense read of a head is one contiguous read and a sparse one
  reads a page pair per needed token group;
* with SparF only, a dimension-indexed copy of K: for each dimension ``d``, the values of
  tokens ``0 … max_tokens`` contiguous (rounded up to a page), so step 2 of SparF reads one
  run per selected dimension.

Elements are ``kv_dtype``: f16, as FlexGen keeps its cache (and as the in-storage backend
keeps its pages, so both read the same bytes per token), or f32. Writes are whole pages of
the token area and whole 512-byte blocks of a dimension's run; tokens not yet filling them
stay in a host-side tail in f32, which attention uses as it is (like the target's DRAM
group buffer). A running sum of V per head gives SparF's mean of V without reading V.

**Targets.** The cache is split over the targets as the in-storage store splits it
(``split``, :mod:`insitu.llm.targets`): by default over two or more targets each sequence's
tokens (every target all the KV heads for a share of the tokens, placed by the same
:class:`~insitu.llm.targets.TokenSplit` rule), each share attended on the host on its own
(SparF at the ratio over the share) and the parts merged by their log-sum-exp; or KV heads
in ranges. The two backends then read the same tokens' pages and differ only in where
attention runs. The targets' reads of a step are in flight together, one worker each.

**SparF, FlexGen's way.** Per layer and target, two rounds of reads, each all in flight at
once (``Session.read_runs_into``): the dimension runs of the components every (sequence,
KV head) chose, scored on the host by the engine's kernels
(``_native.page_masses_from_runs``); then, the pages chosen as the in-storage engine
chooses them (``_native.choose_split_pages``, over the whole sequence when it is split),
the chosen page pairs, attended by the same kernels (``_native.attend_chosen_pages``).
With the mean of V mixed in (a head split), each row's result is mixed by the approximate
weight of the pages kept, from the same masses.

**Dense reads, FlexGen's way.** A layer's pages of a sequence on a target are one large
read (its heads' regions are adjacent; the initiator pipelines it over its queues), and
each target reads layer ``l + 1`` on a prefetch thread while the host computes layer
``l``: I/O overlapped with compute, as FlexGen schedules it. A page written after its
layer's read began (the decode step's token filling it) is read on its own.

``media_bytes`` counts the bytes read back for attention; the link bytes come from the
NVMe/TCP sessions. Each target's state is touched only by its worker thread.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from .. import _native
from . import sparf
from .hooks import KVStore
from .remote import KV_DTYPES
from .targets import TargetPool, TokenSplit, Worker, choose_split, head_ranges, merge

__all__ = ["FlexGenStore", "PAGE", "NSID"]

NSID = 1
PAGE = 4096
BLOCK = 512
#: The most I/O queues a FlexGen session opens to one target (a host's NVMe driver opens one
#: per core; beyond a few the per-queue threads only add switches).
MAX_QUEUES = 8
_TORCH = {"f32": torch.float32, "f16": torch.float16}


class _Row:
    """One (slot, layer) on one target: all of the target's heads, which see the same tokens."""

    def __init__(self, heads: int, head_dim: int):
        self.n = 0  # tokens stored
        self.tok = 0  # tokens in full token pages on the target
        self.dim = 0  # tokens in the dimension-indexed copy on the target
        self.base = 0  # first token of the host tail
        self.k = torch.zeros(heads, 0, head_dim)
        self.v = torch.zeros(heads, 0, head_dim)
        self.v_sum = torch.zeros(heads, head_dim, dtype=torch.float64)


class FlexGenStore(KVStore):
    """K and V of ``batch`` sequences as blocks on ``pool``'s targets; attention on the host.

    ``ratio`` None: dense (read every page back). ``ratio`` set: SparF computed on the host,
    reading only the pages it needs (``mean_v``: mixed with the mean of V by α, see
    :mod:`insitu.llm.sparf`). ``max_tokens`` bounds each sequence. ``split``: ``"tokens"``
    or ``"heads"``, as for :class:`insitu.llm.remote.TargetStore` (default: tokens over two
    or more targets, heads with ``mean_v``). ``kv_dtype``: ``"f16"`` or ``"f32"``, the
    element type of the blocks.
    """

    def __init__(
        self,
        pool: TargetPool,
        layers: int,
        kv_heads: int,
        head_dim: int,
        group: int,
        batch: int,
        max_tokens: int,
        ratio: Optional[float] = None,
        hostnqn: Optional[str] = None,
        mean_v: bool = False,
        split: Optional[str] = None,
        kv_dtype: str = "f32",
        first_row: int = 0,
    ):
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"KV dtype {kv_dtype!r}: use one of {', '.join(KV_DTYPES)}")
        self.es, self.dtype, self.kv_dtype = KV_DTYPES[kv_dtype], _TORCH[kv_dtype], kv_dtype
        if PAGE % (self.es * head_dim):
            raise ValueError(f"head size {head_dim}: a 4 KiB page must hold whole {kv_dtype} rows")
        split = choose_split(split, len(pool), mean_v, bool(ratio))
        self.layers, self.kv_heads, self.head_dim, self.group = layers, kv_heads, head_dim, group
        self.ratio, self.batch, self.mean_v, self.split = ratio, batch, mean_v, split
        self.tpp = PAGE // (self.es * head_dim)
        self.dim_flush_tokens = BLOCK // self.es
        if split == "tokens" and len(pool) > 1:
            # A target's share: its pages of the prompt, and decode tokens that keep the
            # shares within a page of each other; two pages of slack for both.
            max_tokens = math.ceil(max_tokens / len(pool)) + 2 * self.tpp
        self.groups_max = math.ceil(max_tokens / self.tpp)
        dim_page = PAGE // self.es  # tokens of one dimension's run on a page
        self.dim_tokens = math.ceil(max_tokens / dim_page) * dim_page if ratio else 0
        self.max_tokens = self.groups_max * self.tpp
        self.region = 2 * PAGE * self.groups_max + self.es * head_dim * self.dim_tokens
        self.ranges = head_ranges(split, kv_heads, len(pool))
        self.split_tokens = TokenSplit(len(self.ranges), batch, self.tpp, first_row)
        self.sessions: List = []
        self.workers: List[Worker] = []
        # Dense decoding reads layer ``l + 1``'s pages while the host computes layer ``l``
        # (FlexGen's overlap of I/O with compute): one prefetch thread per target, and the
        # reads in flight per (target, layer).
        self.prefetchers: List[Worker] = []
        self._ahead: Dict[Tuple[int, int], object] = {}
        self._media_lock = threading.Lock()
        # The reads of a prefetched layer, all in flight together (the sessions are
        # thread-safe and spread them over their queues).
        self._readers = ThreadPoolExecutor(max_workers=16, thread_name_prefix="flexgen-read")
        self._buffers: Dict[Tuple[int, int, int, int], bytearray] = {}
        self.rows: List[Dict[Tuple[int, int], _Row]] = []
        self._media = [0] * len(self.ranges)
        self.tokens = [0] * batch
        try:
            # SparF reads a layer as hundreds of small runs at once: deep queues, as a
            # host's NVMe driver gives them (32 deep, the reads took 45% longer), and as
            # many queues as the host has cores for this target, over which
            # `read_runs_into` spreads a layer's runs (8x2,048, one target, 2 cores: host
            # SparF's step 0.62 s with one queue, 0.48 s with two; with four targets, the
            # targets' connections already use every core, and two queues each took 0.93 s
            # against 0.76 s). Dense reads a layer in a few large reads from as many
            # threads, which one queue serves as well (attention 0.27-0.34 s a step with
            # one, 0.29-0.35 s with two, alternated).
            cores = len(os.sched_getaffinity(0))
            queues = max(1, min(MAX_QUEUES, cores // len(self.ranges))) if self.ratio else 1
            for i, rng in enumerate(self.ranges):
                s = _native.Session(pool.urls[i], hostnqn, queue_depth=128, io_queues=queues)
                self.sessions.append(s)
                need = self.region * batch * layers * len(rng)
                size = s.identify_namespace(NSID)["size"]
                if size < need:
                    raise ValueError(
                        f"target {pool.urls[i]}: namespace {NSID} holds {size >> 20} MiB; the FlexGen "
                        f"layout needs {math.ceil(need / 2**20)} MiB for {batch} x {self.max_tokens} tokens"
                    )
                self.workers.append(Worker(f"flexgen{i}"))
                self.prefetchers.append(Worker(f"flexgen{i}-prefetch"))
                self.rows.append({(b, l): _Row(len(rng), head_dim) for b in range(batch) for l in range(layers)})
        except BaseException:
            self.close()
            raise
        self._base = [s.stats() for s in self.sessions]

    def _lba(self, slot: int, layer: int, head: int, i: int, offset: int = 0) -> int:
        heads = len(self.ranges[i])
        return (self.region * ((slot * self.layers + layer) * heads + head) + offset) // BLOCK

    # -- writes ----------------------------------------------------------------------------

    def prefill(self, layer, k, v, valid):
        rows = [None] * k.shape[0] if valid is None else [torch.nonzero(m).flatten() for m in valid.cpu()]
        k, v = k.detach(), v.detach()
        if self.split == "tokens":
            for i, picks in enumerate(self.split_tokens.prefill(layer, self.tokens, rows, k.shape[2])):
                self.workers[i].submit(self._prefill, i, layer, k, v, picks)
        else:
            for i, rng in enumerate(self.ranges):
                self.workers[i].submit(self._prefill, i, layer, k[:, rng.start : rng.stop], v[:, rng.start : rng.stop], rows)
        if layer == 0:
            self.tokens = [t + (k.shape[2] if sel is None else len(sel)) for t, sel in zip(self.tokens, rows)]

    def _prefill(self, i, layer, k, v, rows):
        k, v = k.to("cpu", torch.float32), v.to("cpu", torch.float32)
        for b, sel in enumerate(rows):
            kb, vb = (k[b], v[b]) if sel is None else (k[b][:, sel], v[b][:, sel])
            self._append(i, b, layer, kb, vb)

    def _append(self, i: int, b: int, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Adds tokens (``[heads, t, D]``) to the host tail and writes what fills pages."""
        row = self.rows[i][(b, layer)]
        if row.n + k.shape[1] > self.max_tokens:
            raise ValueError(f"sequence {b} would exceed the {self.max_tokens} tokens its FlexGen region holds")
        row.k, row.v = torch.cat([row.k, k], 1), torch.cat([row.v, v], 1)
        row.v_sum += v.double().sum(1)
        row.n += k.shape[1]
        s = self.sessions[i]
        tok = row.n // self.tpp * self.tpp
        if tok > row.tok:
            a, z = row.tok - row.base, tok - row.base
            g = (tok - row.tok) // self.tpp
            for h in range(k.shape[0]):
                pairs = torch.stack([row.k[h, a:z].reshape(g, self.tpp, -1), row.v[h, a:z].reshape(g, self.tpp, -1)], 1)
                s.write(NSID, self._lba(b, layer, h, i, 2 * PAGE * (row.tok // self.tpp)), self._bytes(pairs))
            row.tok = tok
        if self.ratio:
            dim = row.n // self.dim_flush_tokens * self.dim_flush_tokens
            if dim > row.dim:
                a, z = row.dim - row.base, dim - row.base
                for h in range(k.shape[0]):
                    cols = row.k[h, a:z].T.contiguous()  # [D, tokens]
                    for d in range(self.head_dim):
                        off = 2 * PAGE * self.groups_max + self.es * (d * self.dim_tokens + row.dim)
                        s.write(NSID, self._lba(b, layer, h, i, off), self._bytes(cols[d]))
                row.dim = dim
        keep = min(row.tok, row.dim) if self.ratio else row.tok
        row.k, row.v = row.k[:, keep - row.base :], row.v[:, keep - row.base :]
        row.base = keep

    # -- decode ----------------------------------------------------------------------------

    def decode(self, layer, q, k, v, scale):
        B, hq, D = q.shape
        if layer == 0:
            self.tokens = [n + 1 for n in self.tokens]
        qg = q.detach().reshape(B, self.kv_heads, self.group, D)
        k, v = k.detach(), v.detach()
        futures = []
        if self.split == "tokens" and self.ratio and len(self.workers) > 1:
            return self._sparf_split(layer, qg, k, v, scale).reshape(B, hq, D).to(q.device, torch.float32)
        if self.split == "tokens":
            for i in self.split_tokens.decode(layer):
                futures.append(self.workers[i].submit(self._decode, i, layer, qg, k, v, scale, self.split_tokens.new_rows(i)))
        elif not self.ratio:
            for i, rng in enumerate(self.ranges):
                s = slice(rng.start, rng.stop)
                futures.append(self.workers[i].submit(self._decode, i, layer, qg[:, s], k[:, s], v[:, s], scale))
        else:
            for i, rng in enumerate(self.ranges):
                s = slice(rng.start, rng.stop)
                futures.append(self.workers[i].submit(self._decode, i, layer, qg[:, s], k[:, s], v[:, s], scale))
        for w in self.workers:
            w.drain()
        parts = [f.result() for f in futures]
        if self.split == "heads":
            out = torch.cat([o for o, _ in parts], dim=1)
        else:
            out = merge([o for o, _ in parts], [lse for _, lse in parts])
        return out.reshape(B, hq, D).to(q.device, torch.float32)

    def _decode(self, i, layer, q, k, v, scale, rows=None):
        """Target ``i``'s part of a layer: appends the new token when given, reads back
        what attention needs and attends; returns the outputs and each query row's
        log-sum-exp (``[B, heads, group]``, −inf for a row with no token here)."""
        q = q.to("cpu", torch.float32)
        self._append_step(i, layer, k, v, range(q.shape[0]) if rows is None else rows)
        if not self.ratio:
            return self._decode_dense(i, layer, q, scale)
        return self._sparf_whole(i, layer, q, scale)

    def _sparf_whole(self, i, layer, q, scale):
        """SparF over target ``i``'s KV heads, each sequence whole on it (a head split),
        FlexGen's way: every head's dimension runs read at once and scored on the host, the
        pages chosen as the target's engine chooses them (the first, the last ``local``
        tokens' and the budget's best others by approximate mass), every chosen page pair
        read at once and attended. A sequence SparF would keep whole (``k`` at least its
        tokens) is attended densely without its dimension runs, as the engine does. With
        ``mean_v`` each row's result is mixed with the mean of V by α, the approximate
        weight of the pages kept (their masses over the whole sequence's)."""
        B, H = q.shape[0], q.shape[1]
        n = [self.rows[i][(b, layer)].n for b in range(B)]
        p = sparf.params(self.ratio, self.head_dim, max(n), self.tpp)
        whole = {b for b in range(B) if p.k >= n[b]}
        masses = self._page_masses(i, layer, q, scale, p.r, whole)
        chosen = [b for b in range(B) if n[b] and b not in whole]
        sinks = [0 if b in chosen else None for b in range(B)]
        local_from = [[(n[b] - min(p.local, n[b])) // self.tpp if b in chosen else None] for b in range(B)]
        scores = ([m.shape[2] for m in masses], np.concatenate([m.ravel() for m in masses]).astype("<f4").tobytes())
        lists = _native.choose_split_pages([scores], H, q.shape[2], sinks, local_from, p.pages)[0]
        for b in whole:
            lists[b * H : (b + 1) * H] = [list(range(-(-n[b] // self.tpp)))] * H
        out, lse = self._attend_pages(i, layer, q, scale, lists)
        if self.mean_v:
            for b in chosen:
                m = torch.from_numpy(masses[b]).double()  # [heads, rows, pages]
                w = torch.exp(m - torch.logsumexp(m, -1, keepdim=True))
                alpha = torch.stack([w[h][:, lists[b * H + h]].sum(-1) for h in range(H)])[..., None]
                mean = (self.rows[i][(b, layer)].v_sum / n[b])[:, None, :]
                out[b] = alpha * out[b] + (1 - alpha) * mean
        return out, lse

    def _decode_dense(self, i, layer, q, scale):
        """Dense attention of target ``i``'s part of a layer, FlexGen's way: the pages of
        every sequence come from one large read per sequence (all the target's heads at
        once), started while the host computed the layer before; the next layer's reads
        start before this layer's arithmetic, which runs on the read buffers with the
        in-storage engine's kernels (``_native.attend_page_pairs``): each page widened
        once, in place, the two backends computing alike."""
        ahead = self._ahead.pop((i, layer), None)
        pages = ahead.result() if ahead is not None else self._read_layer(i, layer)
        if layer + 1 < self.layers:
            self._ahead[(i, layer + 1)] = self.prefetchers[i].submit(self._read_layer, i, layer + 1)
        H, G = q.shape[1], q.shape[2]
        out = torch.zeros(q.shape, dtype=torch.float64)
        lse = torch.full(q.shape[:-1], -math.inf, dtype=torch.float64)
        seqs = [b for b in range(q.shape[0]) if self.rows[i][(b, layer)].n]
        if not seqs:
            return out, lse
        heads = [entry for b in seqs for entry in self._page_pairs(i, b, layer, pages[b])]
        o, l = _native.attend_page_pairs(q[seqs].contiguous().numpy().tobytes(), heads, self.head_dim, G, scale, self.kv_dtype)
        out[seqs] = torch.from_numpy(np.frombuffer(o, dtype="<f4").copy()).view(len(seqs), H, G, -1).double()
        lse[seqs] = torch.from_numpy(np.frombuffer(l, dtype="<f8").copy()).view(len(seqs), H, G)
        return out, lse

    def _read_layer(self, i, layer):
        """Every sequence's token pages of ``layer`` on target ``i``, as they are now:
        ``(pages, [(buffer, byte offset) per head])`` per sequence. All the reads are in
        flight at once (a queue deep enough for every die of the drive): one per
        sequence spanning its heads' adjacent regions when the unused room between them is
        at most an eighth of what is read, else one per head (so the link carries no more
        than the pages)."""
        heads = len(self.ranges[i])
        jobs = []
        for b in range(self.batch):
            g = self.rows[i][(b, layer)].tok // self.tpp
            used = 2 * PAGE * g
            if g == 0:
                jobs.append((0, []))
            elif heads == 1 or 8 * (self.region - used) <= used:
                read = self._readers.submit(self._read_layer_part, (i, b, -1, layer % 2), self._lba(b, layer, 0, i), (heads - 1) * self.region + used)
                jobs.append((g, [(read, h * self.region) for h in range(heads)]))
            else:
                jobs.append(
                    (g, [(self._readers.submit(self._read_layer_part, (i, b, h, layer % 2), self._lba(b, layer, h, i), used), 0) for h in range(heads)])
                )
        return [(g, [(r.result(), at) for r, at in reads]) for g, reads in jobs]

    def _page_pairs(self, i, b, layer, read):
        """The heads of a row as ``_native.attend_page_pairs`` takes them: the page pairs
        read (the buffer and where each head's pairs start), then as f32 rows any page written
        since the read began (read now) and the host tail."""
        row = self.rows[i][(b, layer)]
        g, bufs = read
        at = g * self.tpp
        k, v = row.k.to(torch.float32).contiguous().numpy(), row.v.to(torch.float32).contiguous().numpy()
        entries = []
        for h in range(len(self.ranges[i])):
            kh, vh = k[h], v[h]
            if row.tok > at:  # pages written after the read began
                lk, lv = self._read_tokens(i, b, layer, h, range(g, row.tok // self.tpp))
                kh, vh = np.concatenate([lk[at : row.tok].numpy(), kh]), np.concatenate([lv[at : row.tok].numpy(), vh])
            buf, offset = bufs[h] if g else (None, 0)
            entries.append((buf, offset, g, kh.astype("<f4", copy=False).tobytes(), vh.astype("<f4", copy=False).tobytes()))
        return entries

    def _sparf_split(self, layer, qg, k, v, scale):
        """SparF over a token split with the pages chosen over the whole sequence, as the
        insitu backend chooses them: each target's dimension columns are read and scored
        into page log-masses, the host picks the pages (:meth:`TokenSplit.sparf_pages`),
        and the picked pages are read and attended, target by target in parallel."""
        p = sparf.params(self.ratio, self.head_dim, max(self.tokens), self.tpp)
        futures = {}
        for i in self.split_tokens.decode(layer):
            futures[i] = self.workers[i].submit(self._split_masses, i, layer, qg, k, v, scale, p.r, self.split_tokens.new_rows(i))
        for w in self.workers:
            w.drain()
        lists = self.split_tokens.sparf_pages({i: f.result() for i, f in futures.items()}, p.local, p.pages)
        parts = [self.workers[i].submit(self._attend_pages, i, layer, qg, scale, groups) for i, groups in lists.items()]
        parts = [f.result() for f in parts]
        return merge([o for o, _ in parts], [lse for _, lse in parts])

    def _append_step(self, i, layer, k, v, rows):
        """Appends the decode step's token (``k``, ``v``: ``[B, heads, D]``) of each
        sequence in ``rows`` to target ``i``'s part of ``layer``."""
        for b in rows:
            self._append(i, b, layer, k[b].to("cpu", torch.float32).unsqueeze(1), v[b].to("cpu", torch.float32).unsqueeze(1))

    def _page_masses(self, i, layer, q, scale, r, skip=()):
        """Target ``i``'s page log-masses (per sequence, ``[heads][rows][pages]``) from
        the dimension runs of the ``r`` components each (sequence, KV head)'s rows share,
        FlexGen's way: every head's runs read at once (``Session.read_runs_into``), scored
        by the engine's kernels on the host (``_native.page_masses_from_runs``).
        Sequences in ``skip`` are read and scored as empty (no pages)."""
        q = q.to("cpu", torch.float32)
        B, H, G, D = q.shape
        qb = q.contiguous().numpy().tobytes()
        dims = _native.sparf_components(qb, G, D, r)
        runs, entries, at = [], [], 0
        tokens = [0 if b in skip else self.rows[i][(b, layer)].n for b in range(B)]
        for b in range(B):
            row = self.rows[i][(b, layer)]
            paged = row.dim if tokens[b] else 0
            for h in range(H):
                ds = dims[b * H + h]
                for d in ds if paged else ():
                    runs.append((self._lba(b, layer, h, i, 2 * PAGE * self.groups_max + self.es * d * self.dim_tokens), self.es * paged // BLOCK))
                tail = row.k[h, paged - row.base :][:, ds].T if tokens[b] else torch.zeros(0)
                entries.append([None, at, self.es * paged, paged, tokens[b], tail.contiguous().numpy().astype("<f4", copy=False).tobytes()])
                at += self.es * paged * len(ds)
        buf = self._read_runs(i, runs, at)
        for e in entries:
            e[0] = buf
        masses = _native.page_masses_from_runs(qb, [tuple(e) for e in entries], D, G, scale, r, self.kv_dtype)
        out = []
        for b in range(B):
            pages = -(-tokens[b] // self.tpp)
            out.append(np.stack([np.frombuffer(masses[b * H + h], dtype="<f4").reshape(G, pages) for h in range(H)]))
        return out

    def _split_masses(self, i, layer, q, k, v, scale, r, rows):
        """Target ``i``'s part of a token split's first SparF step: the step's tokens of
        ``rows`` appended, then the page log-masses (:meth:`_page_masses`)."""
        self._append_step(i, layer, k, v, rows)
        return self._page_masses(i, layer, q, scale, r)

    def _attend_pages(self, i, layer, q, scale, groups):
        """Target ``i``'s part over the pages ``groups[b * heads + h]``: every chosen page
        pair of the layer read at once, attended by the engine's kernels on the host
        (``_native.attend_chosen_pages``)."""
        q = q.to("cpu", torch.float32)
        B, H, G, D = q.shape
        runs, entries, at = [], [], 0
        for b in range(B):
            row = self.rows[i][(b, layer)]
            paged = row.tok // self.tpp
            k = row.k[:, row.tok - row.base :].to(torch.float32).contiguous().numpy()
            v = row.v[:, row.tok - row.base :].to(torch.float32).contiguous().numpy()
            for h in range(H):
                g = [int(x) for x in groups[b * H + h]]
                read = [x for x in g if x < paged]
                for first, count in _runs(read):
                    runs.append((self._lba(b, layer, h, i, 2 * PAGE * first), 2 * PAGE * count // BLOCK))
                entries.append([None, at, g, paged, k[h].astype("<f4", copy=False).tobytes(), v[h].astype("<f4", copy=False).tobytes()])
                at += 2 * PAGE * len(read)
        buf = self._read_runs(i, runs, at)
        for e in entries:
            e[0] = buf
        o, l = _native.attend_chosen_pages(q.numpy().tobytes(), [tuple(e) for e in entries], D, G, scale, self.kv_dtype)
        out = torch.from_numpy(np.frombuffer(o, dtype="<f4").copy()).view(B, H, G, D).double()
        lse = torch.from_numpy(np.frombuffer(l, dtype="<f8").copy()).view(B, H, G)
        return out, lse

    def _read_runs(self, i: int, runs: List[Tuple[int, int]], nbytes: int) -> Optional[bytearray]:
        """The runs ``(lba, blocks)`` of target ``i``, back to back in one buffer, all in
        flight at once (None when there is none)."""
        if not runs:
            return None
        buf = bytearray(nbytes)
        self.sessions[i].read_runs_into(NSID, runs, buf)
        with self._media_lock:  # a target's worker and its prefetch thread both read
            self._media[i] += nbytes
        return buf

    def _read_tokens(self, i, b, layer, h, groups) -> Tuple[torch.Tensor, torch.Tensor]:
        """K and V (``[n, D]``) of the row: the page pairs of ``groups`` read back (runs of
        adjacent groups in one command), the host tail, zeros elsewhere (never used)."""
        row = self.rows[i][(b, layer)]
        K = torch.zeros(row.n, self.head_dim)
        V = torch.zeros(row.n, self.head_dim)
        runs = _runs(groups)
        buf = self._read_runs(i, [(self._lba(b, layer, h, i, 2 * PAGE * first), 2 * PAGE * count // BLOCK) for first, count in runs], 2 * PAGE * len(groups))
        pairs = torch.frombuffer(buf, dtype=self.dtype).view(-1, 2, self.tpp, self.head_dim) if buf else None
        at = 0
        for first, count in runs:
            a, z = first * self.tpp, (first + count) * self.tpp
            K[a:z], V[a:z] = pairs[at : at + count, 0].reshape(-1, self.head_dim), pairs[at : at + count, 1].reshape(-1, self.head_dim)
            at += count
        K[row.base :], V[row.base :] = row.k[h], row.v[h]
        return K, V

    def _read_layer_part(self, key: Tuple[int, int, int, int], lba: int, nbytes: int) -> bytearray:
        """A read of :meth:`_read_layer` into the buffer kept for ``key`` (target, sequence,
        head or -1, layer parity), as FlexGen reads into buffers it allocated once: no
        allocation, zeroing or copy per read. A layer's buffers are in use until its
        attention is done, while the next layer's reads fill the other parity's."""
        i = key[0]
        size = math.ceil(nbytes / BLOCK) * BLOCK
        buf = self._buffers.get(key)
        if buf is None or len(buf) != size:
            buf = self._buffers[key] = bytearray(size)
        self.sessions[i].read_into(NSID, lba, buf)
        with self._media_lock:
            self._media[i] += size
        return buf

    def _bytes(self, t: torch.Tensor) -> bytes:
        """``t``'s elements as stored: little-endian ``kv_dtype`` in C order."""
        return t.to(self.dtype).contiguous().numpy().tobytes()

    # -- the rest --------------------------------------------------------------------------

    def flush(self):
        for w in self.workers:
            w.drain()

    def stats(self) -> Dict[str, int]:
        to_host = from_host = 0
        for s, b in zip(self.sessions, self._base):
            st = s.stats()
            to_host += st["bytes_received"] - b["bytes_received"]
            from_host += st["bytes_sent"] - b["bytes_sent"]
        return {"bytes_to_host": to_host, "bytes_from_host": from_host, "media_bytes": sum(self._media)}

    def close(self):
        err = None
        for w in self.prefetchers:
            try:
                w.drain()
            except Exception:  # noqa: BLE001 - a read ahead that failed is not needed any more
                pass
            w.close()
        self.prefetchers, self._ahead = [], {}
        self._readers.shutdown(wait=True)
        for w in self.workers:
            try:
                w.drain()
            except Exception as e:  # noqa: BLE001 - cleaned up first, raised below
                err = err or e
            w.close()
        for s in self.sessions:
            try:
                s.disconnect()
            except Exception:  # noqa: BLE001 - nothing left to release
                pass
        self.sessions, self.workers = [], []
        if err is not None:
            raise err


def _runs(groups) -> List[Tuple[int, int]]:
    """(first, count) of each run of consecutive values in the ascending ``groups``."""
    out: List[Tuple[int, int]] = []
    for g in groups:
        if out and out[-1][0] + out[-1][1] == g:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((g, 1))
    return out

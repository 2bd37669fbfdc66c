# SPDX-License-Identifier: Apache-2.0
"""The ``insitu`` store: K and V on the targets' KV stores, decode attention computed there.

How a pool of targets shares the cache (``split``):

* ``"tokens"`` (the default with two or more targets; split-K): every target holds every
  KV head for a share of each sequence's tokens, dealt out in whole flash pages, target
  after target (page ``g`` of row ``b`` goes to target ``(g + b) mod N``), the prompt's tokens and
  each decode step's new token alike, so the targets stay even however many KV heads the
  model has (SmolLM2-135M has 3: a head split
  leaves a fourth target idle). Each target returns, per query row, its softmax-weighted
  sum of V over its tokens and the log-sum-exp of its scores, and the host merges the
  parts exactly (:class:`insitu.llm.targets.TokenSplit`, :func:`insitu.llm.targets.merge`): dense
  attention over N targets is dense attention over the whole sequence.
* ``"heads"``: KV heads in contiguous ranges, one per target
  (:func:`insitu.llm.targets.partition`); the host concatenates the outputs.

Prefill appends a layer's K and V with ``KvTarget.append`` from the target's worker
thread, so the transfer of layer ``i`` overlaps the host's computation of layer ``i + 1``
(InstInfer Section IV-D). A decode step sends, per layer and target, one ``KvTarget.attend``
with every row's queries (and the new token's k and v to the target that owns its page,
which appends before it attends), all targets at once, and gets the outputs back: one exchange
per layer per target, the link carrying q, k, v and the outputs, never the cache.

SparF (``method="sparf"``) takes ``r``, ``k``, ``local`` and the page cap from
:func:`insitu.llm.sparf.params` at each step, for the longest sequence of the batch (one
request carries one ``k``); ``"sparq"`` is SparQ's selection (each query row its own
components and ``k`` tokens, no page cap), counted at element granularity. Over a token
split SparF chooses its pages over the whole sequence, as one target would, in two
exchanges per target and layer (``docs/kv-commands.md``): every target scores its pages
from the dimension pages of the shared components (the step's token appended first; the
queries go up reduced to those components, chosen on the host as a target would), the
host normalises the masses over all targets and keeps the first page, the last ``local``
tokens' pages and the page budget's best others (``insitu_kvcache::split``), and every
target attends over the pages kept on it; the parts merge exactly. Both rounds, the
choice and the merge run in one native call per layer (``_native.sparf_split``), without
the GIL. SparQ keeps the per-share selection. The
paper's mix with the mean of V weighs the whole sequence, which no target holds, so
``mean_v`` uses the head split.

``kv_dtype`` (``"f32"`` or ``"f16"``) is the element type of the targets' pages and of the
vectors on the link (queries, the new token's K and V, the outputs): f16 halves the flash
bytes per token (and doubles the tokens per page) and the link bytes per step, as a host
whose model runs in half precision sends them; the engine computes in f64 from the stored
values. f32 keeps every step exact against in-memory attention.
"""

from __future__ import annotations

import random
from typing import Dict, List, Optional

import numpy as np
import torch

from .. import _native
from .hooks import KVStore
from .sparf import SparseParams, params
from .targets import SPLITS, TargetPool, TokenSplit, Worker, choose_split, head_ranges, merge

__all__ = ["TargetStore", "SPLITS", "KV_DTYPES"]

METHODS = ("dense", "sparf", "sparq")
KV_DTYPES = {"f32": 4, "f16": 2}


def f32_bytes(t: torch.Tensor) -> bytes:
    """Little-endian f32 bytes of ``t`` in C order (on the host)."""
    return t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()


class TargetStore(KVStore):
    """K and V of ``batch`` sequences on the targets of ``pool``; attention computed there.

    ``method`` is ``"dense"``, ``"sparf"`` or ``"sparq"``; the sparse ones need ``ratio``
    (the share of the dense reads to keep, e.g. 0.125), and mix their result with the mean
    of V by α when ``mean_v`` (see :mod:`insitu.llm.sparf`). ``split`` is ``"tokens"`` or
    ``"heads"`` (default: tokens over two or more targets, heads with ``mean_v``);
    ``kv_dtype`` the stored element type, ``"f32"`` or ``"f16"``. ``first_row``: the row
    of the whole batch this store's first sequence is, when a batch is decoded as
    micro-batches, each with its store: over a token split, row ``b`` is dealt from target
    ``b mod N`` (:class:`insitu.llm.targets.TokenSplit`).
    """

    def __init__(
        self,
        pool: TargetPool,
        layers: int,
        kv_heads: int,
        head_dim: int,
        group: int,
        batch: int,
        method: str = "dense",
        ratio: Optional[float] = None,
        hostnqn: Optional[str] = None,
        mean_v: bool = False,
        split: Optional[str] = None,
        kv_dtype: str = "f32",
        first_row: int = 0,
    ):
        if method not in METHODS:
            raise ValueError(f"method {method!r}: use one of {', '.join(METHODS)}")
        if method != "dense" and ratio is None:
            raise ValueError(f"method {method!r} needs a sparse ratio (e.g. 0.125)")
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"KV dtype {kv_dtype!r}: use one of {', '.join(KV_DTYPES)}")
        split = choose_split(split, len(pool), mean_v, method != "dense")
        self.layers, self.kv_heads, self.head_dim, self.group = layers, kv_heads, head_dim, group
        self.method, self.ratio, self.mean_v, self.split, self.kv_dtype = method, ratio, mean_v, split, kv_dtype
        self.ranges = head_ranges(split, kv_heads, len(pool))
        self.targets: List = []
        self.workers: List[Worker] = []
        # Random ids: a remote target may hold other hosts' (or an earlier run's) sequences.
        base = random.getrandbits(40) << 16
        self.seqs = [base + b for b in range(batch)]
        self.tokens = [0] * batch
        self._media = [0] * len(self.ranges)
        # How long each target's last answer waited on the modelled drive after its engine,
        # and the sum over exchange rounds of the longest wait (the targets work at once).
        self._drive_last = [0] * len(self.ranges)
        self._drive_wait_ns = 0
        self.exchanges = 0  # attention exchanges sent (one per layer and target used)
        self._created: List[List[int]] = []
        try:
            for i, rng in enumerate(self.ranges):
                t = _native.KvTarget(pool.urls[i], hostnqn)
                self.targets.append(t)
                self.workers.append(Worker(f"insitu-kv{i}"))
                self._created.append([])
                for s in self.seqs:
                    t.create(s, layers, len(rng), head_dim, kv_dtype, 1)
                    self._created[i].append(s)
        except BaseException:
            self.close()
            raise
        # The target's flash page fixes the token groups SparF's page cap counts in.
        page = self.targets[0].info(self.seqs[0])["page_bytes"] if self.targets else 4096
        self.tokens_per_page = max(1, page // (KV_DTYPES[kv_dtype] * head_dim))
        self.split_tokens = TokenSplit(len(self.ranges), batch, self.tokens_per_page, first_row)
        self._base = [t.stats() for t in self.targets]

    # -- prefill ---------------------------------------------------------------------------

    def prefill(self, layer, k, v, valid):
        rows = [None] * k.shape[0] if valid is None else [torch.nonzero(m).flatten() for m in valid.cpu()]
        k, v = k.detach(), v.detach()
        if self.split == "tokens":
            # Each target gets its pages of each row's prompt.
            for i, picks in enumerate(self.split_tokens.prefill(layer, self.tokens, rows, k.shape[2])):
                self.workers[i].submit(self._append, i, layer, k, v, picks)
        else:
            for i, rng in enumerate(self.ranges):
                self.workers[i].submit(self._append, i, layer, k[:, rng.start : rng.stop], v[:, rng.start : rng.stop], rows)
        if layer == 0:
            self.tokens = [t + (k.shape[2] if sel is None else len(sel)) for t, sel in zip(self.tokens, rows)]

    def _append(self, i, layer, k, v, rows):
        # Runs on target i's worker: the copy to host memory and the send overlap the host.
        k, v = k.to("cpu", torch.float32), v.to("cpu", torch.float32)
        for b, sel in enumerate(rows):
            kb, vb = (k[b], v[b]) if sel is None else (k[b][:, sel], v[b][:, sel])
            if kb.shape[1]:
                self.targets[i].append(self.seqs[b], layer, kb.shape[1], f32_bytes(kb), f32_bytes(vb))

    # -- decode ----------------------------------------------------------------------------

    def decode(self, layer, q, k, v, scale):
        B, hq, D = q.shape
        if layer == 0:
            self.tokens = [n + 1 for n in self.tokens]
        # On the host once, not once per target (a GPU model would sync per copy).
        qg = q.detach().reshape(B, self.kv_heads, self.group, D).to("cpu", torch.float32)
        k, v = k.detach().to("cpu", torch.float32), v.detach().to("cpu", torch.float32)
        for w in self.workers:
            w.drain()  # raises the first error of an earlier prefill append
        if self.split == "tokens" and self.method == "sparf" and len(self.targets) > 1 and self._params(max(self.tokens)).pages:
            return self._sparf_split(layer, qg, k, v, scale).float().reshape(B, hq, D).to(q.device)
        if self.split == "tokens":
            asked = self.split_tokens.decode(layer)
            qb = f32_bytes(qg)
            pending = [
                self._attend(i, layer, qb, qg.shape[2], k, v, self.split_tokens.new_rows(i), scale, self._params(max(self.held[i])), True) for i in asked
            ]  # SparF at the ratio over each target's share
            shapes = [qg.shape] * len(asked)
        else:
            asked = range(len(self.ranges))
            pending, shapes = [], []
            for i, rng in enumerate(self.ranges):
                s = slice(rng.start, rng.stop)
                pending.append(
                    self._attend(i, layer, f32_bytes(qg[:, s]), qg.shape[2], k[:, s], v[:, s], list(range(B)), scale, self._params(max(self.tokens)), False)
                )
                shapes.append(qg[:, s].shape)
        self.exchanges += len(pending)
        parts = [self._outputs(i, res, shape, self.split == "tokens") for i, res, shape in zip(asked, _native.attend_all(pending), shapes)]
        self._round(asked)
        if self.split == "heads":
            out = torch.cat(parts, dim=1)
        else:
            out = merge([o for o, _ in parts], [lse for _, lse in parts]).float()
        return out.reshape(B, hq, D).to(q.device)

    def _sparf_split(self, layer, qg, k, v, scale):
        """SparF over a token split, in two rounds of one exchange per target, all targets at
        once, in one native call (``insitu._native.sparf_split``): every target scores its
        pages (the step's token appended first), the pages are chosen over the whole
        sequence as one target would choose them, and every target attends over the pages
        kept on it; the parts merge exactly."""
        p = self._params(max(self.tokens))
        asked = self.split_tokens.decode(layer)
        sinks, local_from = self.split_tokens.fixed_pages(asked, p.local)
        index = {i: j for j, i in enumerate(asked)}
        out, rounds = _native.sparf_split(
            [self.targets[i] for i in asked],
            layer,
            self.seqs,
            f32_bytes(qg),
            qg.shape[2],
            scale,
            p.r,
            p.pages,
            sinks,
            local_from,
            [self.held[i] for i in asked],
            self.tokens_per_page,
            f32_bytes(k),
            f32_bytes(v),
            [index[i] for i in self.split_tokens.step_owners],
            self.kv_dtype,
        )
        for answered in rounds:
            for j, media, wait in answered:
                self._count(asked[j], {"media_bytes": media, "drive_wait_ns": wait})
            self._round([asked[j] for j, _, _ in answered])
            self.exchanges += len(answered)
        return torch.from_numpy(np.frombuffer(out, dtype="<f4").copy()).view(qg.shape)

    @property
    def held(self) -> List[List[int]]:
        """``held[i][b]``: tokens of sequence ``b`` on target ``i`` (a token split)."""
        return self.split_tokens.held

    def _params(self, tokens: int) -> SparseParams:
        """SparF's or SparQ's parameters over ``tokens`` tokens (a target's share)."""
        if self.method == "dense":
            return SparseParams(0, 0, 0)
        return params(self.ratio, self.head_dim, tokens, self.tokens_per_page, paged=self.method == "sparf", mean_v=self.mean_v)

    def _step_kv(self, k, v, rows):
        """What of the step's tokens rides with a target's request: the K and V bytes of
        the sequences in ``rows`` (those whose token it stores) and, when that is not
        every sequence, their indices (``new_rows``); nothing when ``rows`` is empty."""
        if not rows:
            return {}
        if len(rows) == k.shape[0]:
            return {"new_k": f32_bytes(k), "new_v": f32_bytes(v)}
        return {"new_k": f32_bytes(k[rows]), "new_v": f32_bytes(v[rows]), "new_rows": rows}

    def _attend(self, i, layer, qb, group, k, v, rows, scale, p, partial):
        """Target ``i``'s attention request (not sent): queries ``qb`` (f32 bytes) of
        ``group`` rows per KV head, the step's K and V for the sequences in ``rows``."""
        return self.targets[i].attend(
            layer,
            self.seqs,
            qb,
            group,
            scale,
            self.method,
            p.r,
            p.k,
            p.local,
            pages=p.pages if self.method == "sparf" else 0,
            mean_v=p.mean_v,
            partial=partial,
            vectors=self.kv_dtype,
            send=False,
            **self._step_kv(k, v, rows),
        )

    def _outputs(self, i, res, shape, partial):
        """Target ``i``'s answer to an attention request as tensors: the outputs (of the
        queries' ``shape``) and, for a partial result, each row's log-sum-exp; its media
        bytes counted."""
        self._count(i, res[1])
        out = torch.from_numpy(np.frombuffer(res[0], dtype="<f4").copy()).view(*shape)
        if not partial:
            return out
        return out, torch.from_numpy(np.frombuffer(res[2], dtype="<f8").copy()).view(*shape[:-1])

    def _count(self, i, stats):
        """Counts what target ``i``'s answer cost: its media bytes and its wait on the drive."""
        self._media[i] += stats["media_bytes"]
        self._drive_last[i] = stats.get("drive_wait_ns", 0)

    def _round(self, targets):
        """Ends an exchange round with ``targets``: the drive held it up as long as the
        longest of their waits."""
        self._drive_wait_ns += max((self._drive_last[i] for i in targets), default=0)

    # -- the rest --------------------------------------------------------------------------

    def flush(self):
        for w in self.workers:
            w.drain()

    def stats(self) -> Dict[str, int]:
        to_host = from_host = 0
        for t, b in zip(self.targets, self._base):
            s = t.stats()
            to_host += s["bytes_received"] - b["bytes_received"]
            from_host += s["bytes_sent"] - b["bytes_sent"]
        return {"bytes_to_host": to_host, "bytes_from_host": from_host, "media_bytes": sum(self._media), "drive_wait_s": self._drive_wait_ns / 1e9}

    def close(self):
        """Waits for queued appends, frees the sequences and disconnects (idempotent; the
        first error of a queued append is raised after the cleanup)."""
        err = None
        for w in self.workers:
            try:
                w.drain()
            except Exception as e:  # noqa: BLE001 - cleaned up first, raised below
                err = err or e
            w.close()
        for t, created in zip(self.targets, self._created):
            for s in created:
                try:
                    t.free(s)
                except Exception:  # noqa: BLE001 - a target that went away frees nothing
                    pass
            try:
                t.disconnect()
            except Exception:  # noqa: BLE001 - same: nothing left to release
                pass
        self.targets, self.workers, self._created = [], [], []
        if err is not None:
            raise err

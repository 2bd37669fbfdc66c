# SPDX-License-Identifier: Apache-2.0
"""The ``insitu`` store: K and V on the targets' KV stores, decode attention computed there.

Each batch row is one sequence on every target of the pool, holding that target's range of
KV heads (:func:`insitu.llm.targets.partition`). Prefill appends a layer's K and V with
``KvTarget.append`` from the target's worker thread, so the transfer of layer ``i``
overlaps the host's computation of layer ``i + 1`` (InstInfer Section IV-D). A decode step
sends, per layer and target, one ``KvTarget.attend`` with every row's queries and the new
token's k and v (appended by the target before it attends) and gets the outputs back: the
link carries q, k, v and the outputs, never the cache.

SparF (``method="sparf"``) takes ``r``, ``k``, ``local`` and the page cap from
:func:`insitu.llm.sparf.params` at each step, for the longest sequence of the batch (one
request carries one ``k``); ``"sparq"`` is SparQ's selection (each query row its own
components and ``k`` tokens, no page cap), counted at element granularity.
"""

from __future__ import annotations

import random
from typing import Dict, List, Optional

import numpy as np
import torch

from .. import _native
from .hooks import KVStore
from .sparf import SparseParams, params
from .targets import TargetPool, Worker, partition

__all__ = ["TargetStore"]

METHODS = ("dense", "sparf", "sparq")


def f32_bytes(t: torch.Tensor) -> bytes:
    """Little-endian f32 bytes of ``t`` in C order (on the host)."""
    return t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()


class TargetStore(KVStore):
    """K and V of ``batch`` sequences on the targets of ``pool``; attention computed there.

    ``method`` is ``"dense"``, ``"sparf"`` or ``"sparq"``; the sparse ones need ``ratio``
    (the share of the dense reads to keep, e.g. 0.125), and mix their result with the mean
    of V by α when ``mean_v`` (see :mod:`insitu.llm.sparf`).
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
    ):
        if method not in METHODS:
            raise ValueError(f"method {method!r}: use one of {', '.join(METHODS)}")
        if method != "dense" and ratio is None:
            raise ValueError(f"method {method!r} needs a sparse ratio (e.g. 0.125)")
        self.layers, self.kv_heads, self.head_dim, self.group = layers, kv_heads, head_dim, group
        self.method, self.ratio, self.mean_v = method, ratio, mean_v
        self.ranges = partition(kv_heads, len(pool))
        self.targets: List = []
        self.workers: List[Worker] = []
        # Random ids: a remote target may hold other hosts' (or an earlier run's) sequences.
        base = random.getrandbits(40) << 16
        self.seqs = [base + b for b in range(batch)]
        self.tokens = [0] * batch
        self._media = [0] * len(self.ranges)
        self._created: List[List[int]] = []
        try:
            for i, rng in enumerate(self.ranges):
                t = _native.KvTarget(pool.urls[i], hostnqn)
                self.targets.append(t)
                self.workers.append(Worker(f"insitu-kv{i}"))
                self._created.append([])
                for s in self.seqs:
                    t.create(s, layers, len(rng), head_dim, "f32", 1)
                    self._created[i].append(s)
        except BaseException:
            self.close()
            raise
        # The target's flash page fixes the token groups SparF's page cap counts in.
        page = self.targets[0].info(self.seqs[0])["page_bytes"] if self.targets else 4096
        self.tokens_per_page = max(1, page // (4 * head_dim))
        self._base = [t.stats() for t in self.targets]

    # -- prefill ---------------------------------------------------------------------------

    def prefill(self, layer, k, v, valid):
        rows = [None] * k.shape[0] if valid is None else [torch.nonzero(m).flatten() for m in valid.cpu()]
        if layer == 0:
            for b, sel in enumerate(rows):
                self.tokens[b] += k.shape[2] if sel is None else len(sel)
        k, v = k.detach(), v.detach()
        for i, rng in enumerate(self.ranges):
            self.workers[i].submit(self._append, i, layer, k[:, rng.start : rng.stop], v[:, rng.start : rng.stop], rows)

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
        p = SparseParams(0, 0, 0)
        if self.method != "dense":
            p = params(self.ratio, D, max(self.tokens), self.tokens_per_page, paged=self.method == "sparf", mean_v=self.mean_v)
        qg = q.reshape(B, self.kv_heads, self.group, D)
        futures = []
        for i, rng in enumerate(self.ranges):
            s = slice(rng.start, rng.stop)
            futures.append(self.workers[i].submit(self._attend, i, layer, qg[:, s], k[:, s], v[:, s], scale, p))
        for w in self.workers:
            w.drain()  # raises the first error of this step or of an earlier prefill append
        out = torch.cat([f.result() for f in futures], dim=1)
        return out.reshape(B, hq, D).to(q.device)

    def _attend(self, i, layer, q, k, v, scale, p):
        B, h, G, D = q.shape
        out, st = self.targets[i].attend(
            layer,
            self.seqs,
            f32_bytes(q),
            G,
            scale,
            self.method,
            p.r,
            p.k,
            p.local,
            f32_bytes(k),
            f32_bytes(v),
            p.pages if self.method == "sparf" else 0,
            p.mean_v,
        )
        self._media[i] += st["media_bytes"]
        return torch.from_numpy(np.frombuffer(out, dtype="<f4").copy()).view(B, h, G, D)

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
        return {"bytes_to_host": to_host, "bytes_from_host": from_host, "media_bytes": sum(self._media)}

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

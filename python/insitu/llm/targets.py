# SPDX-License-Identifier: Apache-2.0
"""The targets a KV cache lives on: a pool of NVMe/TCP URLs, or in-process embedded
targets, and how a cache is split across them.

* **Tokens** (:class:`TokenSplit`, split-K): every target holds every KV head for a share
  of each sequence's tokens, in whole pages dealt target after target: the prompt's and
  the decode steps' tokens alike go to the target owning their page. Each target attends
  over its share and the host merges the parts by their log-sum-exp (:func:`merge`),
  exactly. The targets stay even whatever the number of KV heads.
* **Heads** (:func:`partition`): KV heads in contiguous ranges, one per target, as even as
  possible with the first targets taking one more (3 heads over 2 targets: ``[0, 1]`` and
  ``[2]``): each target stores and attends its heads on its own (InstInfer Section IV-D,
  "Scale to CSD array"), and the host concatenates the outputs. With more targets than KV
  heads the extra targets get nothing and are not used.

Each target has one worker thread (:class:`Worker`): everything sent to a target goes
through it, in order, so prefill appends of layer ``i`` stream out while the host computes
layer ``i + 1``, and a decode step's attention request always follows the appends it needs.
The native calls release the GIL, so workers of different targets run in parallel.
"""

from __future__ import annotations

import bisect
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

import torch

from .. import _native

__all__ = ["partition", "SPLITS", "choose_split", "head_ranges", "TokenSplit", "merge", "TargetPool", "Worker", "DEFAULT_DIR"]

# Where the embedded default keeps its namespace images, relative to the working directory.
DEFAULT_DIR = ".insitu"


def partition(heads: int, targets: int) -> List[range]:
    """Contiguous ranges of KV heads, one per used target (``min(heads, targets)`` of them)."""
    if heads < 1 or targets < 1:
        raise ValueError(f"cannot split {heads} KV heads over {targets} targets")
    used = min(heads, targets)
    base, extra = divmod(heads, used)
    out, start = [], 0
    for t in range(used):
        n = base + (1 if t < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


SPLITS = ("tokens", "heads")


def choose_split(split: Optional[str], targets: int, mean_v: bool, sparse: bool) -> str:
    """The split a store uses: ``split`` checked, or by default tokens over two or more
    targets and heads otherwise. The paper's mix with the mean of V (``mean_v`` with a
    ``sparse`` method) weighs the whole sequence, which a token split holds on no single
    target: it takes the head split, and refuses the token split."""
    mixes = mean_v and sparse
    if split is None:
        return "tokens" if targets > 1 and not mixes else "heads"
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: use one of {', '.join(SPLITS)}")
    if split == "tokens" and mixes:
        raise ValueError("mean_v mixes in the mean of V over the whole sequence, which a token split holds on no single target: use split='heads'")
    return split


def head_ranges(split: str, heads: int, targets: int) -> List[range]:
    """The KV heads each target holds: all of them on every target with a token split,
    else :func:`partition`'s ranges."""
    return [range(heads)] * targets if split == "tokens" else partition(heads, targets)


class TokenSplit:
    """Where each token of ``batch`` sequences lives over ``targets`` targets (split-K).

    A sequence is dealt out in whole pages of ``tokens_per_page``, target after target:
    page ``g`` of sequence ``b`` (its tokens ``g·tpp …``) on target ``(g + first + b) mod
    N`` (:meth:`owner`), the prompt's tokens and each decode step's alike, so every
    target's share looks like the whole (recent and old tokens alike), the shares stay
    within a page of each other, and a target's page is a page of the whole sequence
    (SparF over the split reads the pages it reads on one target). A decode step's token
    of sequence ``b`` goes to the target owning its page.

    Sequence ``b`` is dealt from target ``(first + b) mod N`` (``first``: the row of a
    whole batch this split's first sequence is, for a micro-batch), so the first pages,
    which SparF reads whatever the query, are spread over the targets. Dealt from target
    0, they all were on it: in a 4-target SparF step (custom:25, 4 x 1,024, two
    micro-batches) the busiest target then read 1.28 times the mean of a layer's chosen
    pages, and with the rotation 1.14 times.
    """

    def __init__(self, targets: int, batch: int, tokens_per_page: int, first: int = 0):
        if targets < 1 or batch < 1 or tokens_per_page < 1:
            raise ValueError(f"cannot split {batch} sequences over {targets} targets in pages of {tokens_per_page}")
        self.tokens_per_page = tokens_per_page
        self.first = first
        #: ``held[i][b]``: tokens of sequence ``b`` on target ``i``.
        self.held = [[0] * batch for _ in range(targets)]
        #: ``positions[i][b]``: the positions in sequence ``b`` of its tokens on target
        #: ``i``, in the order the target stores them (ascending).
        self.positions: List[List[List[int]]] = [[[] for _ in range(batch)] for _ in range(targets)]
        #: Per sequence, the target storing the current decode step's token (see
        #: :meth:`decode`).
        self.step_owners: List[int] = [0] * batch
        self._dealt: List[List[torch.Tensor]] = []
        # Where the tokens of the current forward went (placed at layer 0, one per call),
        # and how many of them each later layer has sent so far.
        self._placed: List[List[int]] = []
        self._sent: Dict[int, int] = {}

    def prefill(self, layer: int, starts: Sequence[int], rows: Sequence[Optional[torch.Tensor]], width: int) -> List[List[torch.Tensor]]:
        """A prompt's layer ``layer``, ``width`` columns wide, of which sequence ``b`` has
        the columns ``rows[b]`` (None: all) at positions ``starts[b] …``: per target and
        sequence, the columns it stores. Dealt at layer 0 (see :meth:`deal`), the same for
        every later layer of the prompt."""
        if layer == 0:
            self._dealt = self.deal(starts, [width if sel is None else len(sel) for sel in rows])
        return [[d if sel is None else sel[d] for d, sel in zip(dealt, rows)] for dealt in self._dealt]

    def decode(self, layer: int) -> List[int]:
        """The targets a decode step's layer asks: those storing a sequence's step token
        (:attr:`step_owners`, placed at layer 0) and every one holding a token. A forward
        of several new tokens calls each layer once per token, in order: every layer puts
        its ``j``-th token where layer 0 put its ``j``-th."""
        if layer == 0:
            if self._sent:  # the later layers ran: a new forward begins
                self._placed, self._sent = [], {}
            self._placed.append(self.step())
            self.step_owners = self._placed[-1]
        else:
            j = self._sent.get(layer, 0)
            self._sent[layer] = j + 1
            self.step_owners = self._placed[j]
        return [i for i, held in enumerate(self.held) if i in self.step_owners or max(held)]

    def owner(self, b: int, page: int) -> int:
        """The target storing page ``page`` of sequence ``b``."""
        return (page + self.first + b) % len(self.held)

    def new_rows(self, i: int) -> List[int]:
        """The sequences whose current step token target ``i`` stores."""
        return [b for b, owner in enumerate(self.step_owners) if owner == i]

    def deal(self, starts: Sequence[int], counts: Sequence[int]) -> List[List[torch.Tensor]]:
        """Adds ``counts[b]`` prompt tokens to each sequence ``b`` (positions ``starts[b]
        …``) and returns, per target and sequence, the indices (into those ``counts[b]``)
        of the tokens it stores, ascending."""
        out: List[List[torch.Tensor]] = [[] for _ in self.held]
        for b, (start, n) in enumerate(zip(starts, counts)):
            j = torch.arange(n)
            owner = self.owner(b, (start + j) // self.tokens_per_page)
            for i, part in enumerate(out):
                part.append(j[owner == i])
                self.held[i][b] += len(part[-1])
                self.positions[i][b].extend((start + part[-1]).tolist())
        return out

    def step(self) -> List[int]:
        """Per sequence, the target that stores its next decode token: the owner of its
        page (counted)."""
        owners = []
        for b in range(len(self.held[0])):
            total = sum(held[b] for held in self.held)
            i = self.owner(b, total // self.tokens_per_page)
            self.positions[i][b].append(total)
            self.held[i][b] += 1
            owners.append(i)
        return owners

    def recent(self, i: int, b: int, last: int) -> int:
        """How many of sequence ``b``'s ``last`` most recent tokens target ``i`` holds
        (they are its own most recent ones)."""
        total = sum(held[b] for held in self.held)
        return len(self.positions[i][b]) - bisect.bisect_left(self.positions[i][b], total - last)

    def sparf_pages(self, masses: Dict[int, List[np.ndarray]], local: int, budget: int) -> Dict[int, List[List[int]]]:
        """SparF's pages over the split, chosen on the host from every target's page
        log-masses (``masses[i][b]``: ``[kv_heads][rows][pages]`` for sequence ``b`` on
        target ``i``) as one target holding every page chooses them
        (``insitu._native.choose_split_pages``), every sequence of the batch at once: the
        first page, the pages of the last ``local`` tokens wherever they are, and the
        ``budget`` others on which some query row of the KV head puts the most mass,
        normalised over the whole sequence (only pages before a target's local ones
        compete). Returns, per target, the page list of every (sequence, KV head),
        sequence-major, as a KV_ATTEND carries them."""
        order = sorted(masses)
        sinks, local_from = self.fixed_pages(order, local)
        heads, rows = next(iter(masses.values()))[0].shape[:2]
        scores = [([m.shape[2] for m in masses[i]], np.concatenate([m.ravel() for m in masses[i]]).astype("<f4").tobytes()) for i in order]
        lists = _native.choose_split_pages(scores, heads, rows, sinks, local_from, budget)
        return dict(zip(order, lists))

    def fixed_pages(self, targets: Sequence[int], local: int) -> "tuple[List[Optional[int]], List[List[Optional[int]]]]":
        """Per sequence, the pages SparF keeps whatever their mass, among ``targets`` (in
        the order given): the index in ``targets`` of the one holding its first page (None
        if not among them), and per target the first of its pages holding one of the
        sequence's last ``local`` tokens (None: none there)."""
        where = {i: j for j, i in enumerate(targets)}
        sinks, local_from = [], []
        for b in range(len(self.held[0])):
            sinks.append(where.get(self.owner(b, 0)))
            row = []
            for i in targets:
                n = self.recent(i, b, local)
                row.append((self.held[i][b] - n) // self.tokens_per_page if n else None)
            local_from.append(row)
        return sinks, local_from


def merge(outs: List[torch.Tensor], lses: List[torch.Tensor]) -> torch.Tensor:
    """Merges parts of one attention over disjoint token sets: ``outs[i]`` (``[..., D]``)
    is part ``i``'s softmax-weighted sum of V over its tokens, ``lses[i]`` (``[...]``) the
    log-sum-exp of its scaled scores (−inf for a part with no tokens). Returns the
    attention over the union, ``Σ exp(lse_i − L)·out_i`` with ``L = log Σ exp(lse_i)``,
    in float64."""
    lse = torch.stack([x.double() for x in lses])
    w = torch.exp(lse - torch.logsumexp(lse, dim=0))
    return (w[..., None] * torch.stack([o.double() for o in outs])).sum(0)


class Worker:
    """One thread that runs a target's commands in submission order."""

    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._pending: List[Future] = []
        self._lock = threading.Lock()

    def submit(self, fn: Callable, *args) -> Future:
        """Queues ``fn(*args)``; its errors surface at :meth:`drain` or on the future.
        It runs under ``torch.inference_mode`` (a thread does not inherit the caller's), so
        it may update tensors made in inference mode."""
        f = self._pool.submit(_inference, fn, args)
        with self._lock:
            self._pending.append(f)
        return f

    def drain(self) -> None:
        """Waits for everything queued so far; raises the first error."""
        with self._lock:
            pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _inference(fn: Callable, args: tuple):
    with torch.inference_mode():
        return fn(*args)


class TargetPool:
    """The targets of one run: their URLs, and embedded targets this pool started.

    ``TargetPool(urls=[...])`` uses running targets (``insitu target start ... --private
    IMG``); ``TargetPool.embedded(n)`` starts ``n`` targets in this process on loopback,
    with images under ``directory/llm-target-I/`` (removed first, so no sequence of an
    earlier run lingers, and removed again by :meth:`close`). ``model`` names a device-model
    preset that paces flash and the host link (e.g. ``"instinfer-csd"``: PCIe Gen3 x4).
    """

    def __init__(self, urls: Sequence[str], embedded: Optional[list] = None, dirs: Optional[List[str]] = None):
        if not urls:
            raise ValueError("a target pool needs at least one target URL")
        self.urls = list(urls)
        self._embedded = embedded or []
        self._dirs = dirs or []

    @classmethod
    def embedded(
        cls, count: int = 1, directory: str = DEFAULT_DIR, shared_bytes: int = 4 << 30, private_bytes: int = 4 << 30, model: Optional[str] = None
    ) -> "TargetPool":
        """Starts ``count`` embedded targets; namespace images are sparse files of the given
        sizes (the sharable NSID 1 holds the FlexGen baseline's blocks, the private one the
        targets' KV store)."""
        if count < 1:
            raise ValueError(f"--embedded-targets {count}: use 1 or more")
        targets, dirs = [], []
        try:
            for i in range(count):
                d = os.path.join(os.path.abspath(directory), f"llm-target-{i}")
                _remove_images(d)
                dirs.append(d)
                targets.append(_native.EmbeddedTarget(d, shared_bytes, private_bytes, model))
        except BaseException:
            for t in targets:
                t.shutdown()
            for d in dirs:
                _remove_images(d)
            raise
        return cls([t.url for t in targets], targets, dirs)

    def __len__(self) -> int:
        return len(self.urls)

    def close(self) -> None:
        """Stops the embedded targets and removes their images (idempotent)."""
        for t in self._embedded:
            t.shutdown()
        for d in self._dirs:
            _remove_images(d)
        self._embedded, self._dirs = [], []

    def __enter__(self) -> "TargetPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _remove_images(d: str) -> None:
    for name in ("shared.img", "private.img"):
        try:
            os.remove(os.path.join(d, name))
        except FileNotFoundError:
            pass
    # Only our own (now empty) directory: never a tree someone else put there.
    if os.path.isdir(d) and not os.listdir(d):
        shutil.rmtree(d, ignore_errors=True)

# SPDX-License-Identifier: Apache-2.0
"""The targets a KV cache lives on: a pool of NVMe/TCP URLs, or in-process embedded
targets, and how a model's KV heads are split across them.

KV heads are partitioned into contiguous ranges, one per target, as even as possible with
the first targets taking one more (3 heads over 2 targets: ``[0, 1]`` and ``[2]``): each
target stores and attends its heads on its own (InstInfer Section IV-D, "Scale to CSD
array"), and the host concatenates the outputs. With more targets than KV heads the extra
targets get nothing and are not used.

Each target has one worker thread (:class:`Worker`): everything sent to a target goes
through it, in order, so prefill appends of layer ``i`` stream out while the host computes
layer ``i + 1``, and a decode step's attention request always follows the appends it needs.
The native calls release the GIL, so workers of different targets run in parallel.
"""

from __future__ import annotations

import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence

import torch

from .. import _native

__all__ = ["partition", "TargetPool", "Worker", "DEFAULT_DIR"]

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

# SPDX-License-Identifier: Apache-2.0
"""The host's own share of a decode step, made cheaper on a CPU.

A decode step multiplies a few rows (one per sequence of the batch) by every weight
matrix of the model, so on a CPU it streams the weights from memory, and two things
there cost more than the streaming itself:

* ``F.linear`` (``x @ W.T``) makes MKL's sgemm copy the whole weight matrix into its
  packed layout on every call, for the sake of a handful of rows: for SmolLM2-135M at 8
  rows, a step's matrices take about twice as long as ``W @ x.T``, in which the weights
  are the left operand and are read in place (``bench``-style microbenchmark over
  distinct weights, so caches are cold as in a step: 187 against 93 ms; 151 against 60 at
  2 rows). From a few hundred rows on (a prompt) the packed product is faster again, so
  :func:`fit_for_decode` switches per call on the row count.
* Python's cyclic garbage collector walks the ~400,000 objects a loaded transformers
  model holds, again and again as a step allocates its tensors: about a tenth of a
  decode step's CPU time on 2 cores. :func:`freeze_loaded` moves what is loaded into the
  collector's permanent generation, which it does not walk.

Neither changes what is computed beyond float rounding: the two products sum in their
own orders, and every backend runs on the same host model, so their outputs stay
comparable token for token.
"""

from __future__ import annotations

import atexit
import gc

import torch

__all__ = ["SKINNY_ROWS", "fit_for_decode", "freeze_loaded"]

#: At most this many rows, a CPU linear layer computes ``W @ x.T`` (weights read in
#: place); above it, ``F.linear`` (weights packed per call, the faster for a prompt).
SKINNY_ROWS = 64


def _skinny_forward(layer: torch.nn.Linear):
    linear = torch.nn.functional.linear

    def forward(x: torch.Tensor) -> torch.Tensor:
        weight, bias = layer.weight, layer.bias
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows == 0 or rows > SKINNY_ROWS:
            return linear(x, weight, bias)
        y = (weight @ x.reshape(rows, x.shape[-1]).T).T
        if bias is not None:
            y = y + bias
        return y.contiguous().reshape(*x.shape[:-1], weight.shape[0])

    return forward


def fit_for_decode(model: torch.nn.Module) -> int:
    """Gives every ``nn.Linear`` of ``model`` whose weights are on the CPU the row-count
    switch described in the module docs; returns how many layers it changed. A model on a
    GPU is left as it is (cuBLAS does not repack per call)."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.device.type == "cpu":
            module.forward = _skinny_forward(module)
            changed += 1
    return changed


_unfreeze_registered = False


def freeze_loaded() -> None:
    """Collects garbage once, then moves every live object into the garbage collector's
    permanent generation (``gc.freeze``), so that later collections skip a loaded model.
    They are moved back at exit, so that interpreter shutdown frees them as usual."""
    global _unfreeze_registered
    gc.collect()
    gc.freeze()
    if not _unfreeze_registered:
        atexit.register(gc.unfreeze)
        _unfreeze_registered = True

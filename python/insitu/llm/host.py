# SPDX-License-Identifier: Apache-2.0
"""The host's own share of a decode step, made cheaper on a CPU.

A decode step multiplies a few rows (one per sequence of the batch) by every weight
matrix of the model, so on a CPU it streams the weights from memory. ``F.linear``
(``x @ W.T``) makes MKL's sgemm copy the whole weight matrix into its packed layout on
every call, for the sake of a handful of rows. ``W @ x.T`` has the weights as the left
operand, read in place: over a step's matrices of SmolLM2-135M (distinct weights, so the
caches are as cold as in a step), 93 ms against 187 at 8 rows and 60 against 151 at 2.
From a few hundred rows on (a prompt) the packed product is faster again, so
:func:`fit_for_decode` switches per call on the row count.

This changes what is computed by float rounding only (the two products sum in their own
orders), and every backend runs on the same host model, so their outputs stay comparable
token for token.
"""

from __future__ import annotations

import torch

__all__ = ["SKINNY_ROWS", "fit_for_decode"]

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

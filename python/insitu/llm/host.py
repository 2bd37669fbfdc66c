# SPDX-License-Identifier: Apache-2.0
"""The host's own share of a decode step, made cheaper on a CPU.

A decode step multiplies a few rows (one per sequence of the batch) by every weight
matrix of the model, so on a CPU its time is the time to stream the weights from memory.
Two things shorten it:

* **Weights read in their GGUF blocks.** A model loaded from a GGUF file is de-quantized to
  f32 (128 bytes per 32 weights); its file holds them as Q4_1 (20 bytes) or Q8_0 (34).
  :func:`fit_for_decode` keeps each matrix's blocks beside it (``insitu.BlockMatrix``), and
  a decode step's rows are multiplied by the blocks, de-quantized in registers. Each
  weight is de-quantized with the bits the f32 load has (checked per matrix when it is
  fitted: a matrix whose blocks do not de-quantize to exactly its f32 weights keeps the
  f32 product), so the product differs from the f32 one in the order of its sums only.
  Over a step's 211 matrices of SmolLM2-135M on 2 cores (each product on one core, the f32
  one on both; eight alternating passes), in ms: 25-32 against 75-85 at 1 row, 38-46
  against 54-58 at 2, 44-46 against 49-55 at 4, 66-71 against 81-109 at 8; at 12 rows
  114-144 against 119-141, so blocks serve up to :data:`BLOCK_ROWS` rows.
* **f32 weights read in place.** ``F.linear`` (``x @ W.T``) makes MKL's sgemm copy the
  whole weight matrix into its packed layout on every call, for the sake of a handful of
  rows. ``W @ x.T`` has the weights as the left operand, read in place: 93 ms against 187
  at 8 rows and 60 against 151 at 2. This serves matrices without blocks.

From a few hundred rows on (a prompt) the packed f32 product is faster again, so the
switch is per call, on the row count. Every backend runs on the same host model, so their
outputs stay comparable token for token.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

__all__ = ["SKINNY_ROWS", "BLOCK_ROWS", "fit_for_decode", "gguf_blocks"]

#: At most this many rows, a CPU linear layer computes from its blocks or with ``W @ x.T``
#: (weights read in place); above it, ``F.linear`` (weights packed per call, the faster
#: for a prompt).
SKINNY_ROWS = 64

#: At most this many rows, a linear layer with GGUF blocks multiplies from them.
BLOCK_ROWS = 8


def _skinny_forward(layer: torch.nn.Linear, blocks=None):
    linear = torch.nn.functional.linear

    def forward(x: torch.Tensor) -> torch.Tensor:
        weight, bias = layer.weight, layer.bias
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows == 0 or rows > SKINNY_ROWS:
            return linear(x, weight, bias)
        x2 = x.reshape(rows, x.shape[-1])
        if blocks is not None and rows <= BLOCK_ROWS and x2.dtype == torch.float32:
            out = blocks.matmul(x2.detach().contiguous().numpy().tobytes(), rows)
            y = torch.frombuffer(out, dtype=torch.float32).view(rows, weight.shape[0])
        else:
            y = (weight @ x2.T).T
        if bias is not None:
            y = y + bias
        return y.contiguous().reshape(*x.shape[:-1], weight.shape[0])

    return forward


def gguf_blocks(model: torch.nn.Module, path: str) -> Dict[str, object]:
    """The ``insitu.BlockMatrix`` of each CPU ``nn.Linear`` of ``model`` (by module name)
    whose weights the GGUF file ``path`` holds as Q4_1 or Q8_0 blocks that de-quantize to
    exactly the module's f32 weights. A tied output layer finds the blocks of the matrix
    it shares (the token embedding)."""
    import gguf
    import numpy as np

    from .. import _native

    arch_name, directory = _native.gguf_tensors(path)
    arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(arch_name)
    if arch is None:
        return {}
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", 0)
    names = gguf.get_tensor_name_map(arch, layers)
    tensors = {name: (dims, fmt, offset, size) for name, dims, fmt, offset, size in directory}
    # The GGUF tensor of each parameter that has one, by the parameter's storage, so that
    # a module sharing it (a tied output layer) finds it too.
    by_storage = {}
    for mname, module in model.named_modules():
        weight = getattr(module, "weight", None)
        gname = names.get_name(mname)
        if isinstance(weight, torch.Tensor) and gname and gname + ".weight" in tensors:
            by_storage.setdefault(weight.data_ptr(), tensors[gname + ".weight"])
    out = {}
    with open(path, "rb") as f:
        for mname, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or module.weight.device.type != "cpu" or module.weight.dtype != torch.float32:
                continue
            dims, fmt, offset, size = by_storage.get(module.weight.data_ptr(), (None, None, 0, None))
            rows, cols = module.weight.shape
            if size is None or dims != [cols, rows]:
                continue
            f.seek(offset)
            data = np.frombuffer(f.read(size), dtype=np.uint8)
            if data.size != size:
                continue
            data = data.reshape(rows, -1)
            for order in _row_orders(model, rows):
                bm = _native.BlockMatrix(fmt, rows, cols, np.ascontiguousarray(data[order]).tobytes())
                if torch.equal(torch.frombuffer(bm.dequantize(), dtype=torch.float32).view(rows, cols), module.weight):
                    out[mname] = bm
                    break
    return out


def _row_orders(model: torch.nn.Module, rows: int):
    """The orders in which a GGUF matrix's rows may stand in the loaded model: as stored,
    or (a llama-style query or key projection) with each head's rotary halves interleaved
    back, as transformers un-permutes them on load."""
    import numpy as np

    yield np.arange(rows)
    config = getattr(model, "config", None)
    for heads in {getattr(config, "num_attention_heads", 0), getattr(config, "num_key_value_heads", 0)}:
        if heads and rows % (2 * heads) == 0:
            yield np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(rows)


def fit_for_decode(model: torch.nn.Module, gguf_path: Optional[str] = None) -> int:
    """Gives every ``nn.Linear`` of ``model`` whose weights are on the CPU the row-count
    switch described in the module docs, with the GGUF file's blocks where ``gguf_path``
    has them (:func:`gguf_blocks`); returns how many layers it changed. A model on a GPU
    is left as it is (cuBLAS does not repack per call). The blocks are the file's: a model
    whose weights change after loading is fitted again without ``gguf_path``."""
    blocks = gguf_blocks(model, gguf_path) if gguf_path else {}
    changed = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module.weight.device.type == "cpu":
            module.forward = _skinny_forward(module, blocks.get(name))
            changed += 1
    return changed

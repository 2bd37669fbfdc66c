# SPDX-License-Identifier: Apache-2.0
"""The two hooks that put a Hugging Face transformers model's KV cache on targets.

transformers 5 lets a model's attention be replaced without touching its code:

* :data:`ATTENTION` (``"insitu"``) is registered with ``AttentionInterface`` and selected
  with ``model.set_attn_implementation("insitu")``; every attention layer then calls
  :func:`offload_attention` instead of sdpa.
* :class:`OffloadCache`, a ``Cache`` passed as ``past_key_values``, receives each layer's
  fresh K and V (``update``) just before that layer's attention runs.

The same name is registered with ``AttentionMaskInterface`` (sdpa's mask function): masks
are built per attention implementation, and an unregistered name silently gets *no mask at
all*, which drops causal and padding masking from prefill. :func:`register` does both.

How a layer runs (``update`` first, then attention):

* **Prefill** (the first tokens of an empty cache): ``update`` queues this layer's K and V
  for the targets, to be sent while the next layers compute, and hands the fresh K and V
  back; attention of the prompt over itself is computed here on the host with sdpa and
  the causal/padding mask (prefill attention stays on the host, as in InstInfer).
* **Decode** (tokens after that): only q and the new token's k and v go to the targets, in
  one command per target, and the attention outputs come back. Several new tokens in one
  call are sent one after the other, each attending to everything before it and itself, so
  causality holds without a mask.

``update`` cannot hand the cache to the attention function (transformers passes the
attention function neither), so it leaves it in a thread-local slot that the attention
function of the same layer takes; the layer index is checked on both sides.
"""

from __future__ import annotations

import abc
import threading
import time
from typing import Dict, List, Optional, Tuple

import torch
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

__all__ = ["ATTENTION", "register", "offload_attention", "OffloadCache", "KVStore"]

ATTENTION = "insitu"

_current = threading.local()


class KVStore(abc.ABC):
    """Where an :class:`OffloadCache` keeps K and V and computes decode attention.

    Shapes follow transformers: ``B`` batch rows, ``Hq`` query heads, ``Hkv`` KV heads,
    ``D`` head size, ``group = Hq / Hkv`` query heads per KV head (consecutive query
    heads share a KV head).
    """

    @abc.abstractmethod
    def prefill(self, layer: int, k: torch.Tensor, v: torch.Tensor, valid: Optional[torch.Tensor]) -> None:
        """Stores the prompt's K and V (``[B, Hkv, T, D]``) of ``layer``, without waiting.
        ``valid`` (``[B, T]`` bool, or None for all) marks the real tokens: padding is not
        stored, so each sequence holds only its own tokens."""

    @abc.abstractmethod
    def decode(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Appends one token per row (``k``, ``v``: ``[B, Hkv, D]``) and returns the
        attention of ``q`` (``[B, Hq, D]``) over each row's cache, ``[B, Hq, D]``."""

    @abc.abstractmethod
    def stats(self) -> Dict[str, int]:
        """``bytes_to_host``, ``bytes_from_host`` (on the links) and ``media_bytes`` (read
        from the media for attention) so far."""

    def flush(self) -> None:
        """Waits until every queued transfer is done."""

    def close(self) -> None:
        """Frees what the store holds on its targets."""


class _Layer(CacheLayerMixin):
    """One layer's view for transformers: only the length (padding included), from which
    masks and positions are sized; the data live in the store."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self):
        super().__init__()
        self.length = 0

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        raise RuntimeError("OffloadCache.update stores the states; a layer is never updated alone")

    def get_mask_sizes(self, query_length: int):
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        raise RuntimeError("an OffloadCache cannot be reset: make a new one")


class OffloadCache(Cache):
    """A ``Cache`` whose K and V live in a :class:`KVStore` (targets, or the FlexGen
    baseline's blocks). Use with ``attn_implementation="insitu"`` (see :func:`register`).

    ``set_padding(mask)`` before the prefill forward tells the store which prompt positions
    are padding (the 2D ``attention_mask``), so they are not stored. :meth:`close` (or
    ``with``) frees the store's sequences.
    """

    def __init__(self, store: KVStore, layers: int):
        super().__init__(layers=[_Layer() for _ in range(layers)])
        self.store = store
        self._valid: Optional[torch.Tensor] = None
        self._prefill = [False] * layers
        #: Seconds spent in decode attention so far (queries out to outputs back, every
        #: layer), the part of a step the store is responsible for.
        self.attention_s = 0.0
        #: When a list, each decode attention's ``(start, end)`` (``time.perf_counter``)
        #: is appended: how a benchmark finds when several micro-batches all wait on
        #: their stores at once.
        self.attention_spans: Optional[List[Tuple[float, float]]] = None

    def set_padding(self, attention_mask: Optional[torch.Tensor]) -> None:
        """Marks the real tokens of the next (prefill) forward: ``[B, T]``, 1 = real."""
        self._valid = None if attention_mask is None else attention_mask.bool()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        if not layer.is_initialized:
            layer.lazy_initialization(key_states, value_states)
        prefill = layer.length == 0
        if prefill:
            valid = self._valid
            if valid is not None and tuple(valid.shape) != (key_states.shape[0], key_states.shape[2]):
                raise ValueError(f"padding mask {tuple(valid.shape)} does not match the prompt ({key_states.shape[0]} rows of {key_states.shape[2]} tokens)")
            self.store.prefill(layer_idx, key_states, value_states, valid)
            if layer_idx == len(self.layers) - 1:
                self._valid = None
        self._prefill[layer_idx] = prefill
        layer.length += key_states.shape[2]
        _current.slot = (self, layer_idx)
        return key_states, value_states

    def load(self, keys, values) -> None:
        """Starts from K and V computed elsewhere (e.g. a ``DynamicCache``'s, per layer
        ``[B, Hkv, T, D]``), as if a prefill of ``T`` tokens had stored them; waits until
        they are stored. The next forward is a decode step."""
        if len(keys) != len(self.layers) or len(values) != len(self.layers):
            raise ValueError(f"{len(keys)} layers of keys for a cache of {len(self.layers)}")
        if any(layer.length for layer in self.layers):
            raise ValueError("load needs an empty cache")
        for i, (k, v) in enumerate(zip(keys, values)):
            self.layers[i].lazy_initialization(k, v)
            self.store.prefill(i, k, v, None)
            self.layers[i].length = k.shape[2]
        self.store.flush()

    def attend(self, module, query, key, value, attention_mask, scaling, **kwargs):
        """The attention of one layer (called by :func:`offload_attention`)."""
        layer = module.layer_idx
        if self._prefill[layer]:
            kwargs.pop("dropout", None)
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=scaling, **kwargs)
        scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
        t0 = time.perf_counter()
        outs = [self.store.decode(layer, query[:, :, i], key[:, :, i], value[:, :, i], scale) for i in range(query.shape[2])]
        t1 = time.perf_counter()
        self.attention_s += t1 - t0
        if self.attention_spans is not None:
            self.attention_spans.append((t0, t1))
        # [B, T, Hq, D], the layout transformers' attention functions return.
        return torch.stack(outs, dim=1).to(query.dtype), None

    def stats(self) -> Dict[str, int]:
        return self.store.stats()

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "OffloadCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def offload_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The ``"insitu"`` attention function: hands the layer to its :class:`OffloadCache`."""
    slot = getattr(_current, "slot", None)
    _current.slot = None
    if slot is None or slot[1] != module.layer_idx:
        raise RuntimeError(
            'attn_implementation "insitu" needs past_key_values=OffloadCache(...) and use_cache=True '
            "(the cache did not see this layer's keys before its attention)"
        )
    return slot[0].attend(module, query, key, value, attention_mask, scaling, **kwargs)


def register() -> str:
    """Registers the ``"insitu"`` attention function and its mask function (sdpa's);
    idempotent. Returns the name to give ``set_attn_implementation``."""
    AttentionInterface.register(ATTENTION, offload_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION

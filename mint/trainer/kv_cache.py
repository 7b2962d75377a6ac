"""A KV cache that decoding writes into instead of growing: each layer's keys and values live in
buffers sized once for the whole decode.

transformers' `DynamicLayer` appends each step's keys and values with `torch.cat`, which copies
the whole cache of every layer at every token: quadratic in the sequence, and on a CPU a tenth
of a decode step's time at RL sizes. `reserve` swaps each plain dynamic layer of a prefilled
cache for a `PreallocatedLayer` with room for `extra` more tokens; a step then writes its
token's keys and values in place and attention reads a view of the filled part. The layer
keeps `keys` / `values` as those views, so everything that reads a transformers cache layer
(masks, `get_seq_length`, the prompt cache) sees the same tensors as before. Layers of other
kinds (sliding windows, linear attention) are left as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One decoder layer's KV in buffers of shape (batch, heads, capacity, head_dim), filled up
    to `length`; `keys` and `values` are views of the filled part. Writing past the capacity
    doubles it (one copy), so a decode longer than planned still runs."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        super().__init__()
        self.length = keys.shape[-2]
        self._key_buffer = _buffer_like(keys, max(capacity, self.length))
        self._value_buffer = _buffer_like(values, max(capacity, self.length))
        self._key_buffer[:, :, : self.length] = keys
        self._value_buffer[:, :, : self.length] = values
        self.device = keys.device
        self.is_initialized = True
        self._expose()

    @property
    def capacity(self) -> int:
        return self._key_buffer.shape[-2]

    def _expose(self) -> None:
        self.keys = self._key_buffer[:, :, : self.length]
        self.values = self._value_buffer[:, :, : self.length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            self._grow(max(end, 2 * self.capacity))
        self._key_buffer[:, :, self.length : end] = key_states
        self._value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def _grow(self, capacity: int) -> None:
        keys, values = self._key_buffer, self._value_buffer
        self._key_buffer = _buffer_like(keys, capacity)
        self._value_buffer = _buffer_like(values, capacity)
        self._key_buffer[:, :, : self.length] = keys[:, :, : self.length]
        self._value_buffer[:, :, : self.length] = values[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, not {tokens_to_remove}")
        self.length = max(self.length + tokens_to_remove, 0)
        self._expose()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows `indices` (finished requests leaving the batch): one copy of the filled part."""
        self._key_buffer = self._key_buffer[indices]
        self._value_buffer = self._value_buffer[indices]
        self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._key_buffer = self._key_buffer.repeat_interleave(repeats, dim=0)
        self._value_buffer = self._value_buffer.repeat_interleave(repeats, dim=0)
        self._expose()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def reset(self) -> None:
        self.length = 0
        self._expose()


def _buffer_like(tensor: torch.Tensor, capacity: int) -> torch.Tensor:
    batch, heads, _, head_dim = tensor.shape
    return tensor.new_empty((batch, heads, capacity, head_dim))


def reserve(cache: Any, extra: int) -> None:
    """Give every plain dynamic layer of `cache` (a transformers `Cache`, prefilled) room for
    `extra` more tokens without copying again: each becomes a `PreallocatedLayer`."""
    for index, layer in enumerate(getattr(cache, "layers", ())):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.numel():
            cache.layers[index] = PreallocatedLayer(layer.keys, layer.values, layer.keys.shape[-2] + extra)

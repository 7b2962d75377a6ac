"""The preallocated KV cache: the same keys and values as transformers' growing cache through
every operation decoding uses, written in place."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from mint.trainer.kv_cache import PreallocatedLayer, reserve

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]


def kv(generator: torch.Generator, batch: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 2, tokens, 4, generator=generator), torch.randn(batch, 2, tokens, 4, generator=generator)


def assert_same(layer: PreallocatedLayer, other: DynamicLayer) -> None:
    assert layer.get_seq_length() == other.get_seq_length()
    assert torch.equal(layer.keys, other.keys) and torch.equal(layer.values, other.values)


def test_a_preallocated_layer_holds_what_a_growing_one_holds() -> None:
    generator = torch.Generator().manual_seed(0)
    grown = DynamicLayer()
    grown.update(*kv(generator, 4, 5))
    layer = PreallocatedLayer(grown.keys, grown.values, capacity=8)
    buffer = layer._key_buffer
    for _ in range(3):  # decode steps within the capacity: written in place, no new buffer
        step = kv(generator, 4, 1)
        assert all(torch.equal(a, b) for a, b in zip(layer.update(*step), grown.update(*step), strict=True))
    assert layer._key_buffer is buffer and layer.capacity == 8
    assert_same(layer, grown)
    rows = torch.tensor([0, 2])  # finished rows leave
    layer.batch_select_indices(rows)
    grown.batch_select_indices(rows)
    assert_same(layer, grown)
    for _ in range(4):  # past the capacity: it doubles once and goes on
        step = kv(generator, 2, 1)
        layer.update(*step)
        grown.update(*step)
    assert layer.capacity == 16
    assert_same(layer, grown)
    layer.crop(-3)
    grown.crop(-3)
    assert_same(layer, grown)


def test_reserve_swaps_only_filled_dynamic_layers() -> None:
    generator = torch.Generator().manual_seed(1)
    cache = DynamicCache(ddp_cache_data=[kv(generator, 2, 3), kv(generator, 2, 3)])
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    reserve(cache, extra=10)
    assert all(isinstance(layer, PreallocatedLayer) and layer.capacity == 13 for layer in cache.layers)
    assert all(
        torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
        for layer, (keys, values) in zip(cache.layers, before, strict=True)
    )
    assert cache.get_seq_length() == 3

"""The batch-invariant operations: a row's bits do not depend on the rows beside it.

Each check compares a row computed inside a larger batch with the same row computed in a batch
of another size (and at another offset), bit for bit, as `batch_invariance` promises; the
plain kernels are compared too, to show what the tiling and the blocks are for where the host's
kernels do vary.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mint.trainer.batch_invariance import RowSpan, batch_invariant, blocked_elementwise, tiled_linear

pytestmark = pytest.mark.backend_free


def test_a_tiled_linear_gives_a_row_the_same_bits_in_any_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    for in_features, out_features in ((128, 128), (576, 1536), (1536, 576), (64, 8)):
        weight = torch.randn(out_features, in_features, generator=generator)
        x = torch.randn(300, in_features, generator=generator)
        whole = tiled_linear(x, weight)
        assert torch.allclose(whole, F.linear(x, weight), rtol=1e-4, atol=1e-4)
        for start, count in ((0, 1), (0, 3), (5, 9), (37, 64), (100, 200)):
            assert torch.equal(tiled_linear(x[start : start + count], weight), whole[start : start + count])
        # 3-D inputs are their rows, end to end.
        assert torch.equal(tiled_linear(x.view(3, 100, in_features), weight), whole.view(3, 100, out_features))


def test_element_wise_functions_give_an_element_the_same_bits_wherever_it_sits() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    for func in (torch.sigmoid, F.silu, torch.exp):
        whole = blocked_elementwise(func, x)
        assert torch.allclose(whole, func(x), rtol=1e-6)
        for stop in (1, 7, 33, 999):  # the last elements of a short tensor: a scalar loop plainly
            assert torch.equal(blocked_elementwise(func, x[:stop]), whole[:stop])


def test_attention_runs_each_span_of_rows_at_its_own_width() -> None:
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(5, 2, 40, 16, generator=generator) for _ in range(3))
    spans = [RowSpan(0, 2, 40), RowSpan(2, 5, 23)]
    with batch_invariant(spans):
        both = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with batch_invariant():
        first = F.scaled_dot_product_attention(q[:2], k[:2], v[:2], is_causal=True)
        second = F.scaled_dot_product_attention(
            q[2:, :, :23], k[2:, :, :23], v[2:, :, :23], attn_mask=None, is_causal=True
        )
    assert torch.equal(both[:2], first)
    assert torch.equal(both[2:, :, :23], second)
    assert not both[2:, :, 23:].any()  # past a span's width: zeros, never read
    with batch_invariant([RowSpan(0, 4, 40)]), pytest.raises(RuntimeError, match="row spans"):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)  # a layout of another batch

"""A linear layer whose weight is prepacked by oneDNN computes what `nn.Linear` computes, holds no
parameters, and leaves alone the weights it cannot pack."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mint.trainer.packed_linear import PackedLinear

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]


@pytest.mark.parametrize("bias", [True, False])
def test_a_packed_float32_linear_computes_what_the_plain_one_does(bias: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 160, bias=bias)
    packed = PackedLinear.of(linear)
    assert isinstance(packed, PackedLinear)
    assert (packed.in_features, packed.out_features) == (96, 160)
    assert list(packed.parameters()) == []  # nothing for an optimizer or a state dict to meet
    with torch.no_grad():
        for x in (
            torch.randn(3, 7, 96),  # batch, tokens, features
            torch.randn(1, 96),
            torch.randn(0, 96),
            torch.randn(96, 5).T,  # a transposed (strided) input
        ):
            assert packed(x).shape == (*x.shape[:-1], 160)
            torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)


def test_a_bfloat16_linear_is_packed_only_where_it_computes_the_same() -> None:
    torch.manual_seed(1)
    linear = nn.Linear(64, 32).to(torch.bfloat16)
    layer = PackedLinear.of(linear)  # packed where oneDNN has bfloat16 kernels, else the layer itself
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x).float(), linear(x).float(), rtol=2e-2, atol=2e-2)


def test_half_precision_weights_stay_plain() -> None:
    linear = nn.Linear(8, 8).to(torch.float16)
    assert PackedLinear.of(linear) is linear

"""A frozen linear layer whose weight is prepacked once in the CPU GEMM library's own layout.

torch's CPU linear multiplies a plain row-major weight with MKL's GEMM, whose kernels are at
their worst on the few rows a serving step has: one token per request while decoding, a short
prompt in a prefill. oneDNN (torch's `mkldnn` ops) can reorder a weight once into the blocked
layout its kernels stream from, and multiply any number of rows by it afterwards. On the
2-core CPUs Mint is tested on, with weights that do not stay in cache (a model's layers):

- AMD EPYC (AVX2), float32, a 576 x 1536 weight: 0.6-0.7 of the plain product's time at 1, 2,
  16, 34 and 128 rows;
- Intel Xeon with AMX, 16 rows of SmolLM2's layers: 0.74 in bfloat16, 0.95 in float32.

The results differ from the plain product by float rounding only (the sums run in another
order).

The packed weight replaces the plain one, it is not a second copy, so only a base that no
longer trains may be packed: the torch serving engine's. `PackedLinear.of` packs a linear
where it pays and is supported: a CPU weight in float32, or in bfloat16 where oneDNN has
bfloat16 kernels (AVX512-BF16 or AMX). Other layers (GPUs, float16, a torch built without
oneDNN) stay as they are.
"""

from __future__ import annotations

import torch
from torch import nn


def _prepacks(weight: torch.Tensor) -> bool:
    """Whether oneDNN multiplies `weight`'s dtype on its device from a prepacked layout here."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    if weight.dtype == torch.float32:
        return True
    return weight.dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """`nn.Linear`'s forward (x W^T + b) from a weight prepacked by oneDNN; frozen, no gradients.

    `weight` is the packed tensor (oneDNN layout): it has the plain weight's shape, dtype and
    device, and no strides. The layer holds it as an attribute, not a parameter, so nothing
    that walks a model's parameters or state dict (an optimizer, a save) meets it.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    @classmethod
    def of(cls, linear: nn.Linear) -> nn.Linear | PackedLinear:
        """`linear` packed where oneDNN serves its weight's dtype and device, else `linear` itself."""
        return cls(linear) if _prepacks(linear.weight) else linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

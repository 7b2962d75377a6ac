"""Which dtype a base computes in on this machine, and the matmul peak model FLOP utilisation is
measured against.

A base's YAML says the dtype its weights are cached in (`dtype`). A worker or serving node may
compute in another (`MINT_COMPUTE_DTYPE`): `auto` takes bfloat16 where the hardware multiplies it
fast (a CUDA device with bf16 support; a CPU with AMX or AVX-512 BF16, about five times its fp32
rate on these 2-core machines) and float32 elsewhere. LoRA weights and Adam moments stay float32
whatever the base computes in (peft keeps an adapter in float32 over a half-precision base), so
only the frozen base's matmuls and activations change; logprobs are always taken in float32 from
the logits. The default (no setting) keeps the base's own dtype: the suite's exactness checks
(sampler against trainer, resumed against uninterrupted) run in float32.

`matmul_peak_flops` times square matmuls in a dtype on this process's threads: the peak an MFU
figure divides by, measured in the same run as the figure, on the same cores.
"""

from __future__ import annotations

import time
from typing import Literal

import torch

ComputeDtype = Literal["auto", "float32", "bfloat16", "float16"]


def fast_bfloat16(device: torch.device | str) -> bool:
    """Whether `device` multiplies bfloat16 matrices natively (faster than float32)."""
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        capabilities = torch.cpu.get_capabilities()
        return bool(capabilities.get("amx_bf16") or capabilities.get("avx512_bf16"))
    return False


def compute_dtype(setting: ComputeDtype | None, base_dtype: str, device: torch.device | str) -> str:
    """The dtype a base loads in: the base's own without a setting, bfloat16 for `auto` on
    hardware with a fast bf16 path (else float32), or the dtype the setting names."""
    if setting is None:
        return base_dtype
    if setting == "auto":
        return "bfloat16" if fast_bfloat16(device) else "float32"
    return setting


def matmul_peak_flops(
    dtype: torch.dtype, device: torch.device | str = "cpu", *, size: int = 2048, repeats: int = 12
) -> float:
    """FLOP/s of the best of `repeats` `size`-square matmuls in `dtype` on this process's threads,
    after two unmeasured ones (the first calls pay for the kernel's set-up: AMX tile
    configuration, oneDNN's primitive cache, CUDA's context)."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    for _ in range(2):
        torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        torch.mm(a, b)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def model_flops(parameters: int, forward_tokens: float, trained_tokens: float) -> float:
    """The model FLOPs of some work: 2N per token through a forward pass (sampling, scoring) and
    6N per token trained (forward and backward), N the parameters a token goes through."""
    return 2 * parameters * forward_tokens + 6 * parameters * trained_tokens

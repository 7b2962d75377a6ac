"""Packed forward passes: many data in one row, no padding, and their per-token logprobs.

The data are concatenated into one row of N tokens whose position ids restart at 0 for each
datum. With no attention mask and no cache, transformers (5.x `masking_utils`) reads the
restarts as packed-sequence boundaries and builds a block-diagonal causal mask for sdpa, eager
and flash attention alike, so no token attends across data and RoPE positions are per datum.
Routed experts act per token, so MoE layers need nothing more. The tests check that packed
logprobs equal one-forward-per-datum logprobs.

`token_logprobs` is THE logprob computation: `forward`, `forward_backward` and `sample` all use
it, so that sampled logprobs and trained logprobs agree (no train/inference mismatch in RL).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from mint.trainer.types import Datum


@dataclass(frozen=True)
class PackedBatch:
    """Data laid end to end in one row."""

    input_ids_1_N: torch.Tensor
    position_ids_1_N: torch.Tensor
    targets_N: torch.Tensor
    lengths: list[int]


def pack(data: Sequence[Datum], device: torch.device) -> PackedBatch:
    """Concatenate `data` into one row with per-datum positions and next-token targets."""
    lengths = [datum.length for datum in data]
    input_ids = [token for datum in data for token in datum.model_input]
    targets = [token for datum in data for token in datum.target_tokens]
    positions = [position for length in lengths for position in range(length)]
    return PackedBatch(
        input_ids_1_N=torch.tensor([input_ids], dtype=torch.long, device=device),
        position_ids_1_N=torch.tensor([positions], dtype=torch.long, device=device),
        targets_N=torch.tensor(targets, dtype=torch.long, device=device),
        lengths=lengths,
    )


def token_logprobs(logits_N_V: torch.Tensor, targets_N: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[target] in float32, for each of N positions.

    Computed as logit[target] - logsumexp(logits), which is the same number as gathering from
    `log_softmax` without keeping an (N, V) table of logprobs alive for the backward pass.
    """
    logits_N_V = logits_N_V.float()
    picked_N = logits_N_V.gather(-1, targets_N.unsqueeze(-1)).squeeze(-1)
    return picked_N - torch.logsumexp(logits_N_V, dim=-1)


def packed_logprobs(model: nn.Module, batch: PackedBatch) -> list[torch.Tensor]:
    """One forward over the packed row; returns each datum's `logprobs_T` (with grad if enabled)."""
    output = model(
        input_ids=batch.input_ids_1_N,
        position_ids=batch.position_ids_1_N,
        # attention_mask=None and no cache: the position restarts are the packing boundaries.
        attention_mask=None,
        use_cache=False,
    )
    logprobs_N = token_logprobs(output.logits[0], batch.targets_N)
    return list(torch.split(logprobs_N, batch.lengths))

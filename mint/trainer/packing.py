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

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

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


# Architectures whose logits are exactly lm_head(final hidden state): no logit scaling or
# soft-capping between them, so the head can be applied in chunks outside the model's forward.
PLAIN_HEAD_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Glm4MoeForCausalLM", "Qwen3MoeForCausalLM"})
# Positions per chunk of the output head: bounds the (chunk, V) logits alive at once.
HEAD_CHUNK_POSITIONS = 128


def _causal_lm(model: nn.Module) -> nn.Module:
    """The transformers CausalLM under a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _chunk_logprobs(
    head: nn.Module,
    hidden_C_H: torch.Tensor,
    targets_C: torch.Tensor,
    scope: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> torch.Tensor:
    with scope():
        return token_logprobs(head(hidden_C_H), targets_C)


def packed_logprobs(
    model: nn.Module,
    batch: PackedBatch,
    spans: Sequence[tuple[int, int]] | None = None,
    span_scope: Callable[[int], AbstractContextManager[Any]] | None = None,
) -> list[torch.Tensor]:
    """One forward over the packed row; returns each datum's `logprobs_T` (with grad if enabled).

    For plain-head architectures the decoder runs once and the output head runs in chunks of
    positions; with gradients on, each chunk is recomputed in the backward pass instead of
    keeping the whole (N, V) logits table alive, which is most of the activation memory of
    a small model with a large vocabulary. Chunks never cross the boundaries of `spans` (the
    parts of a mixed-session pass), so a part's head runs on the same chunks as it would alone,
    inside `span_scope(i)` for span i (forward and recomputation alike).
    """
    causal = _causal_lm(model)
    architectures = getattr(causal.config, "architectures", None) or [type(causal).__name__]
    if architectures[0] not in PLAIN_HEAD_ARCHITECTURES or not hasattr(causal, "get_decoder"):
        output = model(
            input_ids=batch.input_ids_1_N,
            position_ids=batch.position_ids_1_N,
            # attention_mask=None and no cache: the position restarts are the packing boundaries.
            attention_mask=None,
            use_cache=False,
        )
        logprobs_N = token_logprobs(output.logits[0], batch.targets_N)
        return list(torch.split(logprobs_N, batch.lengths))
    hidden_N_H = causal.get_decoder()(
        input_ids=batch.input_ids_1_N, position_ids=batch.position_ids_1_N, attention_mask=None, use_cache=False
    ).last_hidden_state[0]
    head = causal.get_output_embeddings()
    chunks = []
    for index, (span_start, span_stop) in enumerate(spans or [(0, hidden_N_H.shape[0])]):
        scope = functools.partial(span_scope, index) if span_scope is not None else nullcontext
        for start in range(span_start, span_stop, HEAD_CHUNK_POSITIONS):
            stop = min(start + HEAD_CHUNK_POSITIONS, span_stop)
            hidden_C_H, targets_C = hidden_N_H[start:stop], batch.targets_N[start:stop]
            if torch.is_grad_enabled():  # recomputed in the backward pass, in its scope again
                chunks.append(checkpoint(_chunk_logprobs, head, hidden_C_H, targets_C, scope, use_reentrant=False))
            else:
                chunks.append(_chunk_logprobs(head, hidden_C_H, targets_C, scope))
    return list(torch.split(torch.cat(chunks), batch.lengths))

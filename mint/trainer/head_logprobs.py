"""Logprobs of target tokens from the output head: THE logprob computation, and its gradient.

`token_logprobs` turns logits into the logprob of each target token; `forward`,
`forward_backward` and `sample` all use it, so that sampled logprobs and trained logprobs agree
(no train/inference mismatch in RL). `top_logprobs` gives the most likely tokens the same way.

`selective_head_logprobs` is the output head and `token_logprobs` together, for a pass with
gradients. Its backward pass computes the head again only at the positions whose logprob the
loss has a gradient for, and backpropagates from those (to the hidden states and to a LoRA
adapter on the head). Most positions of a training batch have none: SFT's prompt tokens
(weight 0), RL's prompt tokens (advantage 0), DPO's prompts. Recomputing the whole chunk, as a
checkpoint of the head does, costs a (positions x vocabulary) product forward and another
backward at every position; on SmolLM2 the head is a fifth of the model's multiplies per
position. A position with no gradient contributes nothing to any weight's or hidden state's
gradient, so leaving it out changes the result only by float rounding (a product over fewer rows
sums in another order), for any loss: which positions take part is read from the gradient
itself, not from the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn


def token_logprobs(logits_N_V: torch.Tensor, targets_N: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[target] in float32, for each of N positions: (N,) for targets (N,),
    (N, K) for K targets per position (N, K).

    Computed as logit[target] - logsumexp(logits), which is the same number as gathering from
    `log_softmax` without keeping an (N, V) table of logprobs alive for the backward pass.
    """
    logits_N_V = logits_N_V.float()
    if targets_N.dim() == 2:
        return logits_N_V.gather(-1, targets_N) - torch.logsumexp(logits_N_V, dim=-1, keepdim=True)
    picked_N = logits_N_V.gather(-1, targets_N.unsqueeze(-1)).squeeze(-1)
    return picked_N - torch.logsumexp(logits_N_V, dim=-1)


def top_logprobs(logits_N_V: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` most likely tokens at each of N positions and their logprobs, most likely first:
    `(ids_N_K, logprobs_N_K)`, each logprob the number `token_logprobs` gives for that token
    (logit - logsumexp, in float32), so a top-k list and a sampled token's logprob agree."""
    logits_N_V = logits_N_V.float()
    values_N_K, ids_N_K = logits_N_V.topk(min(k, logits_N_V.shape[-1]), dim=-1)
    return ids_N_K, values_N_K - torch.logsumexp(logits_N_V, dim=-1, keepdim=True)


def last_position_only(input_ids_B_T: torch.Tensor) -> torch.Tensor:
    """The `logits_to_keep` of a forward that needs only the last position's logits (a prefill):
    that position's index, as a tensor. For `logits_to_keep=1` transformers runs the head on
    `hidden[:, -1:]`, a strided view whose batched product with a bfloat16 head copies the head
    once per row (286 ms against 3.6 ms for 4 rows of SmolLM2 here, and 2x in float32); an index
    gathers the rows into a contiguous tensor first, and the head runs as one product.
    """
    return torch.tensor([input_ids_B_T.shape[-1] - 1], device=input_ids_B_T.device)


def selective_head_fits(head: nn.Module) -> bool:
    """Whether the head can be computed again on some of its positions and give them the numbers
    it gave in the pass: no dropout at work in it (a mask drawn for fewer rows would differ), and
    its weights whole in this process (a head sharded over a worker group's ranks gathers its
    weights in every call, so each rank must call it as often as the others)."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(module, nn.Dropout) and module.p > 0 and module.training for module in head.modules()):
        return False
    return not any(isinstance(parameter, DTensor) for parameter in head.parameters())


class _SelectiveHead(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        head: nn.Module,
        scope: Callable[[], AbstractContextManager[Any]],
        hidden_C_H: torch.Tensor,
        targets_C_K: torch.Tensor,
        *trainable: torch.Tensor,
    ) -> torch.Tensor:
        ctx.head, ctx.scope, ctx.saved_weights = head, scope, trainable
        ctx.save_for_backward(hidden_C_H, targets_C_K)
        with scope():
            return token_logprobs(head(hidden_C_H), targets_C_K)

    @staticmethod
    def backward(ctx: Any, grad_C_K: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        hidden_C_H, targets_C_K = ctx.saved_tensors
        rows_S = (grad_C_K.reshape(grad_C_K.shape[0], -1) != 0).any(dim=1).nonzero().squeeze(1)
        grad_hidden_C_H = torch.zeros_like(hidden_C_H) if ctx.needs_input_grad[2] else None
        if not rows_S.numel():  # the head's trained weights still get a gradient, of zeros, as autograd gives
            zeros = [torch.zeros_like(weight) for weight in ctx.saved_weights]
            return (None, None, grad_hidden_C_H, None, *zeros)
        with torch.enable_grad(), ctx.scope():
            hidden_S_H = hidden_C_H[rows_S].detach().requires_grad_(ctx.needs_input_grad[2])
            logprobs_S_K = token_logprobs(ctx.head(hidden_S_H), targets_C_K[rows_S])
            # The head's own trained weights (LoRA on it) get their gradient here.
            torch.autograd.backward(logprobs_S_K, grad_C_K[rows_S])
        if grad_hidden_C_H is not None:
            grad_hidden_C_H[rows_S] = hidden_S_H.grad
        return (None, None, grad_hidden_C_H, None, *(None for _ in ctx.saved_weights))


def selective_head_logprobs(
    head: nn.Module,
    hidden_C_H: torch.Tensor,
    targets_C_K: torch.Tensor,
    scope: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> torch.Tensor:
    """`token_logprobs(head(hidden_C_H), targets_C_K)`, (C, K), in `scope`, with gradients for
    `hidden_C_H` and the head's trained weights computed by running the head again, in the
    backward pass, at the positions the loss gives a gradient only (`selective_head_fits(head)`
    must hold). Keeps `hidden_C_H` for the backward pass, not the (C, V) logits."""
    trainable = [parameter for parameter in head.parameters() if parameter.requires_grad]
    return _SelectiveHead.apply(head, scope, hidden_C_H, targets_C_K, *trainable)

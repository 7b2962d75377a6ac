"""What a sampler reports about its prompt, from one forward over it: each prompt token's logprob,
the k most likely tokens at each position, and the logprobs of token ids the client names.

Position i of the prompt (i >= 1) is scored from the context before it, prompt[:i]; position 0
has no context and no score. Every number is `head_logprobs.token_logprobs`' (logit - logsumexp at
temperature 1, float32), the one `forward` and the sampler use, so a prompt logprob, a top-k
entry and a target logprob of the same token at the same position are the same float.

This is what the Tinker sampling routes need for `prompt_logprobs`, `topk_prompt_logprobs` and
`target_prompt_logprobs` (distillation from a teacher's top-k, SDFT, scoring choices).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from mint.errors import InvalidRequest
from mint.trainer.head_logprobs import token_logprobs, top_logprobs
from mint.trainer.packing import pack, position_outputs
from mint.trainer.types import Datum

# A target cell that asks for nothing (Tinker's convention); its logprob is reported as 0.0.
NO_TARGET = -1


@dataclass(frozen=True)
class PromptQuery:
    """What to compute over `prompt`: its tokens' logprobs, the `top_k` most likely tokens at each
    position (0: none), and the logprobs of `targets[i][j]` at position i + 1 (None: none)."""

    prompt: Sequence[int]
    logprobs: bool = False
    top_k: int = 0
    targets: Sequence[Sequence[int]] | None = None

    def check(self, vocab_out: int) -> None:
        """Refuse targets that do not match the prompt or name ids outside the vocabulary."""
        if self.targets is None:
            return
        if len(self.targets) != len(self.prompt) - 1:
            raise InvalidRequest(
                f"target_prompt_logprobs has {len(self.targets)} rows; it needs len(prompt) - 1 = "
                f"{len(self.prompt) - 1} (row i scores prompt position i + 1)",
                param="target_prompt_logprobs",
            )
        for row in self.targets:
            for token in row:
                if token != NO_TARGET and not 0 <= token < vocab_out:
                    raise InvalidRequest(
                        f"target_prompt_logprobs holds token id {token}; ids are 0 to {vocab_out - 1}, "
                        f"or {NO_TARGET} for a cell that asks for nothing",
                        param="target_prompt_logprobs",
                    )


@dataclass(frozen=True)
class PromptScores:
    """One entry per prompt position from 1 on (len(prompt) - 1 entries each)."""

    logprobs: list[float] | None
    top: list[list[tuple[int, float]]] | None  # most likely first
    targets: list[list[float]] | None  # the shape of the query's targets; 0.0 where NO_TARGET


def score_prompt(model: nn.Module, query: PromptQuery) -> PromptScores:
    """One forward over the prompt (no gradient) with whichever adapter the caller made active."""
    if len(query.prompt) < 2:
        empty: list = []
        return PromptScores(
            logprobs=empty if query.logprobs else None,
            top=empty if query.top_k else None,
            targets=[] if query.targets is not None else None,
        )
    device = model.get_input_embeddings().weight.device
    prompt = list(query.prompt)
    batch = pack([Datum(model_input=prompt[:-1], loss_fn_inputs={"target_tokens": prompt[1:]})], device)
    targets_P_K = (
        torch.tensor([list(row) for row in query.targets], dtype=torch.long, device=device)
        if query.targets is not None
        else None
    )

    def reduce(logits_C_V: torch.Tensor, start: int, stop: int) -> tuple[torch.Tensor, ...]:
        outputs = [token_logprobs(logits_C_V, batch.targets_N_K[start:stop])[:, 0]]
        if query.top_k:
            outputs += top_logprobs(logits_C_V, query.top_k)
        if targets_P_K is not None:
            cells_C_K = targets_P_K[start:stop]
            picked_C_K = token_logprobs(logits_C_V, cells_C_K.clamp(min=0))
            outputs.append(picked_C_K.masked_fill(cells_C_K == NO_TARGET, 0.0))
        return tuple(outputs)

    with torch.no_grad():
        outputs = list(position_outputs(model, batch, reduce))
    logprobs = outputs.pop(0).tolist()
    top = None
    if query.top_k:
        ids_P_K, values_P_K = outputs.pop(0).tolist(), outputs.pop(0).tolist()
        top = [list(zip(ids, values, strict=True)) for ids, values in zip(ids_P_K, values_P_K, strict=True)]
    return PromptScores(
        logprobs=logprobs if query.logprobs else None,
        top=top,
        targets=outputs.pop(0).tolist() if targets_P_K is not None else None,
    )

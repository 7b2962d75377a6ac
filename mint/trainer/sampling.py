"""Sampling with a KV cache: one prompt, `num_samples` continuations decoded as one batch.

The prompt is prefilled once; its cache is then repeated `num_samples` times and every row
decodes in lockstep. All rows have the same length at every step, so there is no padding and
no attention mask. A finished row keeps decoding (its tokens are dropped) until every row is
done, which keeps the batch rectangular.

Each chosen token's logprob is taken from the model's own distribution at temperature 1 with
`packing.token_logprobs`, the function `forward` uses, so sampled logprobs equal the logprobs
a later `forward` computes for the same tokens (up to float32 rounding). Each token's logprob
under the distribution it was actually drawn from (temperature, top-k, top-p applied) is kept
too, as `sampler_logprobs`: the stability info `stable_reinforce` weighs against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mint.trainer.packing import token_logprobs
from mint.trainer.types import SampledSequence, SamplingParams

# Extra tokens decoded before a stop string's span, so that a multi-byte character cut at the
# tail's start cannot hide a match.
_TAIL_MARGIN_TOKENS = 8


@dataclass(frozen=True)
class StopRule:
    """When a row is done: on one of `token_ids`, or when its decoded text contains one of `strings`."""

    token_ids: frozenset[int]
    strings: tuple[str, ...]

    @classmethod
    def from_params(cls, stop: Sequence[int] | Sequence[str] | None, eos_token_ids: Sequence[int]) -> StopRule:
        if stop is None:
            return cls(frozenset(eos_token_ids), ())
        return cls(
            frozenset(item for item in stop if isinstance(item, int)),
            tuple(item for item in stop if isinstance(item, str)),
        )

    def matches_text(self, tokens: list[int], decode: Callable[[list[int]], str]) -> bool:
        """Whether the text of `tokens` now contains a stop string.

        Checked after every token, so a new match ends at the newest token: decoding a tail a
        few tokens longer than the longest stop string (a token is at least one character)
        is enough, and keeps the check linear in the sequence length.
        """
        if not self.strings:
            return False
        tail = tokens[-(max(len(s) for s in self.strings) + _TAIL_MARGIN_TOKENS) :]
        text = decode(tail)
        return any(s in text for s in self.strings)


def end_of_sequence_ids(tokenizer: Any, model: nn.Module) -> tuple[int, ...]:
    """The tokens that end a sequence by default: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    generation_config = getattr(model, "generation_config", None)
    for value in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(item) for item in value)
    return tuple(sorted(ids))


def _generator(seed: int | None, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()  # a fresh non-deterministic seed; a fixed default would repeat samples
    else:
        generator.manual_seed(seed)
    return generator


def draw(
    logits_B_V: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row under temperature, top-k and top-p (nucleus); greedy at
    temperature 0. Returns the tokens and each one's logprob under the distribution it was
    drawn from (0 when greedy): what `record_stability_info` records for `stable_reinforce`."""
    logits_B_V = logits_B_V.float()
    if params.temperature == 0.0:
        return logits_B_V.argmax(dim=-1), logits_B_V.new_zeros(logits_B_V.shape[0])
    scaled_B_V = logits_B_V / params.temperature
    if params.top_k != -1 and params.top_k < scaled_B_V.shape[-1]:
        kth_B_1 = scaled_B_V.topk(params.top_k, dim=-1).values[:, -1:]
        scaled_B_V = scaled_B_V.masked_fill(scaled_B_V < kth_B_1, float("-inf"))
    if params.top_p < 1.0:
        sorted_B_V, order_B_V = scaled_B_V.sort(dim=-1, descending=True)
        cumulative_B_V = sorted_B_V.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already reach top_p; the first always stays.
        drop_sorted_B_V = (cumulative_B_V - sorted_B_V.softmax(dim=-1)) >= params.top_p
        drop_B_V = torch.zeros_like(drop_sorted_B_V).scatter(-1, order_B_V, drop_sorted_B_V)
        scaled_B_V = scaled_B_V.masked_fill(drop_B_V, float("-inf"))
    chosen_B = torch.multinomial(scaled_B_V.softmax(dim=-1), num_samples=1, generator=generator).squeeze(-1)
    return chosen_B, scaled_B_V.log_softmax(dim=-1).gather(-1, chosen_B.unsqueeze(-1)).squeeze(-1)


def choose_tokens(logits_B_V: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Draw one token per row under temperature, top-k and top-p (nucleus); greedy at temperature 0."""
    return draw(logits_B_V, params, generator)[0]


def generate(
    model: nn.Module,
    prompt_tokens: Sequence[int],
    params: SamplingParams,
    num_samples: int,
    *,
    max_new_tokens: int,
    stop: StopRule,
    decode: Callable[[list[int]], str],
) -> list[SampledSequence]:
    """Sample `num_samples` continuations of `prompt_tokens` (at most `max_new_tokens` each)."""
    device = model.get_input_embeddings().weight.device
    generator = _generator(params.seed, device)
    prompt_1_P = torch.tensor([list(prompt_tokens)], dtype=torch.long, device=device)
    # logits_to_keep=1: only the last prompt position's logits are needed, not a (P, V) table.
    output = model(input_ids=prompt_1_P, use_cache=True, logits_to_keep=1)
    cache = output.cache
    # One prefill for all rows: repeat the prompt's cache and last logits num_samples times.
    cache.batch_repeat_interleave(num_samples)
    logits_B_V = output.logits[:, -1].expand(num_samples, -1)

    tokens: list[list[int]] = [[] for _ in range(num_samples)]
    logprobs: list[list[float]] = [[] for _ in range(num_samples)]
    sampler_logprobs: list[list[float]] = [[] for _ in range(num_samples)]
    done = [False] * num_samples
    stopped = [False] * num_samples
    for step in range(max_new_tokens):
        next_B, drawn_logprobs_B = draw(logits_B_V, params, generator)
        next_logprobs_B = token_logprobs(logits_B_V, next_B)
        for row, (token, logprob, drawn) in enumerate(
            zip(next_B.tolist(), next_logprobs_B.tolist(), drawn_logprobs_B.tolist(), strict=True)
        ):
            if done[row]:
                continue
            tokens[row].append(token)
            logprobs[row].append(logprob)
            sampler_logprobs[row].append(drawn)
            if token in stop.token_ids or stop.matches_text(tokens[row], decode):
                done[row] = stopped[row] = True
        if all(done) or step + 1 == max_new_tokens:
            break
        position_B_1 = torch.full((num_samples, 1), len(prompt_tokens) + step, dtype=torch.long, device=device)
        output = model(input_ids=next_B.unsqueeze(-1), position_ids=position_B_1, cache=cache, use_cache=True)
        logits_B_V = output.logits[:, -1]
    return [
        SampledSequence(
            tokens=row_tokens,
            logprobs=row_logprobs,
            sampler_logprobs=row_drawn,
            stop_reason="stop" if row_stopped else "length",
        )
        for row_tokens, row_logprobs, row_drawn, row_stopped in zip(
            tokens, logprobs, sampler_logprobs, stopped, strict=True
        )
    ]

"""Scoring data under the model as it stands: checks, one batched forward, a loss and its gradient.

Shared by the base (every adapter disabled) and by each session (its adapter active): the caller
chooses the adapter and holds the lock; this module only turns data into numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mint.errors import InvalidRequest
from mint.trainer.losses import Loss, get_loss, policy_metrics
from mint.trainer.packing import pack, packed_logprobs
from mint.trainer.types import LOSS_INPUT_KINDS, Datum, ForwardOutput

ReferenceFn = Callable[[list[Datum]], list[torch.Tensor]]


@dataclass(frozen=True)
class ModelLimits:
    """What token ids and lengths a base accepts."""

    context_length: int
    vocab_in: int
    vocab_out: int

    @classmethod
    def of(cls, model: nn.Module, context_length: int) -> ModelLimits:
        return cls(
            context_length=context_length,
            vocab_in=int(model.get_input_embeddings().num_embeddings),
            vocab_out=int(model.get_output_embeddings().out_features),
        )

    def check_tokens(self, tokens: Sequence[int], *, vocab: int, where: str) -> None:
        if tokens and (min(tokens) < 0 or max(tokens) >= vocab):
            raise InvalidRequest(f"{where} holds token ids outside [0, {vocab})", param=where.split("[")[0])

    def check_prompt(self, prompt: Sequence[int]) -> int:
        """Refuse a prompt the model cannot continue; returns how many tokens fit after it."""
        if not prompt:
            raise InvalidRequest("prompt_tokens is empty", param="prompt_tokens")
        self.check_tokens(prompt, vocab=self.vocab_in, where="prompt_tokens")
        room = self.context_length - len(prompt)
        if room < 1:
            raise InvalidRequest(
                f"the prompt has {len(prompt)} tokens and leaves no room in the context of {self.context_length}",
                param="prompt_tokens",
            )
        return room

    def check_data(self, data: Sequence[Datum], loss: Loss | None = None) -> list[Datum]:
        """Refuse data the model cannot score, or that lack what `loss` needs, naming the datum."""
        data = list(data)
        if not data:
            raise InvalidRequest("data is empty; send at least one datum", param="data")
        required = {"target_tokens"} | (set(loss.required_inputs) if loss else set())
        for index, datum in enumerate(data):
            missing = sorted(required - set(datum.loss_fn_inputs))
            if missing:
                needed_by = f" (loss {loss.name!r} needs them)" if loss else ""
                raise InvalidRequest(f"data[{index}] lacks loss_fn_inputs {missing}{needed_by}", param="data")
            if datum.length > self.context_length:
                raise InvalidRequest(
                    f"data[{index}] has {datum.length} tokens, more than the context length {self.context_length}",
                    param="data",
                )
            self.check_tokens(datum.model_input, vocab=self.vocab_in, where=f"data[{index}].model_input")
            targets = datum.target_tokens
            if datum.targets_per_position is not None:
                if loss is not None and loss.name not in LOSSES_OF_SEVERAL_TARGETS:
                    raise InvalidRequest(
                        f"data[{index}] has {datum.targets_per_position} target_tokens per position (N, K); "
                        f"loss {loss.name!r} takes one per position. (N, K) targets work with "
                        f"{', '.join(sorted(LOSSES_OF_SEVERAL_TARGETS))} and forward",
                        param="data",
                    )
                targets = [token for row in targets for token in row]  # type: ignore[union-attr]
            self.check_tokens(targets, vocab=self.vocab_out, where=f"data[{index}].target_tokens")  # type: ignore[arg-type]
        return data


# Losses that read (N, K) target_tokens (with (N, K) weights): K targets scored at each position,
# as distillation from a teacher's top-k does. Every other loss reads one token per position.
LOSSES_OF_SEVERAL_TARGETS = frozenset({"cross_entropy"})


@dataclass(frozen=True)
class ScoreRequest:
    """Data checked against the model's limits, with the loss (if any) and its resolved config."""

    data: list[Datum]
    loss: Loss | None
    config: dict[str, float]

    @classmethod
    def of(
        cls, limits: ModelLimits, data: Sequence[Datum], loss_fn: str | None, loss_fn_config: dict[str, float] | None
    ) -> ScoreRequest:
        loss = get_loss(loss_fn) if loss_fn is not None else None
        config = loss.resolve_config(loss_fn_config) if loss else {}
        return cls(data=limits.check_data(data, loss), loss=loss, config=config)

    @property
    def needs_reference(self) -> bool:
        """Whether the loss compares with a reference model whose logprobs some datum lacks: the
        pass computes them first (`ResidentBase._reference`)."""
        return (
            self.loss is not None
            and self.loss.needs_reference
            and not all("ref_logprobs" in datum.loss_fn_inputs for datum in self.data)
        )

    def outputs(
        self, logprobs: list[torch.Tensor], inputs: list[dict[str, torch.Tensor]]
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """The loss of these data's `logprobs` (None without a loss) and the metrics a pass reports
        for them: tokens, the loss's value and its own metrics, and an RL step's signal."""
        metrics = {"tokens:sum": float(sum(datum.length for datum in self.data))}
        if self.loss is None:
            return None, metrics
        value, extra = self.loss.fn(logprobs, inputs, self.config)
        return value, metrics | {"loss:sum": float(value.detach()), **extra, **policy_metrics(logprobs, inputs)}


def input_tensors(datum: Datum, device: torch.device) -> dict[str, torch.Tensor]:
    """A datum's loss inputs as tensors: token ids as int64, everything else as float32."""
    return {
        key: torch.tensor(
            values, dtype=torch.long if LOSS_INPUT_KINDS[key] == "tokens" else torch.float32, device=device
        )
        for key, values in datum.loss_fn_inputs.items()
    }


# Given each part's span of batch rows (one datum per row, parts in order), the context the
# forward and backward run in: which adapter each span runs through, and train-mode switches
# such as LoRA dropout. It yields None, or the pass's `mixed_adapters.MixedPass` (whose `scope(i)`
# the output head's chunks of span i run in).
RunningFn = Callable[[list[tuple[int, int]]], AbstractContextManager[Any]]


def loss_inputs(
    data: Sequence[Datum], refs: Sequence[torch.Tensor] | None, device: torch.device
) -> list[dict[str, torch.Tensor]]:
    """The data's loss inputs as tensors, with the reference logprobs computed for them (`refs`,
    None where the loss needs none) where a datum sent none."""
    inputs = [input_tensors(datum, device) for datum in data]
    if refs is not None:
        for x, ref_T in zip(inputs, refs, strict=True):
            x.setdefault("ref_logprobs", ref_T.float())
    return inputs


def score(
    model: nn.Module,
    data: list[Datum],
    loss: Loss | None,
    config: Mapping[str, float],
    *,
    backward: bool,
    reference: ReferenceFn,
    train_mode: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> ForwardOutput:
    """Per-datum logprobs of the targets, plus `loss` (and its gradient with `backward`).

    One batched forward. With `backward`, the loss's gradient is added to `.grad` of whatever
    requires grad (the caller's active adapter only). `reference(data)` gives reference logprobs
    for losses that need them and were not sent; `train_mode` wraps the forward (LoRA dropout).
    """
    part = ScoreRequest(data, loss, dict(config))
    return score_parts(model, [part], backward=backward, reference=reference, running=lambda _: train_mode())[0]


def spans_of(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive [start, stop) ranges of the given sizes, from 0."""
    spans, start = [], 0
    for size in sizes:
        spans.append((start, start + size))
        start += size
    return spans


def score_parts(
    model: nn.Module,
    parts: Sequence[ScoreRequest],
    *,
    backward: bool,
    reference: ReferenceFn,
    running: RunningFn,
    share_prefixes: bool = True,
) -> list[ForwardOutput]:
    """`score` for several checked requests (parts) in ONE batched forward, and one backward of
    the sum of their losses.

    The parts' data are rows of one batch, each part a contiguous span of rows; `running(spans)` is the
    context of the pass (e.g. `mixed_adapters`, one adapter per span). Each part's loss is a
    function of its own logprobs only, so the gradient of the sum is, part by part, the gradient
    of its own loss. References are computed first, outside `running`. `share_prefixes`: whether
    data that begin alike may run their prefixes once (`shared_prefixes`).
    """
    device = model.get_input_embeddings().weight.device
    inputs = [loss_inputs(part.data, reference(part.data) if part.needs_reference else None, device) for part in parts]
    outputs = []
    with torch.set_grad_enabled(backward), running(spans_of([len(part.data) for part in parts])) as mixed:
        logprobs = parts_logprobs(model, [part.data for part in parts], mixed, share_prefixes)
        values = []
        for part, part_logprobs, part_inputs in zip(parts, logprobs, inputs, strict=True):
            value, metrics = part.outputs(part_logprobs, part_inputs)
            if value is not None:
                values.append(value)
            outputs.append((part_logprobs, metrics))
        if backward and values:
            torch.stack(values).sum().backward()
    return [
        ForwardOutput(logprobs=[lp.detach().float().cpu().tolist() for lp in part_logprobs], metrics=metrics)
        for part_logprobs, metrics in outputs
    ]


def parts_logprobs(
    model: nn.Module, parts: Sequence[Sequence[Datum]], mixed: Any, share_prefixes: bool
) -> list[list[torch.Tensor]]:
    """One forward over the parts' data, rows of one batch in order (inside the pass's `running`
    context, whose `mixed` pass it is, or None); each part's per-datum logprobs."""
    device = model.get_input_embeddings().weight.device
    sizes = [len(part) for part in parts]
    batch = pack([datum for part in parts for datum in part], device, sizes, share_prefixes)
    token_spans = spans_of([sum(datum.length for datum in part) for part in parts])
    logprobs = packed_logprobs(model, batch, token_spans, mixed)
    return [logprobs[start:stop] for start, stop in spans_of(sizes)]

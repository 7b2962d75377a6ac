"""Training data as the recipes feed it: examples to `Datum`s, deterministic batch plans, and
weights normalised so that a batch's loss is a mean over its trained tokens.

The plan of batches is a pure function of (dataset size, batch size, seed, step), so a job
resumed at step k trains on exactly the batches it would have seen without the interruption.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from mint.chat.render import Example
from mint.errors import InvalidRequest
from mint.trainer.types import Datum


def to_datum_arrays(tokens: Sequence[int], weights: Sequence[float]) -> tuple[list[int], list[int], list[float]]:
    """Shift for next-token prediction: (model_input, target_tokens, weights), each len(tokens) - 1 long.

    Position t reads `tokens[: t + 1]` and predicts `tokens[t + 1]`, with that target's weight.
    """
    if len(tokens) != len(weights):
        raise InvalidRequest(f"tokens ({len(tokens)}) and weights ({len(weights)}) must have the same length")
    if len(tokens) < 2:
        raise InvalidRequest(f"an example needs at least 2 tokens to predict one, got {len(tokens)}")
    return list(tokens[:-1]), list(tokens[1:]), [float(weight) for weight in weights[1:]]


def example_datum(example: Example) -> Datum:
    """A next-token-prediction datum whose weights are the example's (1 on trained tokens)."""
    model_input, targets, weights = to_datum_arrays(example.tokens, example.weights)
    return Datum(model_input=model_input, loss_fn_inputs={"target_tokens": targets, "weights": weights})


def batch_plan(num_examples: int, *, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """`steps` batches of example indices: epochs of seeded shuffles, cut into batches.

    The last batch of an epoch may be short rather than mixing two epochs, so every epoch
    sees every example exactly once.
    """
    if num_examples < 1:
        raise InvalidRequest("the training set is empty", param="training_file")
    if batch_size < 1 or steps < 1:
        raise InvalidRequest("batch_size and steps must be at least 1", param="batch_size")
    plan: list[list[int]] = []
    epoch = 0
    while len(plan) < steps:
        order = list(range(num_examples))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        plan.extend(order[start : start + batch_size] for start in range(0, num_examples, batch_size))
        epoch += 1
    return plan[:steps]


def mean_over_tokens(data: Sequence[Datum], key: str = "weights") -> list[Datum]:
    """Scale `key` so that it sums to 1 over the batch: Tinker's losses are sums, and a sum
    whose size follows the batch's token count would make the step size follow it too."""
    total = sum(abs(value) for datum in data for value in datum.loss_fn_inputs[key])
    if total == 0:
        return list(data)
    return [
        Datum(
            model_input=datum.model_input,
            loss_fn_inputs={**datum.loss_fn_inputs, key: [value / total for value in datum.loss_fn_inputs[key]]},
        )
        for datum in data
    ]


def learning_rate_at(step: int, *, peak: float, steps: int, warmup_steps: int, schedule: str) -> float:
    """Linear warm-up to `peak`, then constant or linear decay to 10% of the peak at the last step."""
    if warmup_steps and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if schedule == "constant":
        return peak
    if schedule == "linear":
        span = max(steps - warmup_steps - 1, 1)
        done = min(max(step - warmup_steps, 0), span) / span
        return peak * (1.0 - 0.9 * done)
    raise InvalidRequest(f"unknown learning-rate schedule {schedule!r}; use constant or linear", param="lr_schedule")

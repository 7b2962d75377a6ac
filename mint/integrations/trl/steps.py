"""One optimizer step on Mint, as the trainers take it: how many steps a run has, each step's
learning rate (transformers' schedules, computed here) and Tinker `AdamParams` (from TRL's adam
fields), a Datum's loss inputs, and the loss the server reports."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from mint.integrations.trl.configs import arg

if TYPE_CHECKING:
    import tinker


def total_steps(args: Any, batches_per_epoch: int) -> int:
    """`max_steps` when set, else `num_train_epochs` epochs of `batches_per_epoch` steps (at least one)."""
    max_steps = int(arg(args, "max_steps", -1))
    if max_steps > 0:
        return max_steps
    return max(1, math.ceil(float(arg(args, "num_train_epochs", 3.0)) * batches_per_epoch))


def scheduled_learning_rate(args: Any, step: int, total: int) -> float:
    """The learning rate of optimizer step `step` (0-based) as transformers' schedulers give it."""
    peak = float(arg(args, "learning_rate", 1e-6))
    kind = str(getattr(arg(args, "lr_scheduler_type", "linear"), "value", arg(args, "lr_scheduler_type", "linear")))
    warmup = float(arg(args, "warmup_steps", 0) or 0)
    warmup_steps = math.ceil(warmup * total) if 0 < warmup < 1 else int(warmup)
    if step < warmup_steps:
        return peak * step / max(1, warmup_steps)
    if kind in ("constant", "constant_with_warmup"):
        return peak
    progress = (step - warmup_steps) / max(1, total - warmup_steps)
    if kind == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak * max(0.0, 1.0 - progress)


def adam_params(args: Any, learning_rate: float) -> tinker.types.AdamParams:
    """Tinker's Adam settings from TRL's fields, at this step's `learning_rate`."""
    from tinker import types

    return types.AdamParams(
        learning_rate=learning_rate,
        beta1=float(arg(args, "adam_beta1", 0.9)),
        beta2=float(arg(args, "adam_beta2", 0.999)),
        eps=float(arg(args, "adam_epsilon", 1e-8)),
        weight_decay=float(arg(args, "weight_decay", 0.0)),
        grad_clip_norm=float(arg(args, "max_grad_norm", 1.0) or 0.0),
    )


def loss_inputs(arrays: dict[str, list[int] | list[float]]) -> Any:
    """A Datum's loss inputs as lists (the SDK converts them to its TensorData)."""
    return arrays


def loss_of(output: Any) -> float:
    """The loss of a `forward_backward` output (the server's summed `loss:sum` metric)."""
    return float(output.metrics.get("loss:sum", float("nan")))

"""What the three recipes share: the trainer they drive, the per-step report, the callback."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mint.trainer.data import learning_rate_at
from mint.trainer.types import AdamParams, Datum, ForwardOutput


class Trainer(Protocol):
    """The primitives a recipe needs: a LoRA session or a full-parameter trainer."""

    def forward_backward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None = None
    ) -> ForwardOutput: ...

    def optim_step(self, adam: AdamParams | None = None) -> dict[str, float]: ...


class Scorer(Protocol):
    """Log-probabilities (and a loss's value) without a gradient: a session, or the base."""

    def forward(
        self, data: Sequence[Datum], loss_fn: str | None = None, loss_fn_config: dict[str, float] | None = None
    ) -> ForwardOutput: ...


@dataclass(frozen=True)
class StepReport:
    """One optimizer step: its number (1-based), the learning rate, and metrics such as loss."""

    step: int
    learning_rate: float
    metrics: dict[str, float] = field(default_factory=dict)


# Called after every optimizer step; returning False stops the recipe (a cancelled job).
OnStep = Callable[[StepReport], bool | None]


class Schedule(Protocol):
    """The learning-rate fields a recipe config carries."""

    steps: int
    learning_rate: float
    warmup_steps: int
    lr_schedule: str


def scheduled_learning_rate(config: Schedule, step: int) -> float:
    """The learning rate of 0-based `step` under the config's warm-up and schedule."""
    return learning_rate_at(
        step,
        peak=config.learning_rate,
        steps=config.steps,
        warmup_steps=config.warmup_steps,
        schedule=config.lr_schedule,
    )


def keep_going(on_step: OnStep | None, report: StepReport) -> bool:
    return on_step is None or on_step(report) is not False

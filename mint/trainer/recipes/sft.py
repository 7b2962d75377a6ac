"""Supervised fine-tuning: next-token loss on the assistant tokens only, packed batches.

    examples = [render_chat(tokenizer, row["messages"], row.get("tools")) for row in rows]
    reports = run_sft(session, examples, SftConfig(steps=60, batch_size=8, learning_rate=4e-4))

Each step takes `batch_size` examples from a seeded plan, normalises their weights so the
loss is the mean negative log-likelihood per assistant token, runs one packed
`forward_backward("cross_entropy")` (no padding: the examples lie end to end), and one
`optim_step`. LoRA by default; full-parameter training with a `FullParameterTrainer`.
A fine-tuning job runs it from its `SftPlan` through `run_sft_plan`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from mint.chat.render import Example, render_chat
from mint.schemas.plans import SftPlan
from mint.trainer.data import batch_plan, example_datum, mean_over_tokens
from mint.trainer.recipes.common import (
    OnStep,
    RecipeInputs,
    StepReport,
    Trainer,
    keep_going,
    render_rows,
    scheduled_learning_rate,
    trained_token_count,
)
from mint.trainer.types import AdamParams


@dataclass(frozen=True)
class SftConfig:
    steps: int
    batch_size: int = 8
    learning_rate: float = 4e-4
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    weight_decay: float = 0.0
    grad_clip_norm: float = 1.0
    seed: int = 0


def run_sft(
    trainer: Trainer,
    examples: Sequence[Example],
    config: SftConfig,
    *,
    start_step: int = 0,
    on_step: OnStep | None = None,
) -> list[StepReport]:
    """Train from `start_step` (0, or the step of the checkpoint being resumed) to `config.steps`."""
    data = [example_datum(example) for example in examples]
    plan = batch_plan(len(data), batch_size=config.batch_size, steps=config.steps, seed=config.seed)
    reports = []
    for step in range(start_step, config.steps):
        started = time.perf_counter()
        batch = mean_over_tokens([data[index] for index in plan[step]])
        result = trainer.forward_backward(batch, "cross_entropy")
        lr = scheduled_learning_rate(config, step)
        optim = trainer.optim_step(
            AdamParams(learning_rate=lr, weight_decay=config.weight_decay, grad_clip_norm=config.grad_clip_norm)
        )
        seconds = time.perf_counter() - started
        tokens = result.metrics["tokens:sum"]
        trained = trained_token_count(batch)
        report = StepReport(
            step=step + 1,
            learning_rate=lr,
            metrics={
                # loss:sum over normalised weights is the mean NLL per trained token.
                "loss": result.metrics["loss:sum"],
                "tokens": tokens,
                "trained_tokens": float(trained),
                "tokens_per_second": tokens / seconds,
                "grad_norm": optim["grad_norm:mean"],
            },
        )
        reports.append(report)
        if not keep_going(on_step, report):
            break
    return reports


def run_sft_plan(plan: SftPlan, inputs: RecipeInputs) -> list[StepReport]:
    """A job's SFT plan on its chat rows (`messages`, optional `tools`)."""
    tokenizer = inputs.tokenizer
    examples = render_rows(inputs.rows, lambda row: render_chat(tokenizer, row["messages"], row.get("tools")))
    config = SftConfig(steps=plan.steps, batch_size=plan.batch_size, learning_rate=plan.learning_rate, seed=inputs.seed)
    return run_sft(inputs.training, examples, config, start_step=inputs.start_step, on_step=inputs.on_step)

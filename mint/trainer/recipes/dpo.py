"""Direct preference optimisation from `input` / `preferred_output` / `non_preferred_output` rows.

    pairs = [render_preference(tokenizer, row) for row in rows]
    run_dpo(session, pairs, DpoConfig(steps=20, pairs_per_step=4, beta=0.1))

Each step sends `pairs_per_step` (chosen, rejected) pairs as consecutive data to
`forward_backward("dpo")`. The reference log-probs are the same model's with the adapter
disabled (the session computes them), so DPO on LoRA needs no second copy of the base.
`preference_accuracy` measures held-out pairs the same way, without a gradient. A
fine-tuning job runs it from its `DpoPlan` through `run_dpo_plan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mint.chat.render import PreferencePair, render_preference
from mint.schemas.plans import DpoPlan
from mint.trainer.data import batch_plan, example_datum
from mint.trainer.recipes.common import (
    OnStep,
    RecipeInputs,
    Scorer,
    StepReport,
    Trainer,
    keep_going,
    render_rows,
    scheduled_learning_rate,
    trained_token_count,
)
from mint.trainer.types import AdamParams, Datum


@dataclass(frozen=True)
class DpoConfig:
    steps: int
    pairs_per_step: int = 4
    beta: float = 0.1
    learning_rate: float = 1e-4
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    grad_clip_norm: float = 1.0
    seed: int = 0


def pair_data(pairs: Sequence[PreferencePair]) -> list[Datum]:
    """Chosen then rejected for each pair, as the `dpo` loss reads them."""
    return [datum for pair in pairs for datum in (example_datum(pair.chosen), example_datum(pair.rejected))]


def run_dpo(
    trainer: Trainer,
    pairs: Sequence[PreferencePair],
    config: DpoConfig,
    *,
    start_step: int = 0,
    on_step: OnStep | None = None,
) -> list[StepReport]:
    plan = batch_plan(len(pairs), batch_size=config.pairs_per_step, steps=config.steps, seed=config.seed)
    reports = []
    for step in range(start_step, config.steps):
        batch = pair_data([pairs[index] for index in plan[step]])
        result = trainer.forward_backward(batch, "dpo", {"beta": config.beta})
        lr = scheduled_learning_rate(config, step)
        optim = trainer.optim_step(AdamParams(learning_rate=lr, grad_clip_norm=config.grad_clip_norm))
        metrics = {
            "loss": result.metrics["loss:sum"] / len(plan[step]),
            "accuracy": result.metrics["dpo_accuracy:mean"],
            "margin": result.metrics["dpo_margin:mean"],
            "grad_norm": optim["grad_norm:mean"],
            "tokens": float(sum(datum.length for datum in batch)),
            "trained_tokens": float(trained_token_count(batch)),
        }
        report = StepReport(step=step + 1, learning_rate=lr, metrics=metrics)
        reports.append(report)
        if not keep_going(on_step, report):
            break
    return reports


def run_dpo_plan(plan: DpoPlan, inputs: RecipeInputs) -> list[StepReport]:
    """A job's DPO plan on its preference rows."""
    tokenizer = inputs.tokenizer
    pairs = render_rows(inputs.rows, lambda row: render_preference(tokenizer, row))
    config = DpoConfig(
        steps=plan.steps,
        pairs_per_step=plan.batch_size,
        beta=plan.beta,
        learning_rate=plan.learning_rate,
        seed=inputs.seed,
    )
    return run_dpo(inputs.training, pairs, config, start_step=inputs.start_step, on_step=inputs.on_step)


def preference_accuracy(session: Scorer, pairs: Sequence[PreferencePair], *, beta: float = 0.1) -> dict[str, float]:
    """Share of pairs whose chosen answer gains more log-probability over the reference than
    the rejected one (the DPO margin is positive), and the mean margin. No gradient."""
    result = session.forward(pair_data(pairs), "dpo", {"beta": beta})
    return {"accuracy": result.metrics["dpo_accuracy:mean"], "margin": result.metrics["dpo_margin:mean"]}

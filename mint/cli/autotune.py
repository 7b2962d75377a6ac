"""`mint auto ...`: hand Mint a goal and a budget; watch its trials and decisions; cancel."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from mint.cli.options import LimitOpt, Remote, TimeoutOpt, exit_unless_succeeded, first, remote
from mint.cli.output import console, emit, human, warn
from mint.schemas.autotune import MAX_BUDGET_S, MAX_BUDGET_USD, MAX_TRIALS
from mint.schemas.autotune_state import AutotuneBest

app = typer.Typer(help="Auto mode: a goal and a budget in, the best adapter version out.", no_args_is_help=True)

LIST_COLUMNS = ["id", "status", "phase", "model", "benchmark_id", "trials", "best", "cost_usd", "created_at"]
TRIAL_COLUMNS = ["trial", "method", "params", "status", "model", "dev_pass_rate", "cost_usd"]


def row_of(run: Any) -> dict[str, Any]:
    best = AutotuneBest.model_validate(run.best) if run.best else None
    return human(
        {
            "id": run.id,
            "status": run.status,
            "phase": run.phase,
            "model": run.model,
            "benchmark_id": run.benchmark_id,
            "trials": len(run.trials),
            "best": f"{best.model} (dev {best.dev_pass_rate:.3f})" if best is not None else None,
            "cost_usd": run.cost_usd,
            "elapsed_s": f"{run.elapsed_s:.0f}",
            "stop_reason": (run.result or {}).get("stop_reason"),
            "created_at": run.created_at,
        }
    )


def _show_run(api: Remote, run: Any) -> None:
    api.show(run, row_of(run))
    if api.as_json:
        return
    trials = [
        {
            "trial": t.number,
            "method": t.method,
            "params": ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in t.params.items()),
            "status": t.status,
            "model": t.model,
            "dev_pass_rate": None if t.dev_pass_rate is None else f"{t.dev_pass_rate:.3f}",
            "cost_usd": t.cost_usd,
        }
        for t in run.trials
    ]
    if trials:
        emit(trials, TRIAL_COLUMNS, as_json=False, title="trials")
    for decision in run.decisions:
        console.print(f"[bold]{decision.decision}[/bold]: {decision.reason}")
    warn(run.warnings)


@app.command("start")
@remote
def start(
    api: Remote,
    benchmark: Annotated[str, typer.Option("--benchmark", help="The benchmark's id.")],
    model: Annotated[str, typer.Option("--model", help="The base model.")],
    target: Annotated[float, typer.Option("--target", min=0.0, max=1.0, help="Held-out pass rate to reach.")],
    budget_usd: Annotated[
        float | None, typer.Option("--budget-usd", min=0.0, max=MAX_BUDGET_USD, help="Money for trials and evals.")
    ] = None,
    budget_s: Annotated[
        int | None, typer.Option("--budget-s", min=1, max=MAX_BUDGET_S, help="Wall time from the start.")
    ] = None,
    methods: Annotated[
        list[str] | None, typer.Option("--method", help="sft, dpo or rl: a method allowed (repeat); all if omitted.")
    ] = None,
    max_trials: Annotated[int, typer.Option("--max-trials", min=1, max=MAX_TRIALS, help="Trials at most.")] = 6,
    max_rank: Annotated[int, typer.Option("--max-rank", min=1, max=128, help="Largest LoRA rank.")] = 16,
    max_steps: Annotated[int, typer.Option("--max-steps", min=1, max=10_000, help="Most steps per trial.")] = 32,
    also_bases: Annotated[
        list[str] | None,
        typer.Option("--also-base", help="Another base model to consider besides --model (repeat)."),
    ] = None,
    training_types: Annotated[
        list[str] | None,
        typer.Option(
            "--training-type",
            help="lora or full: a training type allowed (repeat); lora if omitted. With both, SFT trials may "
            "train every weight when the budget affords it.",
        ),
    ] = None,
    eval_max_tokens: Annotated[
        int, typer.Option("--eval-max-tokens", min=1, max=8192, help="Largest assistant turn in the evals.")
    ] = 64,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the run has finished.")] = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Start an auto run; with --wait, until it has finished (exit 1 unless it reached its target)."""
    budget = {"usd": budget_usd, "seconds": budget_s}
    constraints: dict[str, Any] = {"max_trials": max_trials, "max_rank": max_rank, "max_steps": max_steps}
    if methods:
        constraints["methods"] = methods
    if also_bases:
        constraints["bases"] = also_bases
    if training_types:
        constraints["training_types"] = training_types
    with api.client() as client:
        run = client.autotune.create(
            benchmark,
            model,
            target={"pass_rate": target},
            budget=budget,
            constraints=constraints,
            eval_max_tokens=eval_max_tokens,
        )
        if wait:
            run = client.autotune.wait(run.id, timeout_s=timeout)
    _show_run(api, run)
    if wait:
        exit_unless_succeeded(run.status, f"auto run {run.id}")


@app.command("get")
@remote
def get(api: Remote, run_id: str) -> None:
    """An auto run: status, best version, cost so far, trials and every decision with its reason."""
    with api.client() as client:
        run = client.autotune.get(run_id)
    _show_run(api, run)


@app.command("list")
@remote
def list_runs(api: Remote, limit: LimitOpt = 20) -> None:
    """Auto runs of the organization, newest first."""
    with api.client() as client:
        rows = first(client.autotune.list, limit)
    api.table(rows, LIST_COLUMNS, title="auto runs", row=row_of)


@app.command("cancel")
@remote
def cancel(api: Remote, run_id: str) -> None:
    """Stop an auto run; its running trial's job is cancelled."""
    with api.client() as client:
        run = client.autotune.cancel(run_id)
    api.show(run, row_of(run))

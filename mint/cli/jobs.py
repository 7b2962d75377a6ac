"""`mint jobs ...`: fine-tuning jobs (SFT, DPO, RL, online RL), their progress and their logs."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from mint.cli.options import (
    LimitOpt,
    Remote,
    TimeoutOpt,
    WaitOpt,
    dataset_id,
    exit_unless_succeeded,
    finite,
    first,
    grader_option,
    remote,
)
from mint.cli.output import console, human, wire
from mint.schemas.fine_tuning import MethodType, TrainingType
from mint.schemas.plans import MAX_BATCH_SIZE, MAX_EPOCHS, MAX_STEPS
from mint.sdk.errors import BadRequestError
from mint.sdk.jobs import ServeMode, online_rl_method

app = typer.Typer(help="Fine-tuning jobs: SFT, DPO, RL, online RL.", no_args_is_help=True)

LIST_COLUMNS = ["id", "status", "model", "method", "steps", "fine_tuned_model", "created_at"]


def row_of(job: Any) -> dict[str, Any]:
    """A job with its progress and the adapter version it made, for people."""
    return human(
        {
            "id": job.id,
            "status": job.status,
            "model": job.model,
            "method": job.method.get("type"),
            "training_type": job.training_type,
            "steps": f"{job.completed_steps}/{job.total_steps}",
            "fine_tuned_model": job.fine_tuned_model,
            "from_adapter": job.from_adapter,
            "stages": _stages_line(job),
            "training_file": job.training_file,
            "cost_usd": job.cost_usd,
            "estimated_usd": job.estimate["cost_usd"] if job.estimate else None,
            "elapsed": duration(job.elapsed_s) if job.elapsed_s is not None else None,
            "eta": eta_words(job),
            "error": job.error.message if job.error else None,
            "created_at": wire(job)["created_at"],
        }
    )


def duration(seconds: float, *, coarse: bool = False) -> str:
    """Seconds in words: `45s`, `4m 10s`, `2h 5m`, `3d 4h`; `coarse`, a time that is only
    expected, to the minute once it is a minute or more: `4m`."""
    whole = max(int(round(seconds)), 0)
    if coarse and whole >= 60:
        whole = (whole + 30) // 60 * 60
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m" if coarse else f"{minutes}m {secs}s"
    return f"{secs}s"


def eta_words(job: Any) -> str | None:
    """A running job's time left in words: `about 12m left (measured)`, `about 20s left (estimated)`,
    or `over its estimate` once it ran past a guess with no step measured yet."""
    if job.status != "running":
        return None
    if job.eta_s is None:
        return "over its estimate, no step measured yet" if job.elapsed_s is not None else None
    source = "measured" if (job.eta_basis or "").startswith("measured") else "estimated"
    return f"about {duration(job.eta_s, coarse=True)} left ({source})"


def _stages_line(job: Any) -> str | None:
    """`sft succeeded (bot@1), rl running 3/8`: a chained job's stages on one line."""
    if not job.stages:
        return None
    parts = []
    for stage in job.stages:
        done = (
            f"({stage.fine_tuned_model})" if stage.fine_tuned_model else f"{stage.completed_steps}/{stage.total_steps}"
        )
        parts.append(f"{stage.method.get('type')} {stage.status} {done}")
    return ", ".join(parts)


def stages_file(path: Path | None) -> list[dict[str, Any]] | None:
    """The stages of `--stages FILE`: a JSON list of stage objects (exit 6 unless it is one)."""
    if path is None:
        return None
    try:
        stages = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BadRequestError(f"--stages {path}: not a readable JSON file: {exc}", param="stages") from exc
    if not isinstance(stages, list) or not all(isinstance(stage, dict) for stage in stages):
        raise BadRequestError(
            f'--stages {path}: expected a JSON list of stages, e.g. [{{"method": {{"type": "supervised"}}}}]',
            param="stages",
        )
    return stages


@app.command("create")
@remote
def create(
    api: Remote,
    model: Annotated[str, typer.Option("--model", help="The base model, e.g. tiny-glm-moe.")],
    file: Annotated[
        str | None, typer.Option("--file", help="The training dataset's id (optional if every stage names one).")
    ] = None,
    method: Annotated[
        MethodType | None, typer.Option("--method", help="The training method (default: supervised).")
    ] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, max=MAX_STEPS, help="Optimizer steps (instead of epochs).")
    ] = None,
    suffix: Annotated[
        str | None, typer.Option("--suffix", help="The adapter's name; each job adds a version to it.")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0, max=2**31 - 1)] = None,
    learning_rate: Annotated[
        float | None, typer.Option("--learning-rate", min=0.0, max=1.0, callback=finite, help="Absolute learning rate.")
    ] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", min=1, max=MAX_BATCH_SIZE)] = None,
    epochs: Annotated[int | None, typer.Option("--epochs", min=1, max=MAX_EPOCHS)] = None,
    rank: Annotated[int | None, typer.Option("--rank", min=1, max=1024, help="LoRA rank (the base's default).")] = None,
    training_type: Annotated[
        TrainingType | None,
        typer.Option(
            "--training-type",
            help="lora (default), or full: every weight of a copy of the base trains (supervised only; billed "
            "by device time); its version is a whole model, evaluated and downloaded but not deployed.",
        ),
    ] = None,
    grader: Annotated[
        str | None, typer.Option("--grader", help="For reinforcement: a grader name or JSON {type, config}.")
    ] = None,
    from_adapter: Annotated[
        str | None,
        typer.Option("--from-adapter", help="Warm start: continue training this adapter version, e.g. bot@3."),
    ] = None,
    stages: Annotated[
        Path | None,
        typer.Option(
            "--stages",
            help="A JSON file listing the job's stages, run in order (instead of --method), e.g. "
            '[{"method": {"type": "supervised"}, "training_file": "ds_1"}, {"method": {"type": "reinforcement", '
            '"reinforcement": {"grader": {"type": "exact"}}}, "training_file": "ds_2"}].',
        ),
    ] = None,
    budget_usd: Annotated[
        float | None,
        typer.Option("--budget-usd", min=0.0, callback=finite, help="The most the job may cost (USD)."),
    ] = None,
    deployment: Annotated[
        str | None,
        typer.Option(
            "--deployment",
            help="For online_rl: the deployment (name or id) whose live, rewarded episodes it trains from; "
            "its capture must record tokens.",
        ),
    ] = None,
    serve: Annotated[
        ServeMode | None,
        typer.Option(
            "--serve",
            help="For online_rl: immediate (default): the deployment serves each published version at once; "
            "register: versions wait for a promotion.",
        ),
    ] = None,
    publish_every: Annotated[
        int | None,
        typer.Option("--publish-every", min=1, max=MAX_STEPS, help="For online_rl: steps between published versions."),
    ] = None,
    estimate: Annotated[
        bool, typer.Option("--estimate", help="Print what the job would use and cost, and start nothing.")
    ] = False,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Start a fine-tuning job (or a chain of stages, or with --method online_rl --deployment NAME
    --steps N an online RL job on a deployment's rewarded episodes); with --wait, until it has
    finished (exit 1 unless it succeeded). With --estimate, only price it."""
    file = dataset_id(file, "--file")
    hyperparameters = {
        name: value for name, value in (("batch_size", batch_size), ("n_epochs", epochs)) if value is not None
    }
    chosen: MethodType | dict[str, Any] | None = method
    if method == "online_rl" or deployment is not None or serve is not None or publish_every is not None:
        chosen = online_method(method, deployment, serve, publish_every, hyperparameters, grader)
    fields: dict[str, Any] = {
        "method": chosen,
        "hyperparameters": hyperparameters or None,
        "grader": grader_option(grader),
        "steps": steps,
        "suffix": suffix,
        "seed": seed,
        "learning_rate": learning_rate,
        "lora": {"rank": rank} if rank else None,
        "training_type": training_type,
        "from_adapter": from_adapter,
        "stages": stages_file(stages),
        "budget_usd": budget_usd,
    }
    with api.client() as client:
        if estimate:
            priced = client.jobs.estimate(model, file, **fields)
            api.show(priced, estimate_row(priced))
            return
        job = client.jobs.create(model, file, **fields)
        if wait:
            job = job.wait(timeout_s=timeout)
    api.show(job, row_of(job))
    if wait:
        exit_unless_succeeded(job.status, f"job {job.id}")


def online_method(
    method: MethodType | None,
    deployment: str | None,
    serve: ServeMode | None,
    publish_every: int | None,
    hyperparameters: dict[str, Any],
    grader: str | None,
) -> dict[str, Any]:
    """The `online_rl` method object from `--method online_rl --deployment NAME [--serve]
    [--publish-every] [--batch-size]` (exit 6 when the flags do not make one)."""
    if method not in (None, "online_rl"):
        raise BadRequestError(
            f"--deployment, --serve and --publish-every are for --method online_rl, not {method}", param="method"
        )
    if deployment is None:
        raise BadRequestError(
            "--method online_rl trains from a deployment's live episodes: give --deployment NAME", param="deployment"
        )
    if grader is not None:
        raise BadRequestError(
            "--grader is for --method reinforcement; an online RL job's rewards are its episodes' "
            "(`mint episodes reward`)",
            param="grader",
        )
    if publish_every is not None:
        hyperparameters = {**hyperparameters, "publish_every": publish_every}
    return online_rl_method(deployment, serve=serve, hyperparameters=hyperparameters or None)


RANGE_FIELDS = {"seconds_low", "seconds_high", "cost_usd_low", "cost_usd_high", "basis"}


def estimate_row(priced: Any) -> dict[str, Any]:
    """A job's estimate as lines for people: the figures, with the time in words and its range
    after `seconds`, the cost's range after `cost_usd` and what they rest on (`basis`), then the
    base's prices one a line (`trained_usd_per_million`, ..., `gpu_hour_usd`)."""
    row: dict[str, Any] = {}
    for key, value in human(priced.model_dump(exclude={"object", "prices", *RANGE_FIELDS})).items():
        row[key] = value
        if key == "seconds":
            row["time"] = time_range(value, priced.seconds_low, priced.seconds_high)
        elif key == "cost_usd" and priced.cost_usd_low is not None:
            row["cost_usd_low"], row["cost_usd_high"] = priced.cost_usd_low, priced.cost_usd_high
        elif key == "calibrated_on" and priced.basis:
            row["basis"] = priced.basis
    for name, usd in priced.prices.items():
        row[f"{name}_usd" if name == "gpu_hour" else f"{name}_usd_per_million"] = usd
    return row


def time_range(seconds: float, low: float | None, high: float | None) -> str:
    """`about 20s (10s to 6m 40s)`: an estimate's time and its range in words."""
    words = f"about {duration(seconds, coarse=True)}"
    if low is None or high is None:
        return words
    return f"{words} ({duration(low, coarse=True)} to {duration(high, coarse=True)})"


@app.command("list")
@remote
def list_jobs(api: Remote, limit: LimitOpt = 20) -> None:
    """Jobs of the organization, newest first."""
    with api.client() as client:
        rows = first(client.jobs.list, limit)
    api.table(rows, LIST_COLUMNS, title="fine-tuning jobs", row=row_of)


@app.command("get")
@remote
def get(api: Remote, job_id: str) -> None:
    """A job: status, progress, and the adapter version it made."""
    with api.client() as client:
        job = client.jobs.get(job_id)
    api.show(job, row_of(job))


@app.command("events")
@app.command("logs")
@remote(json_help="One JSON object per event and line.")
def logs(
    api: Remote,
    job_id: str,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until the job ends.")
    ] = False,
) -> None:
    """The job's events, oldest first: messages, metrics of every step, and an RL step's samples as graded."""
    with api.client() as client:
        if follow:
            events: Iterable[Any] = client.jobs.follow(job_id)
        else:
            events = reversed(list(client.jobs.events(job_id, limit=100)))
        for event in events:
            if api.as_json:
                print(json.dumps(wire(event)), flush=True)
            else:
                moment = datetime.fromtimestamp(wire(event)["created_at"], UTC).strftime("%H:%M:%S")
                style = {"warning": "yellow", "error": "red"}.get(event.level, "")
                line = f"{moment} {event.level:<7} {event.message}"
                console.print(f"[{style}]{line}[/{style}]" if style else line, markup=bool(style), highlight=False)
                for sample in (event.data or {}).get("samples", []):
                    console.print(sample_line(sample), markup=False, highlight=False)


def sample_line(sample: dict[str, Any]) -> str:
    """One graded sample of an RL step, indented under its step: reward, the text as graded, the reference."""
    line = f"         reward {sample['reward']:.3g}  {sample['text']!r}"
    if "reference" in sample:
        line += f"  reference {sample['reference']!r}"
    if sample.get("detail"):
        line += f"  ({sample['detail']})"
    return line


@app.command("cancel")
@remote
def cancel(api: Remote, job_id: str) -> None:
    """Cancel a queued job at once, or a running one after its current step (exit 5 if it has finished)."""
    with api.client() as client:
        job = client.jobs.cancel(job_id)
    api.show(job, row_of(job))

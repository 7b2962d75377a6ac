"""User commands of `mint`: the post-training loop from a terminal or a script, over HTTP.

Each command parses its options, makes one or two SDK calls and prints the answer: a table
or a few lines for people, the server's JSON with `--json` for scripts. Waiting work (`jobs
create --wait`, `evals run --wait`) draws a progress bar on stderr, so stdout stays clean.
Errors leave through `mint.cli.main`, whose exit codes scripts can trust: 3 not found, 4
authentication or permission, 5 conflict, 6 invalid request, 7 unavailable; a job or eval
run waited for that does not succeed exits 1.

The connection comes from `--base-url` / `--api-key`, else `MINT_BASE_URL` / `MINT_API_KEY`,
else the admin key that `mint up` writes to `$MINT_HOME/admin.key`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.table import Table

from mint.cli.output import console, emit, emit_one
from mint.cli.output import errors as stderr
from mint.schemas.datasets import DatasetKind
from mint.schemas.evals import BuiltinName, BuiltinSplit, MinedKind
from mint.schemas.fine_tuning import MethodType
from mint.sdk import Mint
from mint.sdk.errors import BadRequestError

BaseUrlOpt = Annotated[
    str | None,
    typer.Option("--base-url", envvar="MINT_BASE_URL", help="The API's URL.", show_default="http://127.0.0.1:8000"),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key", envvar="MINT_API_KEY", help="An API key (default: $MINT_HOME/admin.key).", show_default=False
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
LimitOpt = Annotated[int, typer.Option("--limit", min=1, help="Most rows to show.")]
WaitOpt = Annotated[bool, typer.Option("--wait", help="Wait until it has finished, with a progress bar.")]

datasets = typer.Typer(help="Datasets: JSONL uploads for fine-tuning.", no_args_is_help=True)
benchmarks = typer.Typer(help="Benchmarks: tasks and graders, in immutable versions.", no_args_is_help=True)
evals = typer.Typer(help="Eval runs: evaluate, compare, mine failures.", no_args_is_help=True)
jobs = typer.Typer(help="Fine-tuning jobs: SFT, DPO, RL.", no_args_is_help=True)
adapters = typer.Typer(help="Adapters and their versions.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the user commands to the `mint` app."""
    app.add_typer(datasets, name="datasets")
    app.add_typer(benchmarks, name="benchmarks")
    app.add_typer(evals, name="evals")
    app.add_typer(jobs, name="jobs")
    app.add_typer(adapters, name="adapters")
    app.command("deploy")(deploy)
    app.command("promote")(promote)
    app.command("rollback")(rollback)
    app.command("chat")(chat)


# ---- printing ----------------------------------------------------------------------------------


def _client(base_url: str | None, api_key: str | None) -> Mint:
    return Mint(base_url=base_url, api_key=api_key)


def _wire(item: BaseModel) -> dict[str, Any]:
    """The object as the API sent it (times as the schema writes them)."""
    return item.model_dump(mode="json")


def _human(row: dict[str, Any]) -> dict[str, Any]:
    """Unix times (OpenAI-shaped objects) as dates, for people."""
    return {
        key: datetime.fromtimestamp(value, UTC) if key.endswith("_at") and isinstance(value, int) else value
        for key, value in row.items()
    }


def _pick(item: BaseModel, fields: Iterable[str]) -> dict[str, Any]:
    row = item.model_dump()
    return _human({field: row.get(field) for field in fields})


def _show(item: BaseModel, fields: Iterable[str], *, as_json: bool) -> None:
    if as_json:
        emit_one(_wire(item), as_json=True)
    else:
        emit_one(_pick(item, fields), as_json=False)


# Columns people copy into the next command: printed whole, never cut to fit the terminal.
WHOLE_COLUMNS = frozenset({"id", "name", "model", "fine_tuned_model", "newest"})


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _print_rows(rows: list[dict[str, Any]], columns: list[str], *, title: str) -> None:
    """A table for people; ids and model references stay whole, other columns shrink first."""
    table = Table(title=title)
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    for index, column in enumerate(columns):
        if column in WHOLE_COLUMNS:
            width = max([len(column), *(len(line[index]) for line in cells)])
            table.add_column(column, no_wrap=True, min_width=width)
        else:
            table.add_column(column)
    for line in cells:
        table.add_row(*line)
    console.print(table)


def _table(items: Iterable[BaseModel], columns: list[str], *, as_json: bool, title: str) -> None:
    if as_json:
        emit([_wire(item) for item in items], columns, as_json=True)
    else:
        _print_rows([_pick(item, columns) for item in items], columns, title=title)


def _grader(value: str | None) -> str | dict[str, Any] | None:
    """A grader by name (`numeric`) or as JSON (`{"type": "regex", "config": {...}}`)."""
    if value is None or not value.lstrip().startswith("{"):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise BadRequestError(f"--grader is not valid JSON: {exc}", param="grader") from exc
    if not isinstance(parsed, dict):
        raise BadRequestError("--grader JSON must be an object", param="grader")
    return parsed


def _json_object(value: str | None, option: str) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise BadRequestError(f"{option} is not valid JSON: {exc}", param=option.lstrip("-")) from exc
    if not isinstance(parsed, dict):
        raise BadRequestError(f"{option} must be a JSON object", param=option.lstrip("-"))
    return parsed


def _finish(status: str, what: str) -> None:
    """Exit 1 when waited-for work did not succeed, so that `&&` chains stop there."""
    if status != "succeeded":
        stderr.print(f"[red]{what} {status}[/red]")
        raise typer.Exit(1)


# ---- datasets ----------------------------------------------------------------------------------

DATASET_FIELDS = ["id", "filename", "kind", "row_count", "size_bytes", "sha256", "created_at"]


@datasets.command("upload")
def datasets_upload(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="A JSONL file.")],
    kind: Annotated[
        DatasetKind | None, typer.Option("--kind", help="The rows' kind (default: read from the first row).")
    ] = None,
    as_json: JsonOpt = False,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Upload a JSONL dataset; every row is validated, and a bad row refuses the file (exit 6)."""
    with _client(base_url, api_key) as client:
        dataset = client.datasets.upload(path, kind=kind)
    _show(dataset, DATASET_FIELDS, as_json=as_json)


@datasets.command("list")
def datasets_list(
    limit: LimitOpt = 20, as_json: JsonOpt = False, base_url: BaseUrlOpt = None, api_key: ApiKeyOpt = None
) -> None:
    """Datasets of the organization, newest first."""
    with _client(base_url, api_key) as client:
        rows = list(islice(client.datasets.list(limit=min(limit, 100)), limit))
    _table(rows, DATASET_FIELDS, as_json=as_json, title="datasets")


# ---- benchmarks --------------------------------------------------------------------------------


def _benchmark_row(benchmark: Any) -> dict[str, Any]:
    latest = benchmark.latest_version
    return {
        "id": benchmark.id,
        "name": benchmark.name,
        "version": latest.version if latest else None,
        "tasks": latest.task_count if latest else None,
        "splits": ", ".join(f"{k}: {v}" for k, v in latest.splits.items()) if latest else None,
        "created_at": benchmark.created_at,
    }


@benchmarks.command("create")
def benchmarks_create(
    name: Annotated[str, typer.Argument(help="Unique in the organization.")],
    file: Annotated[
        Path | None, typer.Option("--file", exists=True, dir_okay=False, help="Tasks as .jsonl or .yaml.")
    ] = None,
    builtin: Annotated[BuiltinName | None, typer.Option("--builtin", help="A built-in benchmark to import.")] = None,
    grader: Annotated[
        str | None, typer.Option("--grader", help='Grader of the tasks: a name (numeric) or JSON {"type", "config"}.')
    ] = None,
    split: Annotated[BuiltinSplit | None, typer.Option("--split", help="With --builtin: only this split.")] = None,
    n: Annotated[int | None, typer.Option("--n", min=1, help="With --builtin: tasks per split.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0, help="With --builtin: which tasks are drawn.")] = None,
    description: Annotated[str, typer.Option("--description")] = "",
    as_json: JsonOpt = False,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Create a benchmark (its version 1) from a file of tasks and/or a built-in benchmark."""
    if file is None and builtin is None:
        raise BadRequestError("give the tasks with --file PATH or --builtin NAME", param="file")
    with _client(base_url, api_key) as client:
        benchmark = client.benchmarks.create(
            name,
            path=file,
            grader=_grader(grader),
            builtin=builtin,
            split=split,
            n=n,
            seed=seed,
            description=description,
        )
    if as_json:
        emit_one(_wire(benchmark), as_json=True)
    else:
        emit_one(_human(_benchmark_row(benchmark)), as_json=False)


@benchmarks.command("list")
def benchmarks_list(
    limit: LimitOpt = 20, as_json: JsonOpt = False, base_url: BaseUrlOpt = None, api_key: ApiKeyOpt = None
) -> None:
    """Benchmarks of the organization, newest first, with their newest version."""
    with _client(base_url, api_key) as client:
        rows = list(islice(client.benchmarks.list(limit=min(limit, 100)), limit))
    if as_json:
        emit([_wire(row) for row in rows], [], as_json=True)
    else:
        columns = ["id", "name", "version", "tasks", "splits", "created_at"]
        _print_rows([_human(_benchmark_row(row)) for row in rows], columns, title="benchmarks")


# ---- evals -------------------------------------------------------------------------------------


def _run_row(run: Any) -> dict[str, Any]:
    metrics = run.metrics or {}
    return {
        "id": run.id,
        "status": run.status,
        "model": run.model,
        "benchmark_id": run.benchmark_id,
        "version": run.version,
        "split": run.split,
        "accuracy": f"{metrics['accuracy']:.3f}" if "accuracy" in metrics else None,
        "passed": f"{metrics.get('passed')}/{metrics.get('tasks')}" if "tasks" in metrics else None,
        "error": (run.error or {}).get("message"),
        "created_at": run.created_at,
    }


@evals.command("run")
def evals_run(
    benchmark: Annotated[str, typer.Option("--benchmark", help="The benchmark's id.")],
    model: Annotated[str, typer.Option("--model", help="A base, adapter@version or deployment.")],
    version: Annotated[int | None, typer.Option("--version", min=1, help="Benchmark version (newest).")] = None,
    split: Annotated[str | None, typer.Option("--split", help="Only this split's tasks.")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1, help="Longest assistant turn.")] = None,
    wait: WaitOpt = False,
    as_json: JsonOpt = False,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Evaluate a model on a benchmark version; with --wait, until it has finished (exit 1 unless it succeeded)."""
    with _client(base_url, api_key) as client:
        run = client.evals.create(benchmark, model, version=version, split=split, max_tokens=max_tokens)
        if wait:
            run = run.wait()
    if as_json:
        emit_one(_wire(run), as_json=True)
    else:
        emit_one(_human(_run_row(run)), as_json=False)
    if wait:
        _finish(run.status, f"eval run {run.id}")


@evals.command("get")
def evals_get(run_id: str, as_json: JsonOpt = False, base_url: BaseUrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """An eval run: status and metrics."""
    with _client(base_url, api_key) as client:
        run = client.evals.get(run_id)
    if as_json:
        emit_one(_wire(run), as_json=True)
    else:
        emit_one(_human(_run_row(run)), as_json=False)


@evals.command("compare")
def evals_compare(
    a: Annotated[str, typer.Argument(help="The baseline run.")],
    b: Annotated[str, typer.Argument(help="The run compared with it.")],
    as_json: JsonOpt = False,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """B against A, task by task: fixed and broken tasks, and the accuracy delta with its interval."""
    with _client(base_url, api_key) as client:
        comparison = client.evals.compare(a, b)
    if as_json:
        emit_one(_wire(comparison), as_json=True)
        return
    rows = [
        {
            "metric": name,
            "A": f"{getattr(comparison.a, name):.4g}",
            "B": f"{getattr(comparison.b, name):.4g}",
            "B - A": f"{getattr(comparison.b, name) - getattr(comparison.a, name):+.4g}",
        }
        for name in ("accuracy", "mean_score", "mean_steps", "mean_tokens_out", "mean_latency_ms")
    ]
    _print_rows(rows, ["metric", "A", "B", "B - A"], title=f"{b} against {a} ({comparison.tasks} tasks)")
    interval = comparison.interval
    console.print(
        f"accuracy delta {comparison.accuracy_delta:+.3f}, {interval.confidence:.0%} interval "
        f"[{interval.low:+.3f}, {interval.high:+.3f}]: "
        + ("significant" if comparison.significant else "not significant")
    )
    for label, tasks in (
        ("fixed", comparison.fixed),
        ("broken", comparison.broken),
        ("still passing", comparison.still_passing),
        ("still failing", comparison.still_failing),
    ):
        shown = ", ".join(tasks[:10]) + (", ..." if len(tasks) > 10 else "")
        console.print(f"{label}: {len(tasks)}" + (f" ({shown})" if tasks else ""))


@evals.command("failures")
def evals_failures(
    run_id: Annotated[str, typer.Argument(help="A finished eval run.")],
    kind: Annotated[
        MinedKind, typer.Option("--kind", help="chat: SFT rows; preference: DPO pairs; prompts: RL prompts.")
    ] = "chat",
    as_json: JsonOpt = False,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Mine a run's failed tasks into a dataset to train on."""
    with _client(base_url, api_key) as client:
        dataset = client.evals.from_failures(run_id, kind=kind)
    if as_json:
        emit_one(_wire(dataset), as_json=True)
        return
    emit_one(_pick(dataset, ["id", "kind", "row_count", "failed_tasks", "source_eval_run_id"]), as_json=False)
    for skipped in dataset.skipped:
        stderr.print(f"skipped {skipped.task_id}: {skipped.reason}")


# ---- jobs --------------------------------------------------------------------------------------


def _job_row(job: Any) -> dict[str, Any]:
    return _human(
        {
            "id": job.id,
            "status": job.status,
            "model": job.model,
            "method": job.method.get("type"),
            "steps": f"{job.completed_steps}/{job.total_steps}",
            "fine_tuned_model": job.fine_tuned_model,
            "training_file": job.training_file,
            "error": job.error.message if job.error else None,
            "created_at": _wire(job)["created_at"],
        }
    )


@jobs.command("create")
def jobs_create(
    model: Annotated[str, typer.Option("--model", help="The base model, e.g. tiny-glm-moe.")],
    file: Annotated[str, typer.Option("--file", help="The training dataset's id.")],
    method: Annotated[MethodType, typer.Option("--method", help="The training method.")] = "supervised",
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Optimizer steps (instead of epochs).")] = None,
    suffix: Annotated[
        str | None, typer.Option("--suffix", help="The adapter's name; each job adds a version to it.")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0)] = None,
    learning_rate: Annotated[float | None, typer.Option("--learning-rate", help="Absolute learning rate.")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", min=1)] = None,
    epochs: Annotated[int | None, typer.Option("--epochs", min=1)] = None,
    rank: Annotated[int | None, typer.Option("--rank", min=1, help="LoRA rank (the base's default).")] = None,
    grader: Annotated[
        str | None, typer.Option("--grader", help="For reinforcement: a grader name or JSON {type, config}.")
    ] = None,
    wait: WaitOpt = False,
    as_json: JsonOpt = False,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Start a fine-tuning job; with --wait, until it has finished (exit 1 unless it succeeded)."""
    hyperparameters = {
        name: value for name, value in (("batch_size", batch_size), ("n_epochs", epochs)) if value is not None
    }
    with _client(base_url, api_key) as client:
        job = client.jobs.create(
            model,
            file,
            method=method,
            hyperparameters=hyperparameters or None,
            grader=_grader(grader),
            steps=steps,
            suffix=suffix,
            seed=seed,
            learning_rate=learning_rate,
            lora={"rank": rank} if rank else None,
        )
        if wait:
            job = job.wait()
    if as_json:
        emit_one(_wire(job), as_json=True)
    else:
        emit_one(_job_row(job), as_json=False)
    if wait:
        _finish(job.status, f"job {job.id}")


@jobs.command("list")
def jobs_list(
    limit: LimitOpt = 20, as_json: JsonOpt = False, base_url: BaseUrlOpt = None, api_key: ApiKeyOpt = None
) -> None:
    """Jobs of the organization, newest first."""
    with _client(base_url, api_key) as client:
        rows = list(islice(client.jobs.list(limit=min(limit, 100)), limit))
    if as_json:
        emit([_wire(job) for job in rows], [], as_json=True)
    else:
        columns = ["id", "status", "model", "method", "steps", "fine_tuned_model", "created_at"]
        _print_rows([_job_row(job) for job in rows], columns, title="fine-tuning jobs")


@jobs.command("get")
def jobs_get(job_id: str, as_json: JsonOpt = False, base_url: BaseUrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """A job: status, progress, and the adapter version it made."""
    with _client(base_url, api_key) as client:
        job = client.jobs.get(job_id)
    if as_json:
        emit_one(_wire(job), as_json=True)
    else:
        emit_one(_job_row(job), as_json=False)


@jobs.command("logs")
def jobs_logs(
    job_id: str,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until the job ends.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per event and line.")] = False,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """The job's events, oldest first: messages, and metrics of every step."""
    with _client(base_url, api_key) as client:
        if follow:
            events: Iterable[Any] = client.jobs.follow(job_id)
        else:
            events = reversed(list(client.jobs.events(job_id, limit=100)))
        for event in events:
            if as_json:
                print(json.dumps(_wire(event)), flush=True)
            else:
                moment = datetime.fromtimestamp(_wire(event)["created_at"], UTC).strftime("%H:%M:%S")
                style = {"warning": "yellow", "error": "red"}.get(event.level, "")
                line = f"{moment} {event.level:<7} {event.message}"
                console.print(f"[{style}]{line}[/{style}]" if style else line, markup=bool(style), highlight=False)


@jobs.command("cancel")
def jobs_cancel(job_id: str, as_json: JsonOpt = False, base_url: BaseUrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """Cancel a queued job at once, or a running one after its current step (exit 5 if it has finished)."""
    with _client(base_url, api_key) as client:
        job = client.jobs.cancel(job_id)
    if as_json:
        emit_one(_wire(job), as_json=True)
    else:
        emit_one(_job_row(job), as_json=False)


# ---- adapters ----------------------------------------------------------------------------------


@adapters.command("list")
def adapters_list(
    limit: LimitOpt = 20, as_json: JsonOpt = False, base_url: BaseUrlOpt = None, api_key: ApiKeyOpt = None
) -> None:
    """Adapters of the organization, newest first, with their newest version."""
    with _client(base_url, api_key) as client:
        found = list(islice(client.adapters.list(limit=min(limit, 100)), limit))
        versions = {adapter.id: client.adapters.versions(adapter.id) for adapter in found}
    if as_json:
        rows = [{**_wire(adapter), "versions": [_wire(v) for v in versions[adapter.id]]} for adapter in found]
        emit(rows, [], as_json=True)
        return
    rows = [
        {
            "name": adapter.name,
            "id": adapter.id,
            "base_model": adapter.base_model,
            "versions": len(versions[adapter.id]),
            "newest": versions[adapter.id][0].model if versions[adapter.id] else None,
            "created_at": adapter.created_at,
        }
        for adapter in found
    ]
    _print_rows(rows, ["name", "id", "base_model", "versions", "newest", "created_at"], title="adapters")


@adapters.command("download")
def adapters_download(
    ref: Annotated[str, typer.Argument(help="name@N, or a name for its newest version.")],
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="The folder to write the PEFT files into.")],
    as_json: JsonOpt = False,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Download an adapter version in PEFT format (checked against its sha256)."""
    with _client(base_url, api_key) as client:
        version = client.adapters.resolve(ref)
        with stderr.status(f"downloading {version.model} ({version.size_bytes} bytes)"):
            folder = client.adapters.download(version, out)
    row = {"model": version.model, "sha256": version.sha256, "size_bytes": version.size_bytes, "path": str(folder)}
    emit_one(row, as_json=as_json)


# ---- deployments -------------------------------------------------------------------------------


def _deployment_row(deployment: Any) -> dict[str, Any]:
    serving = deployment.serving
    return {
        "name": deployment.name,
        "id": deployment.id,
        "status": deployment.status,
        "revision": deployment.current_revision,
        "serving": (serving.routing.get("model") or deployment.kind) if serving else None,
        "action": serving.action if serving else None,
        "base_model": deployment.base_model,
    }


def _print_deployment(deployment: Any, as_json: bool) -> None:
    emit_one(_wire(deployment) if as_json else _deployment_row(deployment), as_json=as_json)


ReasonOpt = Annotated[str, typer.Option("--reason", help="Why; kept in the revision and the audit log.")]


def deploy(
    name: Annotated[str, typer.Argument(help="The model name clients will send, e.g. support-prod.")],
    model: Annotated[str, typer.Option("--model", help="The adapter version to serve, e.g. support-bot@3.")],
    gate: Annotated[
        str | None,
        typer.Option("--gate", help='JSON required of every promotion: {"benchmark": ID, "min_pass_rate": 0.8, ...}.'),
    ] = None,
    reason: ReasonOpt = "",
    as_json: JsonOpt = False,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Create a deployment serving an adapter version under a stable name (revision 1)."""
    with _client(base_url, api_key) as client:
        deployment = client.deployments.create(name, model=model, gate=_json_object(gate, "--gate"), reason=reason)
    _print_deployment(deployment, as_json)


def promote(
    name: Annotated[str, typer.Argument(help="The deployment's name or id.")],
    model: Annotated[str, typer.Option("--model", help="The adapter version to serve now.")],
    reason: ReasonOpt = "",
    as_json: JsonOpt = False,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Serve another version under the deployment's name (a gate may refuse it: exit 5)."""
    with _client(base_url, api_key) as client:
        deployment = client.deployments.promote(name, model=model, reason=reason)
    _print_deployment(deployment, as_json)


def rollback(
    name: Annotated[str, typer.Argument(help="The deployment's name or id.")],
    to_revision: Annotated[
        int | None, typer.Option("--to-revision", min=1, help="The revision to serve again (the previous one).")
    ] = None,
    reason: ReasonOpt = "",
    as_json: JsonOpt = False,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Serve again what an earlier revision served."""
    with _client(base_url, api_key) as client:
        deployment = client.deployments.rollback(name, to_revision=to_revision, reason=reason)
    _print_deployment(deployment, as_json)


# ---- chat --------------------------------------------------------------------------------------


def chat(
    model: Annotated[str, typer.Argument(help="A base, adapter@version or deployment name.")],
    message: Annotated[str | None, typer.Argument(help="One message; without it, read lines from stdin.")] = None,
    system: Annotated[str | None, typer.Option("--system", help="A system prompt.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 256,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, max=2.0)] = 0.7,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print each whole completion as JSON (one per line) instead of streaming.")
    ] = False,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """Chat with a model: the answer streams as it is generated.

    Without MESSAGE, each line of stdin is a turn of one conversation (an interactive chat at a
    terminal; end it with Ctrl-D).
    """
    history: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    interactive = message is None and sys.stdin.isatty()
    turns = [message] if message is not None else _stdin_lines(interactive)
    with _client(base_url, api_key) as client:
        for turn in turns:
            history.append({"role": "user", "content": turn})
            if as_json:
                completion = client.chat.create(model, history, max_tokens=max_tokens, temperature=temperature)
                print(json.dumps(_wire(completion)), flush=True)
                answer = completion.choices[0]["message"].get("content") or ""
            else:
                streamed = client.chat.create(
                    model, history, stream=True, max_tokens=max_tokens, temperature=temperature
                )
                with streamed as stream:
                    for delta in stream.text_deltas():
                        sys.stdout.write(delta)
                        sys.stdout.flush()
                    answer = stream.text
                sys.stdout.write("\n")
                sys.stdout.flush()
            history.append({"role": "assistant", "content": answer})


def _stdin_lines(interactive: bool) -> Iterable[str]:
    while True:
        if interactive:
            stderr.print("[bold]you>[/bold] ", end="")
        line = sys.stdin.readline()
        if not line:
            return
        if line.strip():
            yield line.rstrip("\n")

"""`mint benchmarks ...`: tasks and graders, in immutable versions."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mint.cli.options import LimitOpt, Remote, first, grader_option, remote
from mint.cli.output import human
from mint.schemas.common import MAX_SEED
from mint.schemas.evals import MAX_BUILTIN_TASKS, BuiltinName, BuiltinSplit
from mint.sdk.errors import BadRequestError

app = typer.Typer(help="Benchmarks: tasks and graders, in immutable versions.", no_args_is_help=True)

COLUMNS = ["id", "name", "version", "tasks", "splits", "created_at"]


def row_of(benchmark: Any) -> dict[str, Any]:
    """A benchmark with its newest version, for people."""
    latest = benchmark.latest_version
    return human(
        {
            "id": benchmark.id,
            "name": benchmark.name,
            "version": latest.version if latest else None,
            "tasks": latest.task_count if latest else None,
            "splits": ", ".join(f"{k}: {v}" for k, v in latest.splits.items()) if latest else None,
            "created_at": benchmark.created_at,
        }
    )


@app.command("create")
@remote
def create(
    api: Remote,
    name: Annotated[str, typer.Argument(help="Unique in the organization.")],
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            exists=True,
            dir_okay=False,
            help="Tasks as .jsonl or .yaml (Mint, TRL, verl or OpenRLHF rows), or a .parquet file of prompts.",
        ),
    ] = None,
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="An uploaded prompts dataset whose rows are the tasks.")
    ] = None,
    builtin: Annotated[BuiltinName | None, typer.Option("--builtin", help="A built-in benchmark to import.")] = None,
    grader: Annotated[
        str | None, typer.Option("--grader", help='Grader of the tasks: a name (numeric) or JSON {"type", "config"}.')
    ] = None,
    split: Annotated[BuiltinSplit | None, typer.Option("--split", help="With --builtin: only this split.")] = None,
    n: Annotated[
        int | None, typer.Option("--n", min=1, max=MAX_BUILTIN_TASKS, help="With --builtin: tasks per split.")
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", min=0, max=MAX_SEED, help="With --builtin: which tasks are drawn.")
    ] = None,
    description: Annotated[str, typer.Option("--description")] = "",
) -> None:
    """Create a benchmark (its version 1) from a file of tasks, an uploaded prompts dataset and/or a
    built-in benchmark. A .parquet file (verl's RL rows, say) is uploaded as a prompts dataset first."""
    if file is None and dataset is None and builtin is None:
        raise BadRequestError("give the tasks with --file PATH, --dataset ID or --builtin NAME", param="file")
    with api.client() as client:
        if file is not None and file.suffix.lower() == ".parquet":
            dataset, file = client.datasets.upload(file, kind="prompts").id, None
        benchmark = client.benchmarks.create(
            name,
            path=file,
            dataset_id=dataset,
            grader=grader_option(grader),
            builtin=builtin,
            split=split,
            n=n,
            seed=seed,
            description=description,
        )
    api.show(benchmark, row_of(benchmark))


@app.command("list")
@remote
def list_benchmarks(api: Remote, limit: LimitOpt = 20) -> None:
    """Benchmarks of the organization, newest first, with their newest version."""
    with api.client() as client:
        rows = first(client.benchmarks.list, limit)
    api.table(rows, COLUMNS, title="benchmarks", row=row_of)

"""`mint evals ...`: evaluate a model on a benchmark, read what it answered, compare two runs,
mine the failures."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

import typer
from rich.markup import escape

from mint.cli.options import LimitOpt, Remote, TimeoutOpt, WaitOpt, exit_unless_succeeded, first, remote
from mint.cli.output import console, emit, emit_one, errors, human, wire
from mint.schemas.common import MAX_VERSION
from mint.schemas.evals import MinedKind

app = typer.Typer(help="Eval runs: evaluate, read the answers, compare, mine failures.", no_args_is_help=True)

LIST_COLUMNS = ["id", "status", "model", "benchmark_id", "version", "split", "accuracy", "passed", "created_at"]


def row_of(run: Any) -> dict[str, Any]:
    """An eval run with its headline metrics, for people."""
    metrics = run.metrics or {}
    return human(
        {
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
    )


@app.command("run")
@remote
def run(
    api: Remote,
    benchmark: Annotated[str, typer.Option("--benchmark", help="The benchmark's id.")],
    model: Annotated[str, typer.Option("--model", help="A base, adapter@version or deployment.")],
    version: Annotated[
        int | None, typer.Option("--version", min=1, max=MAX_VERSION, help="Benchmark version (newest).")
    ] = None,
    split: Annotated[str | None, typer.Option("--split", help="Only this split's tasks.")] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, max=8192, help="Longest assistant turn.")
    ] = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Evaluate a model on a benchmark version; with --wait, until it has finished (exit 1 unless it succeeded)."""
    with api.client() as client:
        eval_run = client.evals.create(benchmark, model, version=version, split=split, max_tokens=max_tokens)
        if wait:
            eval_run = eval_run.wait(timeout_s=timeout)
    api.show(eval_run, row_of(eval_run))
    if wait:
        exit_unless_succeeded(eval_run.status, f"eval run {eval_run.id}")


@app.command("list")
@remote
def list_runs(
    api: Remote,
    benchmark: Annotated[str | None, typer.Option("--benchmark", help="Only runs of this benchmark (its id).")] = None,
    limit: LimitOpt = 20,
) -> None:
    """Eval runs of the organization, newest first, with their accuracy."""
    with api.client() as client:
        rows = first(partial(client.evals.list, benchmark_id=benchmark), limit)
    api.table(rows, LIST_COLUMNS, title="eval runs", row=row_of)


@app.command("get")
@remote
def get(api: Remote, run_id: str) -> None:
    """An eval run: status and metrics."""
    with api.client() as client:
        eval_run = client.evals.get(run_id)
    api.show(eval_run, row_of(eval_run))


@app.command("compare")
@remote
def compare(
    api: Remote,
    a: Annotated[str, typer.Argument(help="The baseline run.")],
    b: Annotated[str, typer.Argument(help="The run compared with it.")],
) -> None:
    """B against A, task by task: fixed and broken tasks, and the accuracy delta with its interval."""
    with api.client() as client:
        comparison = client.evals.compare(a, b)
    if api.as_json:
        emit_one(wire(comparison), as_json=True)
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
    emit(rows, ["metric", "A", "B", "B - A"], as_json=False, title=f"{b} against {a} ({comparison.tasks} tasks)")
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


@app.command("failures")
@remote
def failures(
    api: Remote,
    run_id: Annotated[str, typer.Argument(help="A finished eval run.")],
    kind: Annotated[
        MinedKind, typer.Option("--kind", help="chat: SFT rows; preference: DPO pairs; prompts: RL prompts.")
    ] = "chat",
) -> None:
    """Mine a run's failed tasks into a dataset to train on."""
    with api.client() as client:
        dataset = client.evals.from_failures(run_id, kind=kind)
    api.show(dataset, ["id", "kind", "row_count", "failed_tasks", "source_eval_run_id"])
    if not api.as_json:
        for skipped in dataset.skipped:
            errors.print(f"skipped {skipped.task_id}: {skipped.reason}")


@app.command("trajectories")
@remote
def trajectories(
    api: Remote,
    run_id: Annotated[str, typer.Argument(help="An eval run.")],
    failed: Annotated[bool, typer.Option("--failed", help="Only the tasks the model failed.")] = False,
    task: Annotated[str | None, typer.Option("--task", help="Only this task (its id in the benchmark).")] = None,
    limit: LimitOpt = 20,
) -> None:
    """What the model answered, task by task and turn by turn, with its grade and why."""
    with api.client() as client:
        found = first(partial(client.evals.trajectories, run_id, passed=False if failed else None, task_id=task), limit)
    if api.as_json:
        emit([wire(trajectory) for trajectory in found], [], as_json=True)
        return
    if not found:
        console.print("No trajectories" + (" of task " + escape(task) if task else "") + (" failed" if failed else ""))
    for trajectory in found:
        print_trajectory(trajectory)


def print_trajectory(trajectory: Any) -> None:
    """One task as a reader follows it: a header line with the grade and cost, every turn of the
    conversation (tool calls and results included), then the grader's reason and any error."""
    verdict = "[green]passed[/green]" if trajectory.passed else "[red]failed[/red]"
    steps = f"{trajectory.steps} step" + ("s" if trajectory.steps != 1 else "")
    console.print(
        f"[bold]task {escape(trajectory.task_id)}[/bold]  {verdict}  score {trajectory.score:.2f}  {steps}  "
        f"{trajectory.tokens_in} in / {trajectory.tokens_out} out tokens  {trajectory.latency_ms:.0f} ms"
    )
    for message in trajectory.messages:
        for role, text in turn_lines(message):
            console.print(f"  [cyan]{escape(role)}[/cyan]: {escape(text)}", soft_wrap=True)
    detail = (trajectory.grade or {}).get("detail")
    if detail:
        console.print(f"  [magenta]graded[/magenta]: {escape(str(detail))}", soft_wrap=True)
    if trajectory.error:
        console.print(f"  [red]error[/red]: {escape(trajectory.error)}", soft_wrap=True)
    console.print()


def turn_lines(message: Any) -> list[tuple[str, str]]:
    """The lines one message of a trajectory prints as: its text, then each tool call it made."""
    if not isinstance(message, dict):
        return [("message", str(message))]
    role = str(message.get("role", "message"))
    if role == "tool" and message.get("name"):
        role = f"tool {message['name']}"
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts: the text ones are what was said
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    lines = [(role, str(content))] if content else []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        lines.append((f"{role} calls", f"{function.get('name', '?')}({function.get('arguments', '')})"))
    return lines or [(role, "")]

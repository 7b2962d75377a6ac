"""`mint captures ...`: read a captured completion and give feedback on it."""

from __future__ import annotations

from typing import Annotated

import typer

from mint.cli.deployments import capture_row
from mint.cli.options import Remote, remote
from mint.cli.output import human

app = typer.Typer(help="Completions a deployment captured, and feedback on them.", no_args_is_help=True)

CompletionArg = Annotated[str, typer.Argument(help="The completion's id, e.g. chatcmpl-....")]


@app.command("get")
@remote
def get(api: Remote, completion_id: CompletionArg) -> None:
    """A captured completion: what was asked and answered, by which version, and its feedback."""
    with api.client() as client:
        capture = client.captures.get(completion_id)
    api.show(capture, capture_row(capture))


@app.command("feedback")
@remote
def feedback(
    api: Remote,
    completion_id: CompletionArg,
    score: Annotated[float | None, typer.Option("--score", min=0.0, max=1.0, help="How good, 0 to 1.")] = None,
    label: Annotated[str | None, typer.Option("--label", help="A label, e.g. wrong_tool.")] = None,
    comment: Annotated[str | None, typer.Option("--comment", help="Free text.")] = None,
    correct: Annotated[str | None, typer.Option("--correct", help="The answer it should have been (text).")] = None,
) -> None:
    """Say how good a captured answer was, and what it should have been (viewer keys may)."""
    with api.client() as client:
        correction = None
        if correct is not None:
            kind = client.captures.get(completion_id).kind
            correction = {"message": {"role": "assistant", "content": correct}} if kind == "chat" else {"text": correct}
        given = client.captures.feedback(
            completion_id, score=score, label=label, comment=comment, correction=correction
        )
    api.show(given, human(given.model_dump(exclude={"object"})))


DeploymentOpt = Annotated[str | None, typer.Option("--deployment", help="Only this deployment's captures.")]
LabelOpt = Annotated[str | None, typer.Option("--label", help="Only captures given this label.")]
MaxScoreOpt = Annotated[
    float | None, typer.Option("--max-score", min=0.0, max=1.0, help="Only captures scored at most this.")
]


@app.command("mine")
@remote
def mine(
    api: Remote,
    kind: Annotated[str, typer.Option("--kind", help="chat (SFT) | preference (DPO) | prompts (RL).")],
    deployment: DeploymentOpt = None,
    label: LabelOpt = None,
    max_score: MaxScoreOpt = None,
) -> None:
    """Turn corrected captures into a dataset: SFT rows, DPO pairs or RL prompts."""
    with api.client() as client:
        dataset = client.captures.to_dataset(kind, deployment=deployment, label=label, max_score=max_score)
    api.show(dataset, ["id", "kind", "row_count", "filename", "skipped"])


@app.command("to-benchmark")
@remote
def to_benchmark(
    api: Remote,
    benchmark: Annotated[str, typer.Argument(help="The benchmark's id.")],
    deployment: DeploymentOpt = None,
    label: LabelOpt = None,
    max_score: MaxScoreOpt = None,
) -> None:
    """Add each corrected capture to a benchmark's next version as a task (split `production`)."""
    with api.client() as client:
        version = client.captures.to_benchmark(benchmark, deployment=deployment, label=label, max_score=max_score)
    api.show(version, ["id", "benchmark_id", "version", "task_count", "splits"])

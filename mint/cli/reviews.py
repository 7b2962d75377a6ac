"""`mint reviews ...`: expert review rounds. Make a queue from an eval run's trajectories or a
deployment's captures, read and judge its items, see how reviewers and graders agree, read a
run with expert verdicts, and mine the corrections into a dataset or a benchmark version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from mint.cli.options import LimitOpt, Remote, first, remote
from mint.cli.output import human

app = typer.Typer(help="Expert review: queues, reviews, agreement, corrections as data.", no_args_is_help=True)

QUEUE_COLUMNS = ["id", "name", "source", "item_count", "reviews_per_item", "created_at"]
ITEM_COLUMNS = ["id", "position", "task_id", "assignee_key_id", "reasons"]
QueueArg = Annotated[str, typer.Argument(help="The review queue's id (rq_...).")]
ItemArg = Annotated[str, typer.Argument(help="The review item's id (ri_...).")]
ThresholdOpt = Annotated[
    float | None, typer.Option("--threshold", min=0.0, max=1.0, help="Flag graders whose alpha is below this.")
]


def _filters(**given: Any) -> dict[str, Any]:
    """The queue filters given on the command line, in the API's shape."""
    filters = {name: value for name, value in given.items() if value is not None and not name.startswith("score_")}
    band = {key: given[f"score_{key}"] for key in ("min", "max", "grader") if given[f"score_{key}"] is not None}
    if band:
        filters["score"] = band
    if "disagree_graders" in filters:
        filters["disagree_graders"] = [part.strip() for part in filters["disagree_graders"].split(",")]
    return filters


@app.command("create")
@remote
def create(
    api: Remote,
    name: Annotated[str, typer.Argument(help="A name for the round, e.g. 'sums round 1'.")],
    eval_id: Annotated[str | None, typer.Option("--eval", help="Review this eval run's trajectories.")] = None,
    deployment: Annotated[str | None, typer.Option("--deployment", help="Review this deployment's captures.")] = None,
    failed: Annotated[bool | None, typer.Option("--failed/--passed", help="Only failed (or passed) ones.")] = None,
    score_min: Annotated[float | None, typer.Option("--score-min", min=0.0, max=1.0)] = None,
    score_max: Annotated[float | None, typer.Option("--score-max", min=0.0, max=1.0)] = None,
    score_grader: Annotated[
        str | None, typer.Option("--score-grader", help="Read the score band on this grader's part (e.g. judge).")
    ] = None,
    disagree_with_run: Annotated[
        str | None, typer.Option("--disagree-with-run", help="Only tasks this other run graded the other way.")
    ] = None,
    disagree_graders: Annotated[
        str | None, typer.Option("--disagree-graders", help="Two grader types that disagree, e.g. regex,judge.")
    ] = None,
    judge_margin: Annotated[
        float | None,
        typer.Option("--judge-margin", min=0.0, max=1.0, help="Only where a judge gave no verdict or was this close."),
    ] = None,
    label: Annotated[str | None, typer.Option("--label", help="A task's split, or a capture's feedback label.")] = None,
    sample_rate: Annotated[float | None, typer.Option("--sample-rate", min=0.0, max=1.0)] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0)] = None,
    reviews_per_item: Annotated[int | None, typer.Option("--reviews-per-item", min=1, max=10)] = None,
    assign: Annotated[
        list[str] | None, typer.Option("--assign", help="An API key id to deal items to (repeat).")
    ] = None,
    instructions: Annotated[str | None, typer.Option("--instructions", help="What reviewers should look for.")] = None,
    max_items: Annotated[int | None, typer.Option("--max-items", min=1)] = None,
) -> None:
    """Make a review queue from a run's trajectories or a deployment's captures."""
    filters = _filters(
        failed=failed,
        score_min=score_min,
        score_max=score_max,
        score_grader=score_grader,
        disagree_with_run=disagree_with_run,
        disagree_graders=disagree_graders,
        judge_margin=judge_margin,
        label=label,
        sample_rate=sample_rate,
        seed=seed,
    )
    with api.client() as client:
        queue = client.reviews.create_queue(
            name,
            eval_id=eval_id,
            deployment=deployment,
            filters=filters,
            reviews_per_item=reviews_per_item,
            assignees=assign,
            instructions=instructions,
            max_items=max_items,
        )
    api.show(queue, QUEUE_COLUMNS)


@app.command("list")
@remote
def list_queues(api: Remote, limit: LimitOpt = 20) -> None:
    """The organization's review queues, newest first."""
    with api.client() as client:
        rows = first(client.reviews.queues, limit)
    api.table(rows, QUEUE_COLUMNS, title="review queues")


@app.command("show")
@remote
def show(api: Remote, queue_id: QueueArg) -> None:
    """A queue and its progress: items reviewed and done, and those left for your key."""
    with api.client() as client:
        queue = client.reviews.get_queue(queue_id)
    progress = queue.progress.model_dump() if queue.progress is not None else {}
    api.show(queue, human({**queue.model_dump(include=set(QUEUE_COLUMNS)), **progress}))


@app.command("items")
@remote
def items(
    api: Remote,
    queue_id: QueueArg,
    status: Annotated[str, typer.Option("--status", help="all | todo (left for you) | reviewed | done.")] = "all",
    limit: LimitOpt = 20,
) -> None:
    """The queue's items in order (with --json: each with its snapshot and reviews)."""
    with api.client() as client:
        rows = first(lambda limit: client.reviews.items(queue_id, status=status, limit=limit), limit)
    api.table(rows, ITEM_COLUMNS, title="review items")


@app.command("submit")
@remote
def submit(
    api: Remote,
    item_id: ItemArg,
    verdict: Annotated[str | None, typer.Option("--verdict", help="pass | fail.")] = None,
    score: Annotated[float | None, typer.Option("--score", min=0.0, max=1.0)] = None,
    comment: Annotated[str | None, typer.Option("--comment")] = None,
    correction: Annotated[
        Path | None,
        typer.Option("--correction", help='A JSON file: {"from_message": N, "messages": [...]}.', exists=True),
    ] = None,
    correct: Annotated[
        str | None, typer.Option("--correct", help="The answer it should have been, from the model's first turn.")
    ] = None,
) -> None:
    """Judge an item (any key, viewers included); your second review of it replaces the first."""
    if verdict not in (None, "pass", "fail"):
        raise typer.BadParameter("pass or fail", param_hint="--verdict")
    with api.client() as client:
        fix: dict[str, Any] | None = json.loads(correction.read_text()) if correction is not None else None
        if correct is not None:
            start = client.reviews.get_item(item_id).snapshot.prompt_length
            fix = {"from_message": start, "messages": [{"role": "assistant", "content": correct}]}
        review = client.reviews.submit(
            item_id,
            passed=None if verdict is None else verdict == "pass",
            score=score,
            comment=comment,
            correction=fix,
        )
    api.show(review, ["id", "item_id", "reviewer", "passed", "score", "comment"])


@app.command("agreement")
@remote
def agreement(api: Remote, queue_id: QueueArg, threshold: ThresholdOpt = None) -> None:
    """How the reviewers agree (Krippendorff's alpha), and each grader with them."""
    with api.client() as client:
        report = client.reviews.agreement(queue_id, threshold=threshold)
    if api.as_json:
        api.show(report, [])
        return
    api.show(report, human({"items": report.items, "settled": report.settled, **report.reviewers.model_dump()}))
    columns = ["grader", "type", "model", "items", "percent_agreement", "alpha", "flagged"]
    api.table(report.graders, columns, title="graders against the experts")


@app.command("run")
@remote
def run(api: Remote, eval_id: Annotated[str, typer.Argument(help="The eval run's id.")]) -> None:
    """An eval run read with expert verdicts overriding the grader's where the experts settled."""
    with api.client() as client:
        view = client.reviews.run(eval_id)
    if api.as_json:
        api.show(view, [])
        return
    api.show(view, ["eval_id", "tasks", "reviewed", "differs", "grader_pass_rate", "pass_rate"])
    api.table(view.trajectories, ["task_id", "grader_passed", "passed", "differs"], title="reviewed tasks")


@app.command("mine")
@remote
def mine(
    api: Remote,
    queue_id: QueueArg,
    kind: Annotated[str, typer.Option("--kind", help="chat (SFT) | preference (DPO) | prompts (RL).")],
    filename: Annotated[str | None, typer.Option("--filename")] = None,
) -> None:
    """Mine the queue's corrections into a dataset; each row names its reviewer."""
    with api.client() as client:
        dataset = client.reviews.dataset(queue_id, kind, filename=filename)
    api.show(dataset, ["id", "filename", "kind", "row_count", "source_eval_run_id"])


@app.command("benchmark")
@remote
def benchmark(
    api: Remote,
    queue_id: QueueArg,
    benchmark_id: Annotated[
        str | None, typer.Option("--benchmark", help="Default: the benchmark of the queue's eval run.")
    ] = None,
    split: Annotated[str | None, typer.Option("--split", help="The new tasks' split (default expert).")] = None,
) -> None:
    """Add a benchmark version with the queue's corrections as tasks."""
    with api.client() as client:
        version = client.reviews.benchmark_version(queue_id, benchmark_id=benchmark_id, split=split)
    api.show(version, ["id", "benchmark_id", "version", "task_count", "splits"])

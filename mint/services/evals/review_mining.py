"""Expert corrections as data and tasks: a queue's corrected reviews mined into SFT rows, DPO
pairs and RL prompts, and into new benchmark tasks (split `expert`).

A review's correction keeps the item's messages before `from_message` and rewrites the rest.
It is read as a benchmark task (the conversation up to the turn that went wrong, the rewritten
turns as its `solution`, the correction's last answer as reference, graded `normalized`) and a
failed trajectory (what the model did), and goes through the same mining as an eval run's
failures and production's corrected captures (`mint.evals.mining`): an SFT row ends in the
correction, a DPO pair prefers the corrected turn over the model's. Every row records the
review in `metadata.lineage` (reviewer, queue, item, source task); so does every task made of
one (its `metadata.lineage`), and a dataset from a queue over an eval run names the run
(`source_eval_run_id`).

A task made for a benchmark starts at the item's prompt, and its solution is the model's turns
before `from_message` followed by the rewrite; it keeps the source task's tools and scripted
environment. Its id is the review's, so mining the same queue again adds nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.chat.messages import message_text
from mint.errors import InvalidRequest
from mint.evals.benchmark import BenchmarkTask
from mint.evals.graders import GraderSpec
from mint.evals.mining import MiningKind, MiningResult, mine_failures
from mint.schemas.reviews import BenchmarkFromReviews, DatasetFromReviews, ItemSnapshot
from mint.services import benchmarks, catalog
from mint.services.agreement import reviews_of
from mint.services.datasets import dataset_of_mined
from mint.services.evals.reviews import snapshot_of
from mint.services.principal import Principal
from mint.storage.objects import ObjectStore
from mint.storage.tables import BenchmarkVersion, Dataset, Review, ReviewItem, ReviewQueue

GRADER = GraderSpec(type="normalized")


@dataclass(frozen=True)
class ReviewedTrajectory:
    """What the model did on a reviewed item, read as a failed trajectory for mining, with the
    review it was corrected by."""

    task_id: str
    messages: list[Any]
    passed: bool = False
    lineage: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Corrected:
    item: ReviewItem
    snapshot: ItemSnapshot
    review: Review

    @property
    def start(self) -> int:
        return int((self.review.correction or {})["from_message"])

    @property
    def rewrite(self) -> list[dict[str, Any]]:
        return list((self.review.correction or {})["messages"])

    def lineage(self, queue: ReviewQueue) -> dict[str, Any]:
        source = {"eval_run_id": queue.eval_run_id} if queue.eval_run_id else {"capture_id": self.item.source_id}
        return {
            "source": "expert_review",
            "review_id": self.review.id,
            "reviewer": self.review.reviewer,
            "reviewer_name": self.review.reviewer_name,
            "queue_id": queue.id,
            "item_id": self.item.id,
            "task_id": self.item.task_id,
            **source,
        }


def corrected(session: Session, queue: ReviewQueue) -> list[Corrected]:
    """The queue's reviews that give a correction, in queue order, then by reviewer."""
    items = list(
        session.execute(
            select(ReviewItem).where(ReviewItem.queue_id == queue.id).order_by(ReviewItem.position)
        ).scalars()
    )
    given = reviews_of(session, [item.id for item in items])
    found = [
        Corrected(item, snapshot_of(item), review)
        for item in items
        for review in sorted(given[item.id], key=lambda review: review.reviewer)
        if review.correction is not None
    ]
    if not found:
        raise InvalidRequest(
            f"no review of queue {queue.id} gives a correction: mining needs reviews with `correction` "
            "(POST /v1/reviews/items/{item_id}/reviews)",
            param="queue_id",
        )
    return found


def _answer(rewrite: list[dict[str, Any]]) -> str | None:
    text = message_text(rewrite[-1]).strip()
    return text or None


def _mining_pair(queue: ReviewQueue, entry: Corrected) -> tuple[BenchmarkTask | None, ReviewedTrajectory, str]:
    """The correction as a task starting at the turn that went wrong, and what the model did."""
    snapshot = entry.snapshot
    trajectory = ReviewedTrajectory(entry.review.id, list(snapshot.messages), lineage=entry.lineage(queue))
    answer = _answer(entry.rewrite)
    if answer is None:
        return None, trajectory, "the correction's last message has no text to use as reference"
    task = BenchmarkTask(
        id=entry.review.id,
        messages=snapshot.messages[: entry.start],
        tools=snapshot.tools,
        environment=snapshot.environment or [],
        reference=answer,
        grader=GRADER,
        solution=entry.rewrite,
        metadata={"lineage": entry.lineage(queue)},
    )
    return task, trajectory, ""


def mine_reviews(session: Session, queue: ReviewQueue, kind: MiningKind) -> MiningResult:
    """Rows of `kind` from the queue's corrections, each with its review in `metadata.lineage`."""
    tasks, trajectories, skipped = [], [], []
    for entry in corrected(session, queue):
        task, trajectory, why = _mining_pair(queue, entry)
        if task is None:
            skipped.append((entry.review.id, why))
            continue
        tasks.append(task)
        trajectories.append(trajectory)
    result = mine_failures(kind, tasks, trajectories)
    result.skipped[:0] = skipped
    return result


def dataset_from_reviews(
    session: Session, store: ObjectStore, principal: Principal, queue: ReviewQueue, body: DatasetFromReviews
) -> tuple[Dataset, MiningResult]:
    """A dataset mined from the queue's corrections (developer or admin)."""
    principal.require("developer")
    result = mine_reviews(session, queue, body.kind)
    dataset = dataset_of_mined(
        session,
        store,
        result,
        organization_id=principal.organization_id,
        what=f"the corrections of queue {queue.id}",
        filename=body.filename or f"{queue.id}-expert-{body.kind}.jsonl",
        source_eval_run_id=queue.eval_run_id,
    )
    return dataset, result


def expert_task(queue: ReviewQueue, entry: Corrected, split: str) -> tuple[BenchmarkTask | None, str]:
    """The correction as a whole new task: the item's prompt, the corrected trajectory as solution."""
    snapshot = entry.snapshot
    answer = _answer(entry.rewrite)
    if answer is None:
        return None, "the correction's last message has no text to use as reference"
    if snapshot.prompt_length < 1:
        return None, "the item has no prompt to start a task from"
    task = BenchmarkTask(
        id=entry.review.id,
        messages=snapshot.messages[: snapshot.prompt_length],
        tools=snapshot.tools,
        environment=snapshot.environment or [],
        reference=answer,
        grader=GRADER,
        split=split,
        solution=[*snapshot.messages[snapshot.prompt_length : entry.start], *entry.rewrite],
        metadata={"lineage": entry.lineage(queue), "model": snapshot.model},
    )
    return task, ""


def benchmark_from_reviews(
    session: Session, store: ObjectStore, principal: Principal, queue: ReviewQueue, body: BenchmarkFromReviews
) -> tuple[BenchmarkVersion, int]:
    """The benchmark's next version: its newest version's tasks and, under `body.split`, the
    queue's corrections not in it yet (developer or admin). Returns the version and how many
    tasks it added."""
    principal.require("developer")
    benchmark_ref = body.benchmark_id
    if benchmark_ref is None:
        if queue.eval_run_id is None:
            raise InvalidRequest(
                "this queue reviews captures, which belong to no benchmark: name one with benchmark_id",
                param="benchmark_id",
            )
        run = catalog.get_eval_run(session, principal.organization_id, queue.eval_run_id, param="queue_id")
        benchmark_ref = str(run.config["benchmark_id"])
    benchmark = benchmarks.get_benchmark(session, principal.organization_id, benchmark_ref)
    newest = benchmarks.latest_version(session, benchmark.id)
    existing = benchmarks.load_tasks(store, newest.object_key, newest.sha256) if newest is not None else []
    known = {task.id for task in existing}
    added, skipped = [], []
    for entry in corrected(session, queue):
        task, why = expert_task(queue, entry, body.split)
        if task is None:
            skipped.append(f"{entry.review.id}: {why}")
        elif task.id not in known:
            added.append(task)
    if not added:
        why = "; ".join(skipped[:3]) or "every correction of this queue is already a task of this benchmark"
        raise InvalidRequest(f"no correction gives a new task ({why})", param="queue_id")
    version = benchmarks.add_version_of_tasks(
        session, store, benchmark, [*existing, *added], newest.grader if newest is not None else {}
    )
    return version, len(added)

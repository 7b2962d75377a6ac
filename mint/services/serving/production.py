"""Production becomes material for the next round: corrected captures mined into datasets
(SFT rows, DPO pairs, RL prompts) and into new benchmark tasks, so the ruler grows with what
users actually ask.

A captured chat completion with a correction in its feedback is read as a benchmark task (its
request's messages and tools, the correction as reference, graded `normalized`, task id the
completion's id) and a failed trajectory (the request and what was served), and goes through
the same mining as an eval run's failures (`mint.evals.mining`). The newest feedback of a
capture that gives a correction is the one used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.errors import InvalidRequest
from mint.evals.benchmark import BenchmarkTask
from mint.evals.graders import GraderSpec
from mint.evals.mining import MiningKind, MiningResult, mine_failures
from mint.schemas.captures import BenchmarkFromCaptures, CaptureFilter, DatasetFromCaptures
from mint.services import benchmarks
from mint.services.catalog import get_deployment
from mint.services.datasets import dataset_of_mined
from mint.services.principal import Principal
from mint.services.serving.captures import feedback_of
from mint.storage.objects import ObjectStore
from mint.storage.tables import BenchmarkVersion, Capture, Dataset, Feedback

GRADER = GraderSpec(type="normalized")


@dataclass(frozen=True)
class ServedTrajectory:
    """What was served for a captured request, read as a failed trajectory for mining."""

    task_id: str
    messages: list[Any]
    passed: bool = False


def _chosen(session: Session, organization_id: str, wanted: CaptureFilter) -> list[tuple[Capture, Feedback]]:
    """The captures in the window whose feedback corrects them, with that feedback."""
    query = select(Capture).where(Capture.organization_id == organization_id)
    if wanted.deployment is not None:
        deployment = get_deployment(session, organization_id, wanted.deployment)
        query = query.where(Capture.deployment_id == deployment.id)
    if wanted.since is not None:
        query = query.where(Capture.created_at >= wanted.since)
    if wanted.until is not None:
        query = query.where(Capture.created_at < wanted.until)
    rows = list(session.execute(query.order_by(Capture.created_at, Capture.id)).scalars())
    given = feedback_of(session, [row.id for row in rows])
    chosen = []
    for row in rows:
        entries = given[row.id]
        corrected = [entry for entry in entries if entry.correction is not None]
        scores = [entry.score for entry in entries if entry.score is not None]
        if not corrected:
            continue
        if wanted.max_score is not None and not (scores and scores[-1] <= wanted.max_score):
            continue
        if wanted.label is not None and wanted.label not in {entry.label for entry in entries}:
            continue
        chosen.append((row, corrected[-1]))
    if not chosen:
        where = f"of deployment {wanted.deployment!r} " if wanted.deployment else ""
        raise InvalidRequest(
            f"no capture {where}matches: mining needs captures whose feedback gives a correction "
            "(POST /v1/captures/{id}/feedback with `correction`), in the window and filters given",
            param="deployment",
        )
    return chosen


def _task(capture: Capture, feedback: Feedback, split: str) -> tuple[BenchmarkTask | None, str]:
    """A captured chat request and its correction as a benchmark task."""
    if capture.kind != "chat":
        return None, "a text completion has no messages to make a task of"
    correction = (feedback.correction or {}).get("message") or {}
    if correction.get("tool_calls"):
        return None, "a correction with tool calls has no scripted tool results to grade against"
    text = correction.get("content")
    if not isinstance(text, str) or not text:
        return None, "the correction has no text"
    request = capture.request
    task = BenchmarkTask(
        id=capture.id,
        messages=request["messages"],
        tools=request.get("tools"),
        reference=text,
        grader=GRADER,
        split=split,
        metadata={"capture": capture.id, "deployment_id": capture.deployment_id, "model": capture.model_ref},
    )
    return task, ""


def _served(capture: Capture) -> ServedTrajectory:
    choices = capture.response.get("choices") or [{}]
    answer = choices[0].get("message") or {"role": "assistant", "content": ""}
    return ServedTrajectory(task_id=capture.id, messages=[*capture.request.get("messages", []), answer])


def mine_captures(
    session: Session, organization_id: str, wanted: CaptureFilter, kind: MiningKind, split: str = "production"
) -> tuple[list[BenchmarkTask], MiningResult]:
    """The corrected captures as tasks, and the rows of `kind` mined from them."""
    tasks, trajectories, skipped = [], [], []
    for capture, feedback in _chosen(session, organization_id, wanted):
        task, why = _task(capture, feedback, split)
        if task is None:
            skipped.append((capture.id, why))
            continue
        tasks.append(task)
        trajectories.append(_served(capture))
    result = mine_failures(kind, tasks, trajectories)
    result.skipped[:0] = skipped
    return tasks, result


def dataset_from_captures(
    session: Session, store: ObjectStore, principal: Principal, body: DatasetFromCaptures
) -> tuple[Dataset, MiningResult]:
    """A dataset mined from a deployment's corrected captures."""
    _, result = mine_captures(session, principal.organization_id, body, body.kind)
    dataset = dataset_of_mined(
        session,
        store,
        result,
        organization_id=principal.organization_id,
        what="the corrected captures",
        filename=body.filename or f"{body.deployment or 'production'}-captures-{body.kind}.jsonl",
    )
    return dataset, result


def benchmark_from_captures(
    session: Session, store: ObjectStore, principal: Principal, benchmark_id: str, body: BenchmarkFromCaptures
) -> tuple[BenchmarkVersion, int]:
    """The benchmark's next version: its newest version's tasks and, under split `body.split`,
    the corrected captures not in it yet. Returns the version and how many tasks it added."""
    benchmark = benchmarks.get_benchmark(session, principal.organization_id, benchmark_id)
    newest = benchmarks.latest_version(session, benchmark.id)
    existing = benchmarks.load_tasks(store, newest.object_key, newest.sha256) if newest is not None else []
    tasks, _ = mine_captures(session, principal.organization_id, body, "chat", body.split)
    known = {task.id for task in existing}
    added = [task for task in tasks if task.id not in known]
    if not added:
        raise InvalidRequest("every corrected capture is already a task of this benchmark", param="deployment")
    version = benchmarks.add_version_of_tasks(
        session, store, benchmark, [*existing, *added], newest.grader if newest is not None else {}
    )
    return version, len(added)

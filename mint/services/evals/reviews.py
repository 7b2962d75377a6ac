"""Expert review: queues of what experts should read, and their reviews.

A queue is made (developer or admin) from one source, an eval run's trajectories or a
deployment's captures, and filters (failed; a score band, overall or of one grader of a
composite grade; disagreement with another run of the same benchmark version, or between two
graders of the same grade; a judge's low confidence; a label; a seeded random share). Each item
keeps a snapshot of what a reviewer reads (`mint.schemas.reviews.ItemSnapshot`): the whole
conversation with its tool calls and results, the reference, the grade with its parts and a
judge's prompt and reply, and the rubric criteria to mark (the task's `metadata.rubric`, a list
of criteria, else the lines of its judge's rubric). Items are open to any reviewer, or dealt to
API keys in turn (`assignees`); an assigned item is reviewed by its assignee only.

Who reviews: any key of the organization, viewers included (as feedback on captures: the
people who read answers are the ones who can judge them), so that an expert can hold a key
that reviews and reads but trains and deploys nothing. A reviewer is a key (`Principal.actor`):
several reviewers of one item are kept apart, one review per key per item; a second
submission by the same key replaces its first, and the audit log keeps the one replaced.

Agreement and a run read with expert verdicts are `mint.services.agreement`; reviews'
corrections become data and tasks in `mint.services.evals.review_mining`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, exists, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mint.chat.messages import message_text
from mint.chat.rows import validate_chat_row
from mint.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from mint.evals.benchmark import BenchmarkTask
from mint.evals.graders import GraderSpec
from mint.evals.graders.judge import JudgeConfig
from mint.schemas.reviews import MAX_REVIEW_BYTES, ItemSnapshot, QueueFilters, ReviewCreate, ReviewQueueCreate
from mint.services import benchmarks, catalog
from mint.services.audit import record_audit
from mint.services.auth import all_api_keys
from mint.services.principal import Principal
from mint.services.serving.captures import feedback_of, json_bytes
from mint.storage.objects import ObjectStore
from mint.storage.queries import PageResult, get_owned, owned_by, paginate
from mint.storage.tables import Capture, EvalRun, Review, ReviewItem, ReviewQueue, Trajectory, new_id, utcnow

# Queue filters that read a grade: captures have none.
_GRADE_FILTERS = ("failed", "disagree_with_run", "disagree_graders", "judge_margin")


@dataclass(frozen=True)
class Candidate:
    """An item the filters kept, before it is written: its source, snapshot and why it was chosen."""

    source_id: str
    task_id: str
    snapshot: ItemSnapshot
    reasons: list[str]


# ---- what a grade says, grader by grader -------------------------------------------------------


def grader_views(grader: GraderSpec, record: dict[str, Any] | None, passed: bool, score: float) -> list[dict[str, Any]]:
    """Each grader of a recorded grade with its verdict: `overall` (the grade itself), then each
    part of a composite grade as `<index>:<type>`; a judge with its model, its pass threshold
    and whether its reply gave a verdict at all."""
    record = record or {}
    views = [_view("overall", grader, record, passed, score)]
    parts = record.get("parts") or []
    specs = grader.parsed_config.specs
    for index, part in enumerate(parts):
        spec = specs[index] if index < len(specs) else None
        grade = part.get("grade") or {}
        name = f"{index}:{part.get('type')}"
        if spec is not None:
            views.append(_view(name, spec, grade, bool(grade.get("passed")), float(grade.get("score", 0.0))))
    return views


def _view(name: str, spec: GraderSpec, grade: dict[str, Any], passed: bool, score: float) -> dict[str, Any]:
    view: dict[str, Any] = {"name": name, "type": spec.type, "passed": passed, "score": score}
    config = spec.parsed_config
    if isinstance(config, JudgeConfig):
        verdict = grade.get("judge") or {}
        view |= {
            "model": config.model,
            "pass_threshold": config.pass_threshold,
            "no_verdict": verdict.get("verdict") is None,
        }
    return view


def _rubric(task: BenchmarkTask) -> list[str]:
    """The criteria a reviewer marks: the task's `metadata.rubric` (a list of criteria), else the
    non-empty lines of its judge's rubric (a composite's included), else none."""
    listed = task.metadata.get("rubric")
    if isinstance(listed, list) and all(isinstance(item, str) for item in listed):
        return [item.strip() for item in listed if item.strip()][:50]
    for spec in task.grader.specs():
        if isinstance(spec.parsed_config, JudgeConfig):
            lines = [line.strip().lstrip("-*").strip() for line in spec.parsed_config.rubric.splitlines()]
            return [line for line in lines if line][:50]
    return []


# ---- choosing the items ------------------------------------------------------------------------


def _trajectory_snapshot(run: EvalRun, task: BenchmarkTask | None, row: Trajectory) -> ItemSnapshot:
    prompt = task.messages if task is not None else []
    graders = grader_views(task.grader, row.grade, row.passed, row.score) if task is not None else []
    return ItemSnapshot(
        kind="trajectory",
        task_id=row.task_id,
        model=run.model_ref,
        messages=list(row.messages),
        prompt_length=len(prompt),
        tools=task.tools if task is not None else None,
        environment=task.model_dump(mode="json")["environment"] if task is not None else None,
        output=row.output,
        reference=task.reference if task is not None else None,
        solution=task.solution if task is not None else None,
        grader=task.grader.model_dump(mode="json") if task is not None else None,
        grade=row.grade,
        graders=graders,
        score=row.score,
        passed=row.passed,
        error=row.error,
        split=task.split if task is not None else None,
        rubric=_rubric(task) if task is not None else [],
        eval_run_id=run.id,
    )


def _by_type(snapshot: ItemSnapshot, grader_type: str) -> dict[str, Any] | None:
    """The first grader of the snapshot's grade of `grader_type`, a composite's parts before the whole."""
    views = snapshot.graders
    parts = [view for view in views[1:] if view["type"] == grader_type]
    if parts:
        return parts[0]
    return views[0] if views and views[0]["type"] == grader_type else None


def _trajectory_reasons(
    snapshot: ItemSnapshot, filters: QueueFilters, other: dict[str, bool] | None
) -> list[str] | None:
    """Why the filters keep this trajectory (one reason per filter), or None when one refuses it."""
    reasons = []
    if filters.failed is not None:
        if snapshot.passed == filters.failed:
            return None
        reasons.append("failed" if filters.failed else "passed")
    if filters.score is not None:
        band = filters.score
        view = _by_type(snapshot, band.grader) if band.grader is not None else None
        score = view["score"] if view is not None else (snapshot.score if band.grader is None else None)
        if score is None or not band.min <= score <= band.max:
            return None
        reasons.append(f"{band.grader or 'score'} {score:g} in [{band.min:g}, {band.max:g}]")
    if other is not None:
        theirs = other.get(snapshot.task_id)
        if theirs is None or theirs == snapshot.passed:
            return None
        reasons.append(f"the other run {'passed' if theirs else 'failed'} it")
    if filters.disagree_graders is not None:
        a, b = (_by_type(snapshot, name) for name in filters.disagree_graders)
        if a is None or b is None or a["passed"] == b["passed"]:
            return None
        reasons.append(f"{a['name']} {'passed' if a['passed'] else 'failed'}, {b['name']} did not")
    if filters.judge_margin is not None:
        judges = [view for view in snapshot.graders if view["type"] == "judge"]
        unsure = [
            view
            for view in judges
            if view["no_verdict"] or abs(view["score"] - view["pass_threshold"]) <= filters.judge_margin
        ]
        if not unsure:
            return None
        view = unsure[0]
        reasons.append(
            f"judge {view['name']} gave no verdict"
            if view["no_verdict"]
            else f"judge {view['name']} within {filters.judge_margin:g} of its threshold"
        )
    if filters.label is not None:
        if snapshot.split != filters.label:
            return None
        reasons.append(f"split {filters.label}")
    return reasons


def _run_candidates(
    session: Session, store: ObjectStore, organization_id: str, run: EvalRun, filters: QueueFilters
) -> Iterator[Candidate]:
    other: dict[str, bool] | None = None
    if filters.disagree_with_run is not None:
        param = "filters.disagree_with_run"
        theirs = catalog.succeeded_run(
            catalog.get_eval_run(session, organization_id, filters.disagree_with_run, param=param), param
        )
        if theirs.benchmark_version_id != run.benchmark_version_id or theirs.id == run.id:
            raise InvalidRequest(
                f"eval run {theirs.id} is not another run of the benchmark version eval run {run.id} evaluated: "
                "a disagreement is between two runs' grades of the same tasks",
                param=param,
            )
        other = dict(
            session.execute(
                select(Trajectory.task_id, Trajectory.passed).where(Trajectory.eval_run_id == theirs.id)
            ).all()
        )
    tasks = {task.id: task for task in benchmarks.load_tasks(store, run.config["object_key"], run.config["sha256"])}
    rows = session.execute(
        select(Trajectory).where(Trajectory.eval_run_id == run.id).order_by(Trajectory.created_at, Trajectory.id)
    ).scalars()
    for row in rows:
        snapshot = _trajectory_snapshot(run, tasks.get(row.task_id), row)
        reasons = _trajectory_reasons(snapshot, filters, other)
        if reasons is not None:
            yield Candidate(row.id, row.task_id, snapshot, reasons)


def _capture_snapshot(capture: Capture, given: Sequence[Any]) -> ItemSnapshot:
    request = capture.request
    prompt = request.get("messages") or [{"role": "user", "content": str(request.get("prompt", ""))}]
    choice = (capture.response.get("choices") or [{}])[0]
    answer = choice.get("message") or {"role": "assistant", "content": choice.get("text", "")}
    scores = [entry.score for entry in given if entry.score is not None]
    return ItemSnapshot(
        kind="capture",
        task_id=capture.id,
        model=capture.model_ref,
        messages=[*prompt, answer],
        prompt_length=len(prompt),
        tools=request.get("tools"),
        output=message_text(answer),
        score=scores[-1] if scores else None,
        feedback=[
            {"score": e.score, "label": e.label, "comment": e.comment, "correction": e.correction, "by": e.created_by}
            for e in given
        ],
        deployment_id=capture.deployment_id,
    )


def _capture_candidates(
    session: Session, organization_id: str, deployment_ref: str, filters: QueueFilters
) -> Iterator[Candidate]:
    for name in _GRADE_FILTERS:
        if getattr(filters, name) is not None:
            raise InvalidRequest(
                f"filters.{name} reads an eval run's grades, and captures have none: filter captures by "
                "score (their latest feedback score), label (a label of their feedback) or sample_rate",
                param=f"filters.{name}",
            )
    if filters.score is not None and filters.score.grader is not None:
        raise InvalidRequest(
            "a capture's score is its feedback's: leave score.grader out", param="filters.score.grader"
        )
    deployment = catalog.get_deployment(session, organization_id, deployment_ref)
    rows = list(
        session.execute(
            select(Capture).where(Capture.deployment_id == deployment.id).order_by(Capture.created_at, Capture.id)
        ).scalars()
    )
    given = feedback_of(session, [row.id for row in rows])
    for row in rows:
        snapshot = _capture_snapshot(row, given[row.id])
        reasons = []
        if filters.score is not None:
            band = filters.score
            if snapshot.score is None or not band.min <= snapshot.score <= band.max:
                continue
            reasons.append(f"feedback score {snapshot.score:g} in [{band.min:g}, {band.max:g}]")
        if filters.label is not None:
            if filters.label not in {entry.label for entry in given[row.id]}:
                continue
            reasons.append(f"label {filters.label}")
        yield Candidate(row.id, row.id, snapshot, reasons)


def _sampled(candidates: Iterator[Candidate], filters: QueueFilters, limit: int) -> list[Candidate]:
    """What the draw keeps (each candidate at `sample_rate`, from `seed`), at most `limit`, in order."""
    draw = random.Random(filters.seed)
    kept = []
    for candidate in candidates:
        if filters.sample_rate is not None:
            if draw.random() >= filters.sample_rate:
                continue
            candidate.reasons.append(f"sampled at {filters.sample_rate:g}")
        kept.append(candidate)
        if len(kept) >= limit:
            break
    return kept


def _assignees(session: Session, organization_id: str, key_ids: list[str]) -> list[str]:
    keys = {key.id: key for key in all_api_keys(session, organization_id)}
    for index, key_id in enumerate(key_ids):
        key = keys.get(key_id)
        if key is None or key.revoked_at is not None:
            raise InvalidRequest(
                f"{key_id!r} is not a live API key of this organization; list them with GET /v1/api_keys",
                param=f"assignees[{index}]",
            )
    return key_ids


def create_queue(session: Session, store: ObjectStore, principal: Principal, body: ReviewQueueCreate) -> ReviewQueue:
    """A queue of the source's items the filters keep (developer or admin); at least one must match."""
    principal.require("developer")
    organization_id = principal.organization_id
    assignees = _assignees(session, organization_id, body.assignees)
    run = None
    if body.eval_id is not None:
        run = catalog.succeeded_run(
            catalog.get_eval_run(session, organization_id, body.eval_id, param="eval_id"), "eval_id"
        )
        candidates = _run_candidates(session, store, organization_id, run, body.filters)
        deployment_id = None
    else:
        assert body.deployment is not None
        deployment_id = catalog.get_deployment(session, organization_id, body.deployment).id
        candidates = _capture_candidates(session, organization_id, body.deployment, body.filters)
    chosen = _sampled(candidates, body.filters, body.max_items)
    if not chosen:
        source = f"eval run {run.id}" if run is not None else f"deployment {body.deployment!r}"
        raise InvalidRequest(f"no item of {source} matches the filters; widen them", param="filters")
    queue = ReviewQueue(
        id=new_id("rq"),
        organization_id=organization_id,
        name=body.name,
        instructions=body.instructions,
        source="eval_run" if run is not None else "deployment",
        eval_run_id=run.id if run is not None else None,
        deployment_id=deployment_id,
        benchmark_version_id=run.benchmark_version_id if run is not None else None,
        filters=body.filters.model_dump(mode="json", exclude_none=True),
        reviews_per_item=body.reviews_per_item,
        item_count=len(chosen),
        created_by=principal.name,
    )
    session.add(queue)
    session.flush()  # the items' foreign key names it (no ORM relationship orders the inserts)
    for position, candidate in enumerate(chosen):
        session.add(
            ReviewItem(
                id=new_id("ri"),
                organization_id=organization_id,
                queue_id=queue.id,
                position=position,
                source_id=candidate.source_id,
                task_id=candidate.task_id,
                assignee_key_id=assignees[position % len(assignees)] if assignees else None,
                snapshot=candidate.snapshot.model_dump(mode="json"),
                reasons=candidate.reasons,
            )
        )
    session.flush()
    record_audit(session, principal, "review_queue.create", "review_queue", queue.id, {"items": len(chosen)})
    return queue


# ---- reading queues and items ------------------------------------------------------------------


def get_queue(session: Session, organization_id: str, queue_id: str) -> ReviewQueue:
    try:
        return get_owned(session, ReviewQueue, queue_id, organization_id=organization_id, noun="review queue")
    except NotFound as exc:
        raise NotFound(f"{exc.message} List them with GET /v1/reviews/queues.", param="queue_id") from None


def list_queues(session: Session, organization_id: str, *, after: str | None, limit: int) -> PageResult[ReviewQueue]:
    return paginate(session, owned_by(ReviewQueue, organization_id), ReviewQueue, after=after, limit=limit)


def get_item(session: Session, organization_id: str, item_id: str) -> ReviewItem:
    try:
        return get_owned(session, ReviewItem, item_id, organization_id=organization_id, noun="review item")
    except NotFound as exc:
        raise NotFound(exc.message, param="item_id") from None


def _review_count() -> Any:
    return select(func.count()).select_from(Review).where(Review.item_id == ReviewItem.id).scalar_subquery()


def _reviewed_by(actor: str) -> Any:
    return exists().where(Review.item_id == ReviewItem.id, Review.reviewer == actor)


def _todo(queue: ReviewQueue, principal: Principal) -> Any:
    """Items left for the caller: open or assigned to its key, not done, not reviewed by it."""
    return and_(
        or_(ReviewItem.assignee_key_id.is_(None), ReviewItem.assignee_key_id == principal.key_id),
        _review_count() < queue.reviews_per_item,
        ~_reviewed_by(principal.actor),
    )


def list_items(
    session: Session,
    principal: Principal,
    queue: ReviewQueue,
    *,
    status: str,
    assignee: str | None,
    after: str | None,
    limit: int,
) -> PageResult[ReviewItem]:
    """A page of the queue's items in queue order: `all`, `todo` (left for the caller),
    `reviewed` (one review or more) or `done` (`reviews_per_item` reviews)."""
    query = select(ReviewItem).where(ReviewItem.queue_id == queue.id)
    if status == "todo":
        query = query.where(_todo(queue, principal))
    elif status == "reviewed":
        query = query.where(_review_count() >= 1)
    elif status == "done":
        query = query.where(_review_count() >= queue.reviews_per_item)
    if assignee is not None:
        query = query.where(ReviewItem.assignee_key_id == assignee)
    if after is not None:
        anchor = session.execute(
            select(ReviewItem.position).where(ReviewItem.queue_id == queue.id, ReviewItem.id == after)
        ).scalar_one_or_none()
        if anchor is None:
            raise InvalidRequest(f"Unknown cursor {after!r}: pass the last id of the previous page.", param="after")
        query = query.where(ReviewItem.position > anchor)
    rows = list(session.execute(query.order_by(ReviewItem.position).limit(limit + 1)).scalars())
    return PageResult(rows=rows[:limit], has_more=len(rows) > limit)


def progress(session: Session, principal: Principal, queue: ReviewQueue) -> dict[str, int]:
    """How far the queue is: items, reviewed, done, reviews, and the caller's own part."""

    def count(*where: Any) -> int:
        query = select(func.count()).select_from(ReviewItem).where(ReviewItem.queue_id == queue.id, *where)
        return int(session.execute(query).scalar_one())

    reviews = session.execute(
        select(func.count())
        .select_from(Review)
        .join(ReviewItem, ReviewItem.id == Review.item_id)
        .where(ReviewItem.queue_id == queue.id)
    ).scalar_one()
    return {
        "items": queue.item_count,
        "reviewed": count(_review_count() >= 1),
        "done": count(_review_count() >= queue.reviews_per_item),
        "reviews": int(reviews),
        "mine": count(_reviewed_by(principal.actor)),
        "todo": count(_todo(queue, principal)),
    }


def assign_item(session: Session, principal: Principal, item_id: str, assignee: str | None) -> ReviewItem:
    """Deal an item to a key (developer or admin), or open it to anyone (None)."""
    principal.require("developer")
    item = get_item(session, principal.organization_id, item_id)
    if assignee is not None:
        _assignees(session, principal.organization_id, [assignee])
    before = item.assignee_key_id
    item.assignee_key_id = assignee
    record_audit(session, principal, "review_item.assign", "review_item", item.id, {"from": before, "to": assignee})
    return item


# ---- reviewing ---------------------------------------------------------------------------------


def _check_correction(snapshot: ItemSnapshot, body: ReviewCreate) -> dict[str, Any] | None:
    if body.correction is None:
        return None
    start, messages = body.correction.from_message, body.correction.messages
    if not snapshot.prompt_length <= start <= len(snapshot.messages):
        raise InvalidRequest(
            "correction.from_message is the index of the model's message where it went wrong: from "
            f"{snapshot.prompt_length} (the model's first turn) to {len(snapshot.messages)} (after its last), "
            f"not {start}",
            param="correction.from_message",
        )
    if start < len(snapshot.messages) and snapshot.messages[start].get("role") != "assistant":
        raise InvalidRequest(
            f"message {start} is a {snapshot.messages[start].get('role')} message; a correction starts at one of the "
            "model's (assistant) messages",
            param="correction.from_message",
        )
    roles = {message.get("role") for message in messages}
    if not roles <= {"assistant", "tool"}:
        raise InvalidRequest(
            "a correction rewrites the model's part: assistant messages, and tool results answering its calls",
            param="correction.messages",
        )
    row: dict[str, Any] = {"messages": [*snapshot.messages[:start], *messages]}
    if snapshot.tools:
        row["tools"] = snapshot.tools
    errors = validate_chat_row(row)
    if errors or messages[-1].get("role") != "assistant":
        problems = "; ".join(errors[:3]) or "it must end with an assistant message"
        raise InvalidRequest(f"the corrected trajectory is not a valid conversation: {problems}", param="correction")
    return {"from_message": start, "messages": messages}


def submit_review(session: Session, principal: Principal, item_id: str, body: ReviewCreate) -> Review:
    """Record the caller's review of an item, replacing its earlier one (kept in the audit log)."""
    item = get_item(session, principal.organization_id, item_id)
    if item.assignee_key_id is not None and item.assignee_key_id != principal.key_id:
        raise PermissionDenied(
            f"review item {item.id} is assigned to key {item.assignee_key_id}; review the items assigned to your key "
            "or open ones (GET /v1/reviews/queues/{queue_id}/items?status=todo)"
        )
    snapshot = ItemSnapshot.model_validate(item.snapshot)
    unknown = sorted(set(body.rubric) - set(snapshot.rubric))
    if unknown:
        have = "; ".join(snapshot.rubric) or "none (this task has no rubric)"
        raise InvalidRequest(f"rubric criterion {unknown[0]!r} is not one of this item's: {have}", param="rubric")
    correction = _check_correction(snapshot, body)
    fields = {
        "passed": body.passed,
        "score": body.score,
        "rubric": {name: mark.model_dump(exclude_none=True) for name, mark in body.rubric.items()},
        "comment": body.comment,
        "correction": correction,
    }
    size = json_bytes(fields)
    if size > MAX_REVIEW_BYTES:
        raise InvalidRequest(
            f"a review is at most {MAX_REVIEW_BYTES // 1024} KiB of JSON; this one is {size} bytes: rewrite only the "
            "turns that went wrong",
            param="correction" if correction is not None else "comment",
        )
    review = session.execute(
        select(Review).where(Review.item_id == item.id, Review.reviewer == principal.actor)
    ).scalar_one_or_none()
    action = "review.submit"
    if review is None:
        review = Review(
            id=new_id("rev"), organization_id=item.organization_id, item_id=item.id, reviewer=principal.actor
        )
        session.add(review)
    else:
        action = "review.replace"
        replaced = {name: getattr(review, name) for name in fields}
        record_audit(session, principal, "review.replaced", "review", review.id, {"item": item.id, "was": replaced})
    review.reviewer_name = principal.name
    for name, value in fields.items():
        setattr(review, name, value)
    review.updated_at = utcnow()
    try:
        session.flush()
    except IntegrityError:
        raise Conflict("this key reviewed the item at the same moment in another request; send it again") from None
    record_audit(
        session, principal, action, "review", review.id, {"item": item.id, "passed": body.passed, "score": body.score}
    )
    return review


def snapshot_of(item: ReviewItem) -> ItemSnapshot:
    return ItemSnapshot.model_validate(item.snapshot)

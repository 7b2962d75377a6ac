"""Expert review: queues over eval runs' trajectories and deployments' captures, reviews of
their items, agreement (between reviewers, and of each grader with them), a run read with
expert verdicts, and corrections mined into datasets and benchmark tasks.

Developers and admins make queues, deal items and mine; any key of the organization, viewers
included, reviews (`POST /v1/reviews/items/{item_id}/reviews`), so an expert's key can judge
and read but train and deploy nothing. One review per key per item: a second replaces the
first (the audit log keeps the one replaced).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Path, Query

from mint.api.deps import CurrentPrincipal, SessionDep, SettingsDep
from mint.api.pagination import After, Limit, id_path, page_from
from mint.api.routes.benchmarks import BenchmarkId
from mint.api.routes.evals import EvalId, mined_dataset
from mint.schemas.common import ID_PATTERN, MAX_VERSION, Page
from mint.schemas.evals import BenchmarkVersionPublic, MinedDatasetPublic
from mint.schemas.reviews import (
    DEFAULT_AGREEMENT_THRESHOLD,
    AgreementReport,
    BenchmarkFromReviews,
    DatasetFromReviews,
    ItemAssign,
    ItemStatus,
    QueueProgress,
    ReviewCreate,
    ReviewItemPublic,
    ReviewPublic,
    ReviewQueueCreate,
    ReviewQueuePublic,
    RunWithExperts,
)
from mint.services import agreement
from mint.services.evals import review_mining, reviews
from mint.services.principal import Principal
from mint.storage.objects import object_store_for
from mint.storage.tables import BenchmarkVersion, ReviewItem, ReviewQueue

router = APIRouter(prefix="/v1/reviews", tags=["reviews"])

QueueId = Annotated[str, id_path("The review queue's id, e.g. `rq_...`.")]
ItemId = Annotated[str, id_path("The review item's id, e.g. `ri_...`.")]
Threshold = Annotated[
    float,
    Query(ge=0, le=1, description="Agreement (Krippendorff's alpha) below which a grader is flagged."),
]
REVIEW_ROUTE = "/v1/reviews/items/{item_id}/reviews"


def _queue(session: SessionDep, principal: Principal, queue: ReviewQueue) -> ReviewQueuePublic:
    progress = QueueProgress.model_validate(reviews.progress(session, principal, queue))
    return ReviewQueuePublic.model_validate(queue).model_copy(update={"progress": progress})


def _items(session: SessionDep, rows: Sequence[ReviewItem]) -> list[ReviewItemPublic]:
    given = agreement.reviews_of(session, [row.id for row in rows])
    return [
        ReviewItemPublic.model_validate(row).model_copy(
            update={"reviews": [ReviewPublic.model_validate(review) for review in given[row.id]]}
        )
        for row in rows
    ]


@router.post("/queues", response_model=ReviewQueuePublic, status_code=201)
def create_queue(
    body: ReviewQueueCreate, session: SessionDep, settings: SettingsDep, principal: CurrentPrincipal
) -> ReviewQueuePublic:
    """A queue of the source's items that the filters keep, each with a snapshot of what a
    reviewer reads; items dealt to `assignees` in turn, or open. Developer or admin."""
    queue = reviews.create_queue(session, object_store_for(settings), principal, body)
    return _queue(session, principal, queue)


@router.get("/queues", response_model=Page[ReviewQueuePublic])
def list_queues(
    session: SessionDep, principal: CurrentPrincipal, after: After = None, limit: Limit = 20
) -> Page[ReviewQueuePublic]:
    """This organization's review queues, newest first."""
    result = reviews.list_queues(session, principal.organization_id, after=after, limit=limit)
    return page_from([ReviewQueuePublic.model_validate(row) for row in result.rows], result.has_more, ReviewQueuePublic)


@router.get("/queues/{queue_id}", response_model=ReviewQueuePublic)
def get_queue(queue_id: QueueId, session: SessionDep, principal: CurrentPrincipal) -> ReviewQueuePublic:
    """A queue with its progress: items reviewed and done, and what is left for the caller."""
    return _queue(session, principal, reviews.get_queue(session, principal.organization_id, queue_id))


@router.get("/queues/{queue_id}/items", response_model=Page[ReviewItemPublic])
def list_items(
    queue_id: QueueId,
    session: SessionDep,
    principal: CurrentPrincipal,
    status: Annotated[
        ItemStatus,
        Query(description="todo: left for the caller; reviewed: one review or more; done: all the reviews wanted."),
    ] = "all",
    assignee: Annotated[
        str | None, Query(max_length=100, pattern=ID_PATTERN, description="Only items dealt to this key.")
    ] = None,
    after: After = None,
    limit: Limit = 20,
) -> Page[ReviewItemPublic]:
    """A page of the queue's items in queue order, each with its snapshot and its reviews."""
    queue = reviews.get_queue(session, principal.organization_id, queue_id)
    result = reviews.list_items(session, principal, queue, status=status, assignee=assignee, after=after, limit=limit)
    return page_from(_items(session, result.rows), result.has_more, ReviewItemPublic)


@router.get("/queues/{queue_id}/agreement", response_model=AgreementReport)
def queue_agreement(
    queue_id: QueueId,
    session: SessionDep,
    principal: CurrentPrincipal,
    threshold: Threshold = DEFAULT_AGREEMENT_THRESHOLD,
) -> AgreementReport:
    """How the queue's reviewers agree (Krippendorff's alpha, and the share agreeing), and how
    each grader of the run agrees with their verdicts; judges below `threshold` flagged."""
    queue = reviews.get_queue(session, principal.organization_id, queue_id)
    return agreement.queue_report(session, queue, threshold=threshold)


@router.post("/queues/{queue_id}/dataset", response_model=MinedDatasetPublic, status_code=201)
def dataset_from_reviews(
    queue_id: QueueId, body: DatasetFromReviews, session: SessionDep, settings: SettingsDep, principal: CurrentPrincipal
) -> MinedDatasetPublic:
    """Mine the queue's corrections into SFT rows, DPO pairs (the correction over the model's
    turn) or RL prompts, each naming its review and reviewer in `metadata.lineage`."""
    queue = reviews.get_queue(session, principal.organization_id, queue_id)
    dataset, result = review_mining.dataset_from_reviews(session, object_store_for(settings), principal, queue, body)
    return mined_dataset(dataset, result)


@router.post("/queues/{queue_id}/benchmark_version", response_model=BenchmarkVersionPublic, status_code=201)
def benchmark_from_reviews(
    queue_id: QueueId,
    body: BenchmarkFromReviews,
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
) -> BenchmarkVersion:
    """The benchmark's next version: its newest tasks and each correction as a task under
    `split` (default `expert`), its reviewer in the task's `metadata.lineage`."""
    queue = reviews.get_queue(session, principal.organization_id, queue_id)
    version, _ = review_mining.benchmark_from_reviews(session, object_store_for(settings), principal, queue, body)
    return version


@router.get("/items/{item_id}", response_model=ReviewItemPublic)
def get_item(item_id: ItemId, session: SessionDep, principal: CurrentPrincipal) -> ReviewItemPublic:
    (public,) = _items(session, [reviews.get_item(session, principal.organization_id, item_id)])
    return public


@router.patch("/items/{item_id}", response_model=ReviewItemPublic)
def assign_item(
    item_id: ItemId, body: ItemAssign, session: SessionDep, principal: CurrentPrincipal
) -> ReviewItemPublic:
    """Deal the item to an API key, or open it to anyone (`assignee: null`). Developer or admin."""
    (public,) = _items(session, [reviews.assign_item(session, principal, item_id, body.assignee)])
    return public


@router.post("/items/{item_id}/reviews", response_model=ReviewPublic, status_code=201)
def submit_review(
    item_id: ItemId, body: ReviewCreate, session: SessionDep, principal: CurrentPrincipal
) -> ReviewPublic:
    """Judge an item: a verdict (`passed`, `score` or both), marks per rubric criterion, a
    comment, and perhaps a correction (the messages from `from_message` on, rewritten). Any key
    of the organization, viewers included; a second review by the same key replaces its first.
    An item assigned to a key is reviewed by that key only."""
    return ReviewPublic.model_validate(reviews.submit_review(session, principal, item_id, body))


@router.get("/runs/{eval_id}", response_model=RunWithExperts)
def run_with_experts(eval_id: EvalId, session: SessionDep, principal: CurrentPrincipal) -> RunWithExperts:
    """An eval run read with expert verdicts: where the reviewers of its trajectories settled
    (a majority), their verdict overrides the grader's; both are kept, and the difference shown."""
    return agreement.run_with_experts(session, principal.organization_id, eval_id)


@router.get("/benchmarks/{benchmark_id}/versions/{version}/agreement", response_model=AgreementReport)
def version_agreement(
    benchmark_id: BenchmarkId,
    version: Annotated[int, Path(ge=1, le=MAX_VERSION, description="The version number, from 1.")],
    session: SessionDep,
    principal: CurrentPrincipal,
    threshold: Threshold = DEFAULT_AGREEMENT_THRESHOLD,
) -> AgreementReport:
    """Agreement over every queue on runs of one benchmark version: the reviewers', and each
    grader's (judges included) with the experts."""
    return agreement.version_report(session, principal.organization_id, benchmark_id, version, threshold=threshold)

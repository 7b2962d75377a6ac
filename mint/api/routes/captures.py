"""Captured completions, feedback on them, and production mined into data and benchmark tasks.

A deployment whose capture rate is set (`PATCH /v1/deployments/{id}/capture`) records a share of
the requests it serves; each capture's id is its completion's, so whoever holds an answer can
read its record and say what was wrong with it. Feedback is the one write a viewer key may make:
the people who read answers are the ones who can judge them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter

from mint.api.deps import CurrentPrincipal, QuotasDep, SessionDep, SettingsDep
from mint.api.pagination import id_path
from mint.api.routes.benchmarks import BenchmarkId
from mint.api.routes.evals import mined_dataset
from mint.schemas.captures import (
    BenchmarkFromCaptures,
    CapturePublic,
    DatasetFromCaptures,
    FeedbackCreate,
    FeedbackPublic,
)
from mint.schemas.evals import BenchmarkVersionPublic, MinedDatasetPublic
from mint.services.serving import captures, production
from mint.storage.objects import object_store_for
from mint.storage.tables import BenchmarkVersion, Capture

router = APIRouter(tags=["captures"])

CompletionId = Annotated[str, id_path("The completion's id, e.g. `chatcmpl-...`.")]
FEEDBACK_ROUTE = "/v1/captures/{completion_id}/feedback"


def with_feedback(session: SessionDep, rows: Sequence[Capture]) -> list[CapturePublic]:
    """Captures as the API shows them, each with its feedback, oldest first."""
    given = captures.feedback_of(session, [row.id for row in rows])
    return [
        CapturePublic.model_validate(row).model_copy(
            update={"feedback": [FeedbackPublic.model_validate(entry) for entry in given[row.id]]}
        )
        for row in rows
    ]


@router.get("/v1/captures/{completion_id}", response_model=CapturePublic)
def get_capture(completion_id: CompletionId, session: SessionDep, principal: CurrentPrincipal) -> CapturePublic:
    """A captured completion: the request, the answer, the version that gave it, tokens, latency
    and feedback."""
    (public,) = with_feedback(session, [captures.get_capture(session, principal.organization_id, completion_id)])
    return public


@router.post("/v1/captures/{completion_id}/feedback", response_model=FeedbackPublic, status_code=201)
def add_feedback(
    completion_id: CompletionId,
    body: FeedbackCreate,
    session: SessionDep,
    principal: CurrentPrincipal,
    quotas: QuotasDep,
) -> FeedbackPublic:
    """Say how good a captured answer was (a score from 0 to 1, a label, a comment) and what it
    should have been (`correction`). Any key of the organization, viewers included. At most
    64 KiB of JSON per feedback (400 past it) and 20 per capture (409); feedback counts against
    the organization's capture storage quota (429 past it). A completion that was not captured
    is a 404 saying why."""
    feedback = captures.add_feedback(
        session,
        principal,
        completion_id,
        score=body.score,
        label=body.label,
        comment=body.comment,
        correction=body.correction,
        quotas=quotas,
    )
    return FeedbackPublic.model_validate(feedback)


@router.post("/v1/datasets/from-captures", response_model=MinedDatasetPublic, status_code=201, tags=["datasets"])
def dataset_from_captures(
    body: DatasetFromCaptures, session: SessionDep, settings: SettingsDep, principal: CurrentPrincipal
) -> MinedDatasetPublic:
    """Mine a deployment's corrected captures into SFT rows (ending in the correction), DPO pairs
    (the correction preferred over what was served) or RL prompts (the correction as reference)."""
    dataset, result = production.dataset_from_captures(session, object_store_for(settings), principal, body)
    return mined_dataset(dataset, result)


@router.post(
    "/v1/benchmarks/{benchmark_id}/versions/from-captures",
    response_model=BenchmarkVersionPublic,
    status_code=201,
    tags=["benchmarks"],
)
def benchmark_from_captures(
    benchmark_id: BenchmarkId,
    body: BenchmarkFromCaptures,
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
) -> BenchmarkVersion:
    """The benchmark's next version: its newest tasks, and each corrected capture of the
    deployment as a task (the request, the correction as reference, graded `normalized`) under
    `split`, so the ruler grows with what users ask."""
    version, _ = production.benchmark_from_captures(session, object_store_for(settings), principal, benchmark_id, body)
    return version

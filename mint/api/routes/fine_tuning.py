"""Fine-tuning jobs, OpenAI-shaped: the official `openai` client's `fine_tuning.jobs` works as is.

Creating a job checks its files and hyperparameters, records it and sends it to the queue
of the workers that hold its base model. `Idempotency-Key` makes a retried create return
the first job.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query

from mint.api.deps import CurrentPrincipal, DispatchDep, OptionalDispatchDep, QuotasDep, SessionDep
from mint.api.pagination import After, Limit, id_path, page_from
from mint.schemas.common import ID_PATTERN, Page
from mint.schemas.fine_tuning import (
    EventPage,
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobCreate,
    FineTuningJobEvent,
    JobEstimate,
)
from mint.schemas.job_spec import JobSpec
from mint.services import auth
from mint.services.billing import spend
from mint.services.jobs import checkpoints, checks, events, fine_tuning, versions, views
from mint.storage.tables import TrainingJob

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["fine-tuning"])

JobId = Annotated[str, id_path("The job's id, e.g. `ftjob_...`.")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=200,
        pattern=ID_PATTERN,
        description="Retrying a create with the same key returns the same job.",
    ),
]
EventCursor = Annotated[
    str | None, Query(max_length=30, pattern=r"^\d+$", description="Cursor: the last event id of the previous page.")
]


def job_public(session: SessionDep, job: TrainingJob) -> FineTuningJob:
    stages = versions.stage_versions_of(session, job) if JobSpec.model_validate(job.spec).chained else None
    return FineTuningJob.model_validate(views.job_view(job, versions.fine_tuned_model_of(session, job), stages))


@router.post("", response_model=FineTuningJob, status_code=200)
def create_job(
    body: FineTuningJobCreate,
    session: SessionDep,
    dispatch: DispatchDep,
    quotas: QuotasDep,
    principal: CurrentPrincipal,
    idempotency_key: IdempotencyKey = None,
) -> FineTuningJob:
    """Start a supervised, DPO or reinforcement job on a base model's training workers, or a
    chain of them (`stages`), optionally warm-started from an adapter version (`from_adapter`).
    An organization at its jobs quota gets a 429; a job whose estimate passes its `budget_usd` or
    a spend limit of the organization gets a 402 that gives both."""
    job = fine_tuning.create_job(
        session, principal, body, send=dispatch, quotas=quotas, idempotency_key=idempotency_key
    )
    return job_public(session, job)


@router.post("/estimate", response_model=JobEstimate)
def estimate_job(body: FineTuningJobCreate, session: SessionDep, principal: CurrentPrincipal) -> JobEstimate:
    """What a create request would use and cost (tokens, steps, seconds, USD), from a cost model
    calibrated on the jobs this deployment's workers finished, and the most the job may cost
    under its budget and the organization's spend limits. Checks the request as a create does;
    records nothing."""
    checked = checks.check_job(session, principal.organization_id, body)
    organization = auth.get_organization(session, principal.organization_id)
    allowance = spend.allowance_at_create(session, organization, body.budget_usd)
    return JobEstimate(
        model=checked.base.name,
        **checked.estimate.public(),
        prices=checked.estimate.prices,
        allowed_usd=None if allowance is None else round(allowance.usd, 6),
        limited_by=None if allowance is None else allowance.source,
    )


@router.get("", response_model=Page[FineTuningJob])
def list_jobs(
    session: SessionDep, principal: CurrentPrincipal, after: After = None, limit: Limit = 20
) -> Page[FineTuningJob]:
    """Jobs of this organization, newest first."""
    result = fine_tuning.list_jobs(session, principal.organization_id, after=after, limit=limit)
    return page_from([job_public(session, job) for job in result.rows], result.has_more, FineTuningJob)


@router.get("/{job_id}", response_model=FineTuningJob)
def get_job(job_id: JobId, session: SessionDep, principal: CurrentPrincipal) -> FineTuningJob:
    return job_public(session, fine_tuning.get_job(session, principal.organization_id, job_id))


@router.post("/{job_id}/cancel", response_model=FineTuningJob)
def cancel_job(
    job_id: JobId, session: SessionDep, principal: CurrentPrincipal, send: OptionalDispatchDep
) -> FineTuningJob:
    """Cancel a queued job at once, or a running one after its current optimizer step."""
    return job_public(session, fine_tuning.cancel_job(session, principal, job_id, send))


@router.get("/{job_id}/events", response_model=EventPage)
def list_events(
    job_id: JobId,
    session: SessionDep,
    principal: CurrentPrincipal,
    after: EventCursor = None,
    limit: Limit = 20,
) -> EventPage:
    """Messages and metrics (loss, learning rate, tokens/s, reward), newest first."""
    job = fine_tuning.get_job(session, principal.organization_id, job_id)
    rows, has_more = events.list_events(session, job, after=after, limit=limit)
    data = [FineTuningJobEvent.model_validate({**_columns(row), "id": str(row.id)}) for row in rows]
    return EventPage(data=data, has_more=has_more)


@router.get("/{job_id}/checkpoints", response_model=Page[FineTuningJobCheckpoint])
def list_checkpoints(job_id: JobId, session: SessionDep, principal: CurrentPrincipal) -> Page[FineTuningJobCheckpoint]:
    """Resumable checkpoints of the job, newest first."""
    job = fine_tuning.get_job(session, principal.organization_id, job_id)
    data = [
        FineTuningJobCheckpoint(
            id=row.id,
            created_at=row.created_at,
            fine_tuned_model_checkpoint=f"{job.id}:step-{row.step}",
            fine_tuning_job_id=job.id,
            metrics={"step": row.step, **row.metrics},
            step_number=row.step,
        )
        for row in checkpoints.list_checkpoints(session, job)
    ]
    return page_from(data, False, FineTuningJobCheckpoint)


def _columns(row: Any) -> dict[str, Any]:
    return {column: getattr(row, column) for column in ("created_at", "level", "message", "type", "data")}

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
)
from mint.services import fine_tuning
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


def _view(session: SessionDep, job: TrainingJob) -> FineTuningJob:
    stages = fine_tuning.stage_versions_of(session, job) if "stages" in job.spec else None
    return FineTuningJob.model_validate(
        fine_tuning.job_view(job, fine_tuning.fine_tuned_model_of(session, job), stages)
    )


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
    An organization at its jobs quota gets a 429."""
    job = fine_tuning.create_job(
        session, principal, body, send=dispatch, quotas=quotas, idempotency_key=idempotency_key
    )
    return _view(session, job)


@router.get("", response_model=Page[FineTuningJob])
def list_jobs(
    session: SessionDep, principal: CurrentPrincipal, after: After = None, limit: Limit = 20
) -> Page[FineTuningJob]:
    """Jobs of this organization, newest first."""
    result = fine_tuning.list_jobs(session, principal.organization_id, after=after, limit=limit)
    return page_from([_view(session, job) for job in result.rows], result.has_more, FineTuningJob)


@router.get("/{job_id}", response_model=FineTuningJob)
def get_job(job_id: JobId, session: SessionDep, principal: CurrentPrincipal) -> FineTuningJob:
    return _view(session, fine_tuning.get_job(session, principal.organization_id, job_id))


@router.post("/{job_id}/cancel", response_model=FineTuningJob)
def cancel_job(
    job_id: JobId, session: SessionDep, principal: CurrentPrincipal, send: OptionalDispatchDep
) -> FineTuningJob:
    """Cancel a queued job at once, or a running one after its current optimizer step."""
    return _view(session, fine_tuning.cancel_job(session, principal, job_id, send))


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
    rows, has_more = fine_tuning.list_events(session, job, after=after, limit=limit)
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
        for row in fine_tuning.list_checkpoints(session, job)
    ]
    return page_from(data, False, FineTuningJobCheckpoint)


def _columns(row: Any) -> dict[str, Any]:
    return {column: getattr(row, column) for column in ("created_at", "level", "message", "type", "data")}

"""How a fine-tuning job ends, and how each of its stages hands on to the next. A finished
stage stores its version (content-addressed) before the one transaction that records it and
moves the job on: to the next stage, cancelled between stages, or succeeded after the last, so
a crash in between redoes the finish, never half of it (`finish_stage`). A job also ends
cancelled after a step (`stop_cancelled`), failed at its budget with its checkpoint kept
(`stop_at_budget`), failed with an error (`fail`, `failure_code`), or failed once its attempts
are spent (`give_up`, `give_up_exhausted`, also the reconciler's). Each end bills what is
unbilled where it can, records an event and sends the job's webhook deliveries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import update
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import InvalidRequest, MintError
from mint.services.billing import prices as pricing
from mint.services.billing import spend
from mint.services.dispatch import Dispatch
from mint.services.jobs.claims import require_ours
from mint.services.jobs.context import JobContext
from mint.services.jobs.events import emit_event
from mint.services.jobs.usage import bill
from mint.services.jobs.versions import register_stage_version, version_archive
from mint.services.leases import WORKER_STOPPED, exhausted, gave_up, held_by
from mint.services.webhooks import events as webhooks
from mint.storage.db import session_scope
from mint.storage.objects import ObjectStore
from mint.storage.queries import rowcount
from mint.storage.tables import TrainingJob, utcnow

if TYPE_CHECKING:
    from mint.services.jobs.context import Training


def finish_stage(
    settings: Settings, store: ObjectStore, context: JobContext, training: Training, send: Dispatch | None
) -> bool:
    """Store the stage's version (an adapter, or a full-parameter stage's whole model), then
    in one transaction record it (with its lineage) and move the job on: to the next stage, or
    succeeded after the last. False when a cancel requested meanwhile stops the job between
    stages."""
    stage = context.stage
    last = stage.number == len(context.stages)
    archive, lora = version_archive(training)
    with session_scope(settings.database) as session:
        job = require_ours(session, context)
        version = register_stage_version(
            session, store, context, job, optimizer_steps=training.step, archive=archive, lora=lora
        )
        ref = f"{context.adapter_name}@{version.version}"
        job.completed_steps, job.trained_tokens = stage.offset + stage.plan.steps, context.trained_tokens
        bill(session, context, ref)
        job.cost_usd = pricing.resource_cost(session, "training_job", job.id)
        context.done[stage.number] = (version.id, context.trained_tokens)
        if not last:
            emit_event(
                session,
                job.id,
                f"Stage {stage.number}/{len(context.stages)} succeeded: {ref} ({training.step} optimizer steps)",
                data={"stage": stage.number, "model": ref, "adapter_version_id": version.id},
            )
            if job.cancel_requested_at is None:
                return True
            job.status, job.finished_at = "cancelled", utcnow()
            emit_event(session, job.id, f"Job cancelled after stage {stage.number}")
            webhooks.job_event(session, job, send, model=ref)
            return False
        job.status, job.finished_at = "succeeded", utcnow()
        job.result_adapter_version_id = version.id
        emit_event(
            session,
            job.id,
            f"Job succeeded: {ref} ({training.step} optimizer steps)",
            data={"model": ref, "adapter_version_id": version.id, **context.label()},
        )
        webhooks.job_event(session, job, send, model=ref)
        return True


def stop_cancelled(settings: Settings, context: JobContext, send: Dispatch | None) -> None:
    """End the job cancelled after its last step (a cancel was requested while it trained)."""
    with session_scope(settings.database) as session:
        job = require_ours(session, context)
        bill(session, context, context.adapter_name)
        job.cost_usd = pricing.resource_cost(session, "training_job", job.id)
        job.status, job.finished_at = "cancelled", utcnow()
        emit_event(session, job.id, f"Job cancelled after step {job.completed_steps}")
        webhooks.job_event(session, job, send)


def stop_at_budget(
    settings: Settings, context: JobContext, step: int, allowance: spend.Allowance, send: Dispatch | None
) -> None:
    """End the job, failed with `budget_exhausted`: its next step would cost more than
    `allowance` leaves. Its checkpoint at `step` was just saved."""
    with session_scope(settings.database) as session:
        job = require_ours(session, context)
        message = (
            f"Stopped at step {step}/{context.total_steps}: it has cost ${job.cost_usd:.4f}, and another step "
            f"would pass the ${allowance.usd:.4f} that {allowance.source} allows. Its checkpoint at step {step} "
            "is kept. Raise the budget or the limit (PATCH /v1/organization/spend_limits), or train fewer steps."
        )
        job.status, job.finished_at = "failed", utcnow()
        job.error = {"code": "budget_exhausted", "message": message, "param": "budget_usd"}
        emit_event(session, job.id, message, level="error", data={"step": step, "allowed_usd": allowance.usd})
        webhooks.job_event(session, job, send)


def fail(
    settings: Settings, job_id: str, worker_id: str, code: str, message: str, send: Dispatch | None = None
) -> None:
    with session_scope(settings.database) as session:
        failed = rowcount(
            session.execute(
                update(TrainingJob)
                .where(*held_by(TrainingJob, job_id, worker_id))
                .values(status="failed", finished_at=utcnow(), error={"code": code, "message": message, "param": None})
            )
        )
        if failed:
            emit_event(session, job_id, f"Job failed: {message}", level="error")
            job = session.get(TrainingJob, job_id)
            assert job is not None
            webhooks.job_event(session, job, send)


def failure_code(exc: MintError) -> str:
    """The job error code of a refusal met while training."""
    if isinstance(exc, InvalidRequest):
        return "invalid_from_adapter" if exc.param == "from_adapter" else "invalid_training_file"
    return exc.type


def give_up(session: Session, job: TrainingJob, last_error: str, send: Dispatch | None = None) -> None:
    """Fail a job that has had all its attempts, with its last error; the caller commits (and
    `send` then sends the webhook deliveries of its failure)."""
    message = gave_up(job.attempts, last_error)
    job.status, job.finished_at = "failed", utcnow()
    job.worker_id, job.heartbeat_at = None, None
    job.error = {"code": "max_attempts_exceeded", "message": message, "param": None}
    emit_event(session, job.id, f"Job failed: {message}", level="error")
    webhooks.job_event(session, job, send)


def give_up_exhausted(session: Session, job_id: str, max_attempts: int, send: Dispatch | None = None) -> bool:
    """Fail a queued job that has had `max_attempts` (its workers kept dying); True if it did."""
    job = session.get(TrainingJob, job_id)
    if job is None or job.status != "queued" or not exhausted(job, max_attempts):
        return False
    give_up(session, job, WORKER_STOPPED, send)
    return True

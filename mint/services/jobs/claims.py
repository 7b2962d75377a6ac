"""A worker's claim on a fine-tuning job. A conditional update moves the job `queued -> running`
for exactly one worker, counting the attempt (`claim`); a duplicate or stale message finds it
running or finished and returns. While it runs, a lease thread (`mint.services.leases`) renews
its heartbeat, and every write of the attempt first checks the job is still this worker's
(`require_ours`): a worker whose lease ran out, or whose job was cancelled, meets `LostLease`
and stops without touching the row."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.services.jobs.context import JobContext
from mint.services.leases import claim_row, held_by
from mint.storage.tables import TrainingJob, utcnow


class LostLease(Exception):
    """The job is no longer this worker's (cancelled, or queued again after its lease ran out)."""


def claim(session: Session, job_id: str, worker_id: str, max_attempts: int) -> TrainingJob | None:
    """Move a queued job to running for this worker, counting the attempt; None if another worker
    has it, it ended, or it has had `max_attempts` (see `endings.give_up_exhausted`)."""
    now = utcnow()
    if not claim_row(session, TrainingJob, job_id, worker_id, max_attempts):
        return None
    job = session.get(TrainingJob, job_id)
    assert job is not None
    session.refresh(job)
    if job.started_at is None:
        job.started_at = now
    return job


def require_ours(session: Session, context: JobContext) -> TrainingJob:
    """The job's row, still held by this attempt's worker; `LostLease` if it is not."""
    job = session.execute(
        select(TrainingJob).where(*held_by(TrainingJob, context.job_id, context.worker_id))
    ).scalar_one_or_none()
    if job is None:
        raise LostLease(context.job_id)
    return job

"""A fine-tuning job's message on its base's queue: `mark_queued` gives the job a new message id
(create, a reconciler's requeue, an operator's retry), `send_job` publishes it once the row is
committed. The row is the truth: a message lost between the two is re-sent by the reconciler,
and a duplicate finds the job claimed already. The Celery task name is `RUN_JOB_TASK`."""

from __future__ import annotations

import logging
import uuid

from sqlalchemy.orm import Session

from mint.services.dispatch import Dispatch
from mint.services.jobs.events import emit_event
from mint.storage.tables import TrainingJob, utcnow

log = logging.getLogger(__name__)

RUN_JOB_TASK = "mint.jobs.run"


def mark_queued(session: Session, job: TrainingJob, *, reason: str) -> None:
    """Give the job a new message id and queue it; the caller commits, then sends."""
    job.status = "queued"
    job.task_id = f"{job.id}:{uuid.uuid4().hex[:12]}"
    job.enqueued_at = utcnow()
    job.worker_id = None
    job.heartbeat_at = None
    emit_event(session, job.id, reason, data={"task_id": job.task_id})


def send_job(job: TrainingJob, send: Dispatch, *, countdown_s: float | None = None) -> None:
    """Publish the job's message (to run after `countdown_s`). A failure is left to the
    reconciler: the row is committed."""
    try:
        send(RUN_JOB_TASK, args=[job.id], task_id=job.task_id, base_model=job.base_model, countdown_s=countdown_s)
    except Exception:  # noqa: BLE001 - the broker may be down; the reconciler re-sends queued jobs
        log.warning("could not send job %s now; the reconciler will", job.id, exc_info=True)

"""A fine-tuning job waiting for capacity: a worker whose base holds all the LoRA sessions it
can (`NoCapacity`) hands the job back to the queue, its attempt not counted, to be tried again
after a wait that grows with each one. The job stays `queued` (a cancel still works), and an
event starting with `CAPACITY_WAIT` says why and when; those events count the waits."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select

from mint.config import Settings
from mint.services.dispatch import Dispatch
from mint.services.jobs.events import emit_event
from mint.services.jobs.messages import send_job
from mint.services.leases import capacity_wait_s, hand_back
from mint.storage.db import session_scope
from mint.storage.tables import JobEvent, TrainingJob

# The start of the event a job records each time it waits for capacity (they are counted).
CAPACITY_WAIT = "Waiting for capacity"


def wait_for_capacity(settings: Settings, job_id: str, worker_id: str, reason: str, send: Dispatch | None) -> str:
    """The worker had no free LoRA session slot for the job: hand it back to the queue, its
    attempt not counted, to be tried again after a wait that grows with each one; an event says
    why and when. The job stays `queued` (a cancel still works) until a worker has room."""
    with session_scope(settings.database) as session:
        waits = session.scalar(
            select(func.count())
            .select_from(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.message.startswith(CAPACITY_WAIT))
        )
        wait_s = capacity_wait_s(settings, int(waits or 0))
        task_id = f"{job_id}:{uuid.uuid4().hex[:12]}"
        if not hand_back(session, TrainingJob, job_id, worker_id, task_id=task_id, due_in_s=wait_s):
            return "lost-lease"
        job = session.get(TrainingJob, job_id)
        assert job is not None
        session.refresh(job)
        if job.attempts == 0:
            job.started_at = None  # it has not started yet
        emit_event(
            session,
            job_id,
            f"{CAPACITY_WAIT}: {reason}; trying again in {wait_s:g} s (a wait is not a failed attempt)",
            level="warning",
            data={"reason": "capacity", "waits": int(waits or 0) + 1, "retry_in_s": wait_s, "task_id": task_id},
        )
        session.commit()
        if send is not None:  # else the reconciler sends it once it is due
            send_job(job, send, countdown_s=wait_s)
    return "waiting-for-capacity"

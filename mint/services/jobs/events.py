"""A fine-tuning job's events: the log the API lists (`GET .../events`, newest first) and every
side writes to, the API at create and cancel, the worker at each step, checkpoint and end, the
reconciler when it queues a job again. One module so that each writer records the same row."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.errors import InvalidRequest
from mint.storage.tables import JobEvent, TrainingJob


def emit_event(
    session: Session,
    job_id: str,
    message: str,
    *,
    level: str = "info",
    type: str = "message",
    data: dict[str, Any] | None = None,
) -> JobEvent:
    event = JobEvent(job_id=job_id, level=level, type=type, message=message, data=data or {})
    session.add(event)
    return event


def rounded(metrics: dict[str, float]) -> dict[str, float]:
    """A step's metrics as events and checkpoints record them."""
    return {name: round(float(value), 6) for name, value in metrics.items()}


def list_events(session: Session, job: TrainingJob, *, after: str | None, limit: int) -> tuple[list[JobEvent], bool]:
    """Events newest first, as OpenAI lists them; `after` is an event id from a previous page."""
    query = select(JobEvent).where(JobEvent.job_id == job.id)
    if after is not None:
        if not after.isdigit():
            raise InvalidRequest(
                f"Unknown cursor {after!r}: pass the last event id of the previous page.", param="after"
            )
        query = query.where(JobEvent.id < int(after))
    rows = list(session.execute(query.order_by(JobEvent.id.desc()).limit(limit + 1)).scalars())
    return rows[:limit], len(rows) > limit

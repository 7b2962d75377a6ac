"""Live workers as they report themselves: the broker-independent view behind
`mint admin workers list` (the embedded broker has no broadcast, so Celery's `inspect`
cannot be the source), and the live process a Tinker model's requests go to."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from mint.services.dispatch import WorkerRef
from mint.storage.tables import Worker, as_utc, utcnow

STALE_AFTER_S = 180


def register_worker(
    session: Session, *, worker_id: str, hostname: str, pid: int, base_model: str | None, queues: list[str]
) -> Worker:
    """Insert or refresh the row of a starting worker (a restart keeps its id)."""
    row = session.get(Worker, worker_id)
    now = utcnow()
    if row is None:
        row = Worker(id=worker_id, started_at=now)
        session.add(row)
    row.hostname, row.pid, row.base_model, row.queues = hostname, pid, base_model, queues
    row.started_at = row.started_at or now
    row.last_seen_at = now
    return row


def heartbeat(session: Session, worker_id: str) -> None:
    row = session.get(Worker, worker_id)
    if row is not None:
        row.last_seen_at = utcnow()


def unregister_worker(session: Session, worker_id: str) -> None:
    session.execute(delete(Worker).where(Worker.id == worker_id))


def list_workers(session: Session) -> list[Worker]:
    return list(session.execute(select(Worker).order_by(Worker.id)).scalars())


def prune_stale_workers(session: Session, *, stale_after_s: int = STALE_AFTER_S) -> int:
    """Forget workers silent for `stale_after_s` (killed without a clean shutdown)."""
    cutoff = utcnow() - timedelta(seconds=stale_after_s)
    result = session.execute(delete(Worker).where(Worker.last_seen_at < cutoff))
    return int(getattr(result, "rowcount", 0) or 0)


def _live_workers(session: Session) -> list[Worker]:
    cutoff = utcnow() - timedelta(seconds=STALE_AFTER_S)
    return [w for w in session.execute(select(Worker)).scalars() if as_utc(w.last_seen_at) >= cutoff]


def live_worker(session: Session, worker_id: str) -> WorkerRef | None:
    """The live process `worker_id` names (`<node>/<pid>`), or None if it stopped or went silent."""
    node, _, pid = worker_id.rpartition("/")
    row = session.get(Worker, node)
    if row is None or str(row.pid) != pid:
        return None
    if as_utc(row.last_seen_at) < utcnow() - timedelta(seconds=STALE_AFTER_S):
        return None
    return WorkerRef(hostname=row.hostname, pid=row.pid)


def base_is_served(session: Session, base_model: str) -> bool:
    """Whether a live worker consumes the training queue of `base_model`."""
    return workers_of_base(session, base_model) > 0


def workers_of_base(session: Session, base_model: str) -> int:
    """How many live workers consume the training queue of `base_model` (each holds its slots)."""
    queue = f"train.{base_model}"
    return sum(queue in (w.queues or []) for w in _live_workers(session))

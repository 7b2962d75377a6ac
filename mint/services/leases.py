"""Leases on long work (fine-tuning jobs, eval runs): one worker holds a running row, and
proves it is alive by renewing `heartbeat_at`.

A worker claims a queued row with one conditional update, keeps a `LeaseKeeper` thread
renewing the lease while it works, and makes every later write conditional on still
holding it (`held_by`), so a worker whose lease ran out (the reconciler queued the row
again) stops without touching it. Both kinds of rows carry the same columns: `status`,
`worker_id`, `heartbeat_at`, `task_id`, `enqueued_at`, `attempts`.

Each claim counts an attempt; a row that has had `max_attempts` is not claimed nor queued
again, but fails with `gave_up` (DESIGN.md section 2: the attempt cap). A worker that claimed
a row but has no room for it (`NoCapacity`) hands it back (`hand_back`), uncounted, to be
tried again after a growing wait (`capacity_wait_s`).
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.storage.db import session_scope
from mint.storage.queries import rowcount
from mint.storage.tables import utcnow

log = logging.getLogger(__name__)


def held_by(model: Any, row_id: str, worker_id: str) -> tuple[Any, ...]:
    """The WHERE clause of a row this worker holds: its id, running, and leased to the worker."""
    return (model.id == row_id, model.worker_id == worker_id, model.status == "running")


def claim_values(worker_id: str) -> dict[str, Any]:
    """What a claim writes: running, held by `worker_id`, lease fresh."""
    return {"status": "running", "worker_id": worker_id, "heartbeat_at": utcnow()}


def claim_row(session: Session, model: Any, row_id: str, worker_id: str, max_attempts: int, **values: Any) -> bool:
    """Move a queued row to running for this worker and count the attempt (one conditional update).

    False if another worker has it, it ended, or it has had `max_attempts` already.
    """
    claimed = session.execute(
        update(model)
        .where(model.id == row_id, model.status == "queued", model.attempts < max_attempts)
        .values(**claim_values(worker_id), attempts=model.attempts + 1, **values)
        .execution_options(synchronize_session=False)
    )
    return bool(rowcount(claimed))


def hand_back(session: Session, model: Any, row_id: str, worker_id: str, *, task_id: str, due_in_s: float) -> bool:
    """Give a claimed row back to the queue without counting the attempt (its worker had no room
    for it): queued, with a new message id, due in `due_in_s`. `enqueued_at` is set to when the
    message is due, so the reconciler, which re-sends only messages older than its grace period,
    leaves the delayed one alone. False if the row is no longer this worker's."""
    handed = session.execute(
        update(model)
        .where(*held_by(model, row_id, worker_id))
        .values(
            status="queued",
            worker_id=None,
            heartbeat_at=None,
            attempts=model.attempts - 1,
            task_id=task_id,
            enqueued_at=utcnow() + timedelta(seconds=due_in_s),
        )
        .execution_options(synchronize_session=False)
    )
    return bool(rowcount(handed))


def capacity_wait_s(settings: Settings, waits: int) -> float:
    """How long work waits for capacity before its `waits + 1`-th try: doubling from
    `capacity_retry_s`, at most `capacity_retry_max_s`."""
    return float(min(settings.capacity_retry_s * 2 ** min(waits, 32), settings.capacity_retry_max_s))


def exhausted(row: Any, max_attempts: int) -> bool:
    """Whether the row has had all its attempts: it must fail rather than be queued or claimed again."""
    return int(row.attempts or 0) >= max_attempts


# What a row's last attempt died of when no error was recorded (its worker was killed).
WORKER_STOPPED = "the worker of the last attempt stopped before finishing (killed, out of memory, or lost)"


def gave_up(attempts: int, last_error: str) -> str:
    """The error of work that ran out of attempts; raise MINT_MAX_ATTEMPTS to allow more."""
    return f"gave up after {attempts} attempts: {last_error}"


class LeaseKeeper:
    """Renews a running row's lease from a background thread, every quarter of the lease."""

    def __init__(self, settings: Settings, model: Any, row_id: str, worker_id: str) -> None:
        self.settings, self.model, self.row_id, self.worker_id = settings, model, row_id, worker_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{row_id}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.job_lease_s / 4):
            try:
                with session_scope(self.settings.database) as session:
                    session.execute(
                        update(self.model)
                        .where(*held_by(self.model, self.row_id, self.worker_id))
                        .values(heartbeat_at=utcnow())
                    )
            except Exception:  # noqa: BLE001 - a missed renewal is retried; the lease allows for it
                log.warning("could not renew the lease of %s", self.row_id, exc_info=True)

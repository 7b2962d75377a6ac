"""Leases on long work (fine-tuning jobs, eval runs): one worker holds a running row, and
proves it is alive by renewing `heartbeat_at`.

A worker claims a queued row with one conditional update, keeps a `LeaseKeeper` thread
renewing the lease while it works, and makes every later write conditional on still
holding it (`held_by`), so a worker whose lease ran out (the reconciler queued the row
again) stops without touching it. Both kinds of rows carry the same columns: `status`,
`worker_id`, `heartbeat_at`, `task_id`, `enqueued_at`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import update

from mint.config import Settings
from mint.storage.db import session_scope
from mint.storage.tables import utcnow

log = logging.getLogger(__name__)


def held_by(model: Any, row_id: str, worker_id: str) -> tuple[Any, ...]:
    """The WHERE clause of a row this worker holds: its id, running, and leased to the worker."""
    return (model.id == row_id, model.worker_id == worker_id, model.status == "running")


def claim_values(worker_id: str) -> dict[str, Any]:
    """What a claim writes: running, held by `worker_id`, lease fresh."""
    return {"status": "running", "worker_id": worker_id, "heartbeat_at": utcnow()}


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

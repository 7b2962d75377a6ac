"""Sending tasks from any process (API, CLI, beat): by name, so no task module is imported.

A task's queue follows from what it needs: work on a base model goes to the queue of the
workers that keep that base resident.
"""

from __future__ import annotations

from celery import Celery

from mint.config import Settings
from mint.services.reconciler import PendingTaskIds, ReconcileReport, reconcile_jobs
from mint.storage.broker import queue_states
from mint.storage.db import session_scope
from mint.worker.app import create_celery
from mint.worker.queues import SYSTEM_QUEUE, training_queue

_apps: dict[tuple[str, str], Celery] = {}


def _celery_for(settings: Settings) -> Celery:
    """One Celery app (and broker connection pool) per broker and result store, reused."""
    key = (settings.broker, settings.result_backend)
    if key not in _apps:
        _apps[key] = create_celery(settings)
    return _apps[key]


class TaskSender:
    """Publishes tasks on the broker that `settings` name (`send(task, args=..., task_id=..., base_model=...)`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __call__(
        self, task: str, *, args: list[str], task_id: str | None = None, base_model: str | None = None
    ) -> None:
        queue = training_queue(base_model) if base_model else SYSTEM_QUEUE
        _celery_for(self.settings).send_task(task, args=args, task_id=task_id, queue=queue)


def pending_task_ids(settings: Settings) -> PendingTaskIds:
    """For the reconciler: the task ids a base's training queue still holds (None: unreadable broker)."""

    def pending(base_model: str) -> frozenset[str] | None:
        queue = training_queue(base_model)
        states = queue_states(settings, [queue])
        return None if states is None else states[queue].task_ids

    return pending


def run_reconciler(settings: Settings) -> ReconcileReport:
    """One pass of the reconciler on `settings`' database and broker (beat's task, or an operator)."""
    with session_scope(settings.database) as session:
        return reconcile_jobs(
            session,
            lease_s=settings.job_lease_s,
            grace_s=settings.requeue_grace_s,
            pending=pending_task_ids(settings),
            send=TaskSender(settings),
        )

"""Celery's `Dispatch` (`mint.services.dispatch`): tasks sent by name from any process (API,
CLI, beat, a worker), so no task module is imported, on an app built at the first send.

Where a task goes follows from what it needs: work on a base model goes to the queue of the
workers that keep that base resident; a Tinker model's requests to the one process that
holds it; upkeep to the system queue.
"""

from __future__ import annotations

from mint import tracing
from mint.config import Settings
from mint.services.autotune.runs import resend_quiet_runs
from mint.services.dispatch import WorkerRef
from mint.services.upkeep.reconciler import PendingTaskIds, ReconcileReport, reconcile_jobs
from mint.storage.broker import queue_states
from mint.storage.db import session_scope
from mint.worker.app import celery_for
from mint.worker.queues import SYSTEM_QUEUE, process_queue, training_queue


def queue_for(base_model: str | None, worker: WorkerRef | None) -> str:
    """One worker process's queue, else the training queue of `base_model`, else the system queue."""
    if worker is not None:
        return process_queue(worker.hostname, worker.pid)
    if base_model is not None:
        return training_queue(base_model)
    return SYSTEM_QUEUE


class CeleryDispatch:
    """Publishes tasks on the broker that `settings` name (`send(task, args=..., task_id=...,
    base_model=... | worker=...)`); the Celery app and its connections are made on the first send."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __call__(
        self,
        task: str,
        *,
        args: list[str],
        task_id: str | None = None,
        base_model: str | None = None,
        worker: WorkerRef | None = None,
        countdown_s: float | None = None,
    ) -> None:
        queue = queue_for(base_model, worker)
        # The request that sends the work names it: the worker's lines for it carry the same id.
        request_id = tracing.current()
        headers = {tracing.MESSAGE_HEADER: request_id} if request_id is not None else None
        celery_for(self.settings).send_task(
            task, args=args, task_id=task_id, queue=queue, countdown=countdown_s, headers=headers
        )


def pending_task_ids(settings: Settings) -> PendingTaskIds:
    """For the reconciler: the task ids a base's training queue still holds (None: unreadable broker)."""

    def pending(base_model: str) -> frozenset[str] | None:
        queue = training_queue(base_model)
        states = queue_states(settings, [queue])
        return None if states is None else states[queue].task_ids

    return pending


def run_reconciler(settings: Settings) -> ReconcileReport:
    """One pass of the reconciler on `settings`' database and broker (beat's task, or an operator)."""
    send = CeleryDispatch(settings)
    with session_scope(settings.database) as session:
        report = reconcile_jobs(
            session,
            lease_s=settings.job_lease_s,
            grace_s=settings.requeue_grace_s,
            pending=pending_task_ids(settings),
            send=send,
            max_attempts=settings.max_attempts,
        )
        report.resent_autotune_runs = resend_quiet_runs(session, send, quiet_s=settings.autotune_quiet_s)
        return report

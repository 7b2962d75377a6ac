"""Celery tasks: thin wrappers that take ids, call one service, and return.

`shared_task` binds them to whichever Mint Celery app is current, so tests that build an
app for their own settings run the same tasks.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from celery import shared_task

from mint.config import get_settings
from mint.services.jobs.runner import run_job
from mint.services.models.uploads import VALIDATE_ADAPTER_TASK, validate_uploaded_version
from mint.services.upkeep.retention import enforce_retention
from mint.services.webhooks.delivery import deliver, resend_due
from mint.services.workers import prune_stale_workers
from mint.storage.db import session_scope
from mint.worker import signals
from mint.worker.dispatch import CeleryDispatch, run_reconciler
from mint.worker.resident import resident_base


@shared_task(name="mint.system.ping", acks_late=True, ignore_result=False)
def ping(probe_id: str) -> dict[str, Any]:
    """Answer which worker process ran the probe: proves a queue is consumed end to end."""
    return {
        "probe_id": probe_id,
        "worker_id": signals.current_worker_id(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
    }


@shared_task(name="mint.system.prune_workers", acks_late=True, ignore_result=True, time_limit=60)
def prune_workers() -> int:
    """Drop worker rows whose process stopped heartbeating (killed, host lost)."""
    with session_scope(get_settings().database) as session:
        return prune_stale_workers(session)


@shared_task(name="mint.jobs.run", acks_late=True, ignore_result=True)
def run_fine_tuning_job(job_id: str) -> str:
    """Run one fine-tuning job on this worker's resident base (a duplicate message returns at once)."""
    settings = get_settings()
    return run_job(settings, job_id, signals.process_identity(), resident_base, CeleryDispatch(settings))


@shared_task(name=VALIDATE_ADAPTER_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def validate_adapter(version_id: str) -> str:
    """Load an uploaded adapter version into this worker's resident base: `ready`, or `invalid` with why."""
    return validate_uploaded_version(get_settings(), version_id, resident_base)


@shared_task(name="mint.system.reconcile", acks_late=True, ignore_result=True, time_limit=120)
def reconcile() -> dict[str, list[str]]:
    """Requeue jobs whose worker died and re-send jobs whose queue message was lost."""
    return run_reconciler(get_settings()).as_dict()


@shared_task(name="mint.system.retention", acks_late=True, ignore_result=True, time_limit=600)
def retention() -> dict[str, list[str]]:
    """Delete expired Tinker checkpoints and the old checkpoints of finished jobs, rows then objects."""
    return enforce_retention(get_settings()).as_dict()


@shared_task(name="mint.webhooks.deliver", acks_late=True, ignore_result=True, time_limit=300)
def deliver_webhook(delivery_id: str) -> str:
    """Make one webhook delivery's next attempt; a failed one sends the next with its backoff."""
    settings = get_settings()
    return deliver(settings, delivery_id, CeleryDispatch(settings))


@shared_task(name="mint.webhooks.resend_due", acks_late=True, ignore_result=True, time_limit=120)
def resend_due_webhooks() -> list[str]:
    """Send again the webhook deliveries whose message was lost or whose worker died."""
    settings = get_settings()
    return resend_due(settings, CeleryDispatch(settings), grace_s=settings.requeue_grace_s)

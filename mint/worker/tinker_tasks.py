"""Tinker tasks: thin glue from queue messages (a model, future or sampler id) to `mint.services.tinker.runner`
and `mint.services.tinker.sample_batches`.

A Tinker model lives on the worker process that created it. Besides its base's queue
(`train.<base>`), every process started with `mint worker --base NAME` (or plain `mint
worker`) consumes a queue of its own, `process.<host>.<pid>`; once a process has claimed a
model, the model's messages go there (a `Dispatch` with `worker`). Samplers need no such
pinning: their requests go to the base's queue and any of its workers serves them.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from mint.config import get_settings
from mint.services.tinker import models, releases, runner, sample_batches, sampling, sessions
from mint.services.tinker.resident import WorkerIdentity
from mint.storage.db import session_scope
from mint.worker import signals
from mint.worker.dispatch import CeleryDispatch
from mint.worker.queues import process_queue
from mint.worker.resident import resident_base

# Generous: a long forward_backward of a large batch; enforced by pools that support limits.
TASK_TIME_LIMIT_S = 6 * 3600


def _me(task: Any) -> WorkerIdentity:
    consumed = task.app.amqp.queues.consume_from or {}
    return WorkerIdentity(worker_id=signals.process_identity(), reachable=process_queue() in consumed)


# No automatic retry: a request that fails records why in its future, and the client decides.
# A message redelivered after its worker died finds the model gone and fails its futures.
@shared_task(
    name=models.RUN_MODEL_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    max_retries=0,
    time_limit=TASK_TIME_LIMIT_S,
)
def run_model(self: Any, model_id: str) -> str:
    """Run a Tinker model's waiting requests, in seq_id order, on the process that holds it."""
    return runner.run_model_requests(get_settings(), model_id, _me(self), resident_base)


@shared_task(
    name=sampling.SAMPLE_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    max_retries=0,
    time_limit=TASK_TIME_LIMIT_S,
)
def sample(self: Any, future_id: str) -> str:
    """Run a sample request on this worker's resident base, in one batch with the other pending
    requests of its sampler adapter (a message whose request is already taken returns at once)."""
    return sample_batches.run_sample(get_settings(), future_id, _me(self), resident_base)


@shared_task(name=sessions.RELEASE_TASK, acks_late=True, ignore_result=True, max_retries=0, time_limit=300)
def release(model_id: str) -> int:
    """Free a finished session's model (its adapter and optimizer state) on the process that held it."""
    return releases.release(get_settings(), model_id)


@shared_task(name=sessions.EXPIRE_TASK, acks_late=True, ignore_result=True, max_retries=0, time_limit=120)
def expire_idle_sessions() -> list[str]:
    """Beat's sweep: expire Tinker sessions whose heartbeats stopped and free their models' slots."""
    settings = get_settings()
    with session_scope(settings.database) as session:
        return sessions.expire_idle_sessions(
            session, idle_s=settings.tinker_session_idle_s, send=CeleryDispatch(settings)
        )

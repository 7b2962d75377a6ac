"""The auto-mode driver's task: thin glue from a tick message (a run id and the tick's id) to
`services.autotune.tick`. Ticks go to the system queue: a tick does database work and sends
jobs and eval runs, which run on the workers of the base."""

from __future__ import annotations

from celery import shared_task

from mint.config import get_settings
from mint.services.autotune.runs import TICK_TASK, tick
from mint.worker.dispatch import CeleryDispatch


@shared_task(name=TICK_TASK, acks_late=True, ignore_result=True, max_retries=0, time_limit=300)
def autotune_tick(run_id: str, tick_id: str) -> str:
    """Advance an auto run one step and send its next tick; a stale or duplicate tick returns at once."""
    settings = get_settings()
    return tick(settings, run_id, tick_id, CeleryDispatch(settings))

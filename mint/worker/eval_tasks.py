"""The eval-run task: thin glue from a queue message (a run id) to `services.eval_runner.execute_eval_run`.

The API sends it to the training queue of the run's base model (a `Dispatch` with
`base_model`), so it runs on a worker that keeps that base resident and shares it with
the fine-tuning jobs and Tinker sessions of the same process.
"""

from __future__ import annotations

from celery import shared_task

from mint.config import get_settings
from mint.services.evals.runner import execute_eval_run
from mint.services.evals.runs import RUN_EVAL_TASK
from mint.worker import signals
from mint.worker.dispatch import CeleryDispatch
from mint.worker.resident import resident_base


# No automatic retry: a run that fails records why, and running it again is a new run. A
# worker lost mid-run stops renewing the run's lease; the reconciler queues the run again,
# and the next worker skips the tasks already written. The limit exceeds the longest benchmark a
# training worker is expected to run; it is enforced by pools that support time limits.
@shared_task(
    name=RUN_EVAL_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    max_retries=0,
    time_limit=4 * 3600,
)
def run_eval(eval_run_id: str) -> str:
    """Run one eval run on this worker's resident base; a duplicate or stale message returns at once."""
    settings = get_settings()
    return execute_eval_run(
        settings, eval_run_id, resident_base, worker_id=signals.process_identity(), send=CeleryDispatch(settings)
    )

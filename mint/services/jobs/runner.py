"""Running a fine-tuning job on the worker that holds its base: the entry the worker's task calls
(`run_job`): claim, train, checkpoint, finish. Each noun is its own module in this package:
the claim and its lease (`claims`), the attempt that trains the stages (`training.JobRun`),
checkpoints (`checkpoints`), the versions stages make (`versions`), usage not billed yet
(`usage`), waiting for capacity (`capacity`) and how a job ends (`endings`).

The run is safe against any process dying at any moment:
- **Claim.** A conditional update moves the job `queued -> running` for exactly one worker;
  a duplicate or stale message finds it running or finished and returns.
- **Lease.** While the job runs, a thread renews `heartbeat_at`; the reconciler queues a
  job again once its lease runs out, and every write below is conditional on the job still
  being this worker's, so a worker that lost its lease stops without touching the row.
- **Checkpoints** every `checkpoint_interval` steps hold the adapter, the Adam moments and
  the step (`TrainingSession.save_state`), stored in the object store and recorded in
  `checkpoints`. A resumed job loads the newest one and continues from its step with the
  same seeded batch plan, so the final adapter has had each of its steps exactly once;
  steps the dead worker ran after that checkpoint are counted in `steps_redone`.
- **Capacity.** A worker whose base holds all the LoRA sessions it can (`NoCapacity`) hands
  the job back to the queue, its attempt not counted, to be tried again after a growing wait
  (`wait_for_capacity`); the job stays `queued` with an event saying so.
- **Finish.** The adapter is stored (content-addressed) before the transaction that
  records its version and marks the job succeeded, so a crash in between redoes the
  finish, never half of it.

**Warm starts and stages.** A job runs its stages in order (a job without `stages` is one
stage). A stage opens its session from, in this order: its own newest checkpoint (a resumed
stage), the version the previous stage registered, the job's `from_adapter` version (the
first stage), or a fresh adapter. Each finished stage registers its own version, naming its
parent, in the transaction that moves the job on, so a stage is either done (its version
exists) or redone from its checkpoint: a worker dying in stage 2 resumes stage 2. Job steps
(progress, events, checkpoints) count across stages; events of a chained job name the stage.
A stage's optimizer starts fresh (another objective); RL's KL reference stays the base.

The plan stored on the row is validated again into its typed plan (`mint.schemas.plans`)
when the job is claimed: a plan that no longer validates (written by another version, or
edited) fails the job with `invalid_plan` and the field at fault, once, instead of failing in
a recipe on every retry. The method registry (`mint.trainer.methods`) picks the recipe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from mint.config import Settings
from mint.errors import InvalidRequest, MintError, NoCapacity
from mint.services.dispatch import Dispatch
from mint.services.jobs.capacity import wait_for_capacity
from mint.services.jobs.claims import LostLease, claim
from mint.services.jobs.context import JobContext
from mint.services.jobs.endings import fail, failure_code, give_up_exhausted
from mint.services.jobs.training import JobRun
from mint.services.leases import LeaseKeeper
from mint.services.tinker.releases import release_idle_models
from mint.storage.db import session_scope
from mint.storage.tables import TrainingJob

if TYPE_CHECKING:
    from mint.trainer.session import ResidentBase

log = logging.getLogger(__name__)


def run_job(
    settings: Settings,
    job_id: str,
    worker_id: str,
    load_base: Callable[[str], ResidentBase],
    send: Dispatch | None = None,
) -> str:
    """Claim and run one job; returns what happened (for logs and tests). `send` carries the
    job's next message when it must wait for capacity."""
    refused: InvalidRequest | None = None
    with session_scope(settings.database) as session:
        job = claim(session, job_id, worker_id, settings.max_attempts)
        if job is None:
            return "failed" if give_up_exhausted(session, job_id, settings.max_attempts, send) else "not-claimed"
        try:
            context = JobContext.claimed(job, worker_id)
        except InvalidRequest as exc:
            refused = exc
    if refused is not None:  # failed once (after the claim commits), not retried: no retry can fix the row
        message = f"the job's plan is not valid: {refused.message}; create the job again"
        fail(settings, job_id, worker_id, "invalid_plan", message, send)
        return "failed"
    started = time.perf_counter()
    try:
        with LeaseKeeper(settings, TrainingJob, job_id, worker_id):
            loading = time.perf_counter()
            resident = load_base(context.base_model)
            load_s = time.perf_counter() - loading
            release_idle_models(settings)  # slots of ended Tinker sessions first
            JobRun(settings, resident, context, send, load_s=load_s).run()
    except LostLease:
        log.warning("job %s is no longer this worker's; stopped", job_id)
        return "lost-lease"
    except NoCapacity as exc:
        log.info("job %s waits for capacity: %s", job_id, exc.message)
        return wait_for_capacity(settings, job_id, worker_id, exc.message, send)
    except MintError as exc:
        fail(settings, job_id, worker_id, failure_code(exc), exc.message, send)
        return "failed"
    except Exception as exc:
        log.exception("job %s failed", job_id)
        fail(settings, job_id, worker_id, "internal_error", f"{type(exc).__name__}: {exc}", send)
        return "failed"
    log.info("job %s done in %.1f s", job_id, time.perf_counter() - started)
    return "done"

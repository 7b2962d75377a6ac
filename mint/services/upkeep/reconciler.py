"""The reconciler: puts back to work the jobs and eval runs that no process is working on.

The database row is the truth, the queue only a notice; the reconciler repairs the notice
(DESIGN.md section 2). It runs periodically (Celery beat) and on demand
(`mint admin jobs requeue`), and takes two kinds of action:

- a **running** job whose lease ran out (its worker died: SIGKILL, lost host) is queued again
  with a new message; the next worker resumes it from its newest checkpoint. If a cancel was
  requested, it is cancelled instead.
- a **queued** job whose message the broker no longer holds (Redis restarted, a message taken
  by a worker that died on the embedded broker, a send that failed after the commit) is sent
  again. Jobs queued less than `requeue_grace_s` ago are left alone, so a message in flight is
  never duplicated; where the broker cannot be read, older queued jobs are re-sent, and the
  claim (one conditional update) makes a duplicate harmless.

Eval runs get the same two repairs; a run queued again resumes where it stopped, since
its next worker skips the tasks whose trajectories are already written.

Neither kind is queued again once it has had `max_attempts` claims (a poison job whose
worker dies at every attempt): it fails instead, "gave up after N attempts: <last error>".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.config import DEFAULT_MAX_ATTEMPTS
from mint.errors import Conflict, NotFound
from mint.services.dispatch import Dispatch
from mint.services.evals import runs as evals
from mint.services.jobs.endings import give_up
from mint.services.jobs.events import emit_event
from mint.services.jobs.messages import mark_queued, send_job
from mint.services.leases import WORKER_STOPPED, exhausted
from mint.services.models import uploads as adapter_uploads
from mint.services.webhooks import events
from mint.storage.tables import EvalRun, TrainingJob, as_utc, utcnow

Leased = TypeVar("Leased", TrainingJob, EvalRun)

# The task ids a base's queue still holds (waiting or taken, not acknowledged); None: unknown.
PendingTaskIds = Callable[[str], frozenset[str] | None]


@dataclass
class ReconcileReport:
    requeued_lost_workers: list[str] = field(default_factory=list)
    resent_lost_messages: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    requeued_eval_runs: list[str] = field(default_factory=list)
    resent_eval_runs: list[str] = field(default_factory=list)
    gave_up: list[str] = field(default_factory=list)
    resent_autotune_runs: list[str] = field(default_factory=list)
    resent_adapter_validations: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[str]]:
        return {
            "requeued_lost_workers": self.requeued_lost_workers,
            "resent_lost_messages": self.resent_lost_messages,
            "cancelled": self.cancelled,
            "requeued_eval_runs": self.requeued_eval_runs,
            "resent_eval_runs": self.resent_eval_runs,
            "gave_up": self.gave_up,
            "resent_autotune_runs": self.resent_autotune_runs,
            "resent_adapter_validations": self.resent_adapter_validations,
        }


def _base_of(row: TrainingJob | EvalRun) -> str:
    return row.base_model if isinstance(row, TrainingJob) else str(row.config["base_model"])


def _expired_running(session: Session, model: type[Leased], lease_s: float) -> list[Leased]:
    cutoff = utcnow() - timedelta(seconds=lease_s)
    running = session.execute(select(model).where(model.status == "running")).scalars()
    return [row for row in running if row.heartbeat_at is None or as_utc(row.heartbeat_at) < cutoff]


def _stranded_queued(session: Session, model: type[Leased], grace_s: float, pending: PendingTaskIds) -> list[Leased]:
    cutoff = utcnow() - timedelta(seconds=grace_s)
    queued = session.execute(select(model).where(model.status == "queued")).scalars()
    stranded: list[Leased] = []
    known: dict[str, frozenset[str] | None] = {}
    for row in queued:
        if row.enqueued_at is not None and as_utc(row.enqueued_at) > cutoff:
            continue
        base = _base_of(row)
        if base not in known:
            known[base] = pending(base)
        held = known[base]
        if held is None or row.task_id not in held:
            stranded.append(row)
    return stranded


def _lost_worker(row: TrainingJob | EvalRun) -> str:
    return f"worker {row.worker_id} stopped renewing the lease (killed, out of memory, or lost)"


def reconcile_jobs(
    session: Session,
    *,
    lease_s: float,
    grace_s: float,
    pending: PendingTaskIds,
    send: Dispatch,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> ReconcileReport:
    """Requeue jobs of dead workers and re-send lost messages, or fail those out of attempts;
    commits before sending."""
    report = ReconcileReport()
    to_send: list[TrainingJob] = []
    for job in _expired_running(session, TrainingJob, lease_s):
        if job.cancel_requested_at is not None:
            job.status, job.finished_at = "cancelled", utcnow()
            emit_event(session, job.id, f"Job cancelled; its worker {job.worker_id} had stopped")
            events.job_event(session, job, send)
            report.cancelled.append(job.id)
            continue
        if exhausted(job, max_attempts):
            give_up(session, job, _lost_worker(job), send)
            report.gave_up.append(job.id)
            continue
        mark_queued(
            session,
            job,
            reason=f"Worker {job.worker_id} stopped renewing the job's lease; "
            "queued again to resume from the last checkpoint",
        )
        report.requeued_lost_workers.append(job.id)
        to_send.append(job)
    for job in _stranded_queued(session, TrainingJob, grace_s, pending):
        if exhausted(job, max_attempts):
            give_up(session, job, WORKER_STOPPED, send)
            report.gave_up.append(job.id)
            continue
        mark_queued(session, job, reason="The job's queue message was lost; sent again")
        report.resent_lost_messages.append(job.id)
        to_send.append(job)
    runs: list[EvalRun] = []
    for run in _expired_running(session, EvalRun, lease_s):
        if exhausted(run, max_attempts):
            evals.give_up(session, run, _lost_worker(run), send)
            report.gave_up.append(run.id)
            continue
        evals.mark_queued(run)  # its next worker skips the tasks already written
        report.requeued_eval_runs.append(run.id)
        runs.append(run)
    for run in _stranded_queued(session, EvalRun, grace_s, pending):
        if exhausted(run, max_attempts):
            evals.give_up(session, run, WORKER_STOPPED, send)
            report.gave_up.append(run.id)
            continue
        evals.mark_queued(run)
        report.resent_eval_runs.append(run.id)
        runs.append(run)
    uploads = adapter_uploads.stranded_validations(session, grace_s=grace_s, pending=pending)
    report.resent_adapter_validations += [version.id for version in uploads]
    session.commit()
    for job in to_send:
        send_job(job, send)
    for run in runs:
        evals.send_run(run, send)
    for version in uploads:
        adapter_uploads.send_validation(version, send)
    return report


def requeue_job(session: Session, job_id: str, *, send: Dispatch) -> TrainingJob:
    """An operator's requeue: a queued job's message is sent again; a running one is taken from its
    worker (which stops at its next step) and queued to resume from its last checkpoint."""
    job = session.get(TrainingJob, job_id)
    if job is None:
        raise NotFound(f"no fine-tuning job {job_id!r}", param="job_id")
    if job.status not in ("queued", "running"):
        raise Conflict(f"job {job.id} is {job.status}; only queued or running jobs can be requeued")
    mark_queued(session, job, reason="Queued again by an operator")
    session.commit()
    send_job(job, send)
    return job

"""A fine-tuning job's checkpoints: every `checkpoint_interval` steps (and before a stop at its
budget) the worker saves its trainer's state (adapter or weights, Adam moments, step), stores
it in the object store and records it in `checkpoints`, billing the usage so far. A resumed
stage loads its newest one (`newest_checkpoint`) and continues from its step with the same
seeded batch plan, so the final adapter has had each of its steps exactly once. The API lists
them (`list_checkpoints`). Checkpoint steps are the job's steps, counted across stages."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.services.jobs.claims import require_ours
from mint.services.jobs.context import JobContext, Stage
from mint.services.jobs.events import emit_event, rounded
from mint.services.jobs.usage import bill
from mint.storage.archives import pack_folder
from mint.storage.db import session_scope
from mint.storage.keys import job_checkpoint_key
from mint.storage.objects import ObjectStore
from mint.storage.tables import Checkpoint, TrainingJob, new_id

if TYPE_CHECKING:
    from mint.services.jobs.context import Training
    from mint.trainer.recipes.common import StepReport


def newest_checkpoint(settings: Settings, job_id: str, stage: Stage) -> tuple[int, str, int] | None:
    """`stage`'s newest checkpoint: (job step, object key, trained tokens then)."""
    with session_scope(settings.database) as session:
        newest = (
            session.execute(
                select(Checkpoint)
                .where(
                    Checkpoint.job_id == job_id,
                    Checkpoint.step > stage.offset,
                    Checkpoint.step <= stage.offset + stage.plan.steps,
                )
                .order_by(Checkpoint.step.desc())
            )
            .scalars()
            .first()
        )
        return (newest.step, newest.object_key, int(newest.metrics.get("trained_tokens", 0))) if newest else None


def save_checkpoint(
    settings: Settings, store: ObjectStore, context: JobContext, training: Training, report: StepReport
) -> None:
    """Store the trainer's state at `report`'s step, then record it (a step redone after a
    resume rewrites its row) and bill the usage so far; `LostLease` if the job is no longer ours."""
    with tempfile.TemporaryDirectory(prefix="mint-ckpt-") as scratch:
        training.save_state(Path(scratch))
        data = pack_folder(Path(scratch))
    step = context.stage.offset + report.step  # the job's step
    key = job_checkpoint_key(context.job_id, step)
    info = store.put_bytes(key, data)
    metrics = {**rounded(report.metrics), "trained_tokens": context.trained_tokens, **context.label()}
    with session_scope(settings.database) as session:
        require_ours(session, context)
        existing = session.execute(
            select(Checkpoint).where(Checkpoint.job_id == context.job_id, Checkpoint.step == step)
        ).scalar_one_or_none()
        if existing is None:
            session.add(
                Checkpoint(
                    id=new_id("ftckpt"),
                    job_id=context.job_id,
                    step=step,
                    object_key=key,
                    sha256=info.sha256,
                    size_bytes=info.size_bytes,
                    metrics=metrics,
                )
            )
        else:  # the same step, redone after a resume: the same state, rewritten
            existing.sha256, existing.size_bytes, existing.metrics = info.sha256, info.size_bytes, metrics
        bill(session, context, context.adapter_name)
        emit_event(
            session,
            context.job_id,
            f"Checkpoint saved at step {step}{context.in_stage()}",
            data={"step": step, **context.label()},
        )


def list_checkpoints(session: Session, job: TrainingJob) -> list[Checkpoint]:
    return list(
        session.execute(
            select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step.desc())
        ).scalars()
    )

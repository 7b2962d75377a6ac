"""Retention: what beat deletes on a schedule, rows first, then their objects.

- **Tinker checkpoint TTLs.** A checkpoint saved with `ttl_seconds` (or given one by
  `PUT .../ttl`) has `expires_at`; once it has passed, the row is deleted, then its objects
  (a training state's archive, exported weights' files) if no other row references them.
  Sampler weights are also an adapter version (the same object), so their object stays with
  the version; only the `tinker://` path goes.
- **Captured traffic.** A deployment's captures (and the feedback on them) are deleted once
  their retention period has passed (`expires_at`).
- **Checkpoints of finished jobs.** A job that succeeded, failed or was cancelled keeps its
  newest `job_checkpoints_keep` checkpoints; `job_checkpoint_retention_s` after it finished,
  the others are deleted, rows then objects. The adapter a job produced is an adapter version
  of its own (`adapters/sha256/...`), never one of its checkpoints; an object that any adapter
  version (or any other row) references is never deleted.

Rows go first, in a committed transaction, so a crash before the objects are deleted leaves
objects that no row references, which `mint admin gc` collects; never a row that names a
missing object. Each pass handles at most `BATCH` rows of each kind and is idempotent: the
next pass picks up where a crash or the batch limit left off.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select

from mint.config import Settings
from mint.services.models.object_gc import delete_if_unreferenced
from mint.services.serving.captures import expire_captures
from mint.services.serving.episodes import expire_episodes
from mint.services.tinker.checkpoints import checkpoint_objects
from mint.storage.db import session_scope
from mint.storage.objects import ObjectStore, object_store_for
from mint.storage.tables import Checkpoint, TinkerCheckpoint, TrainingJob, as_utc, utcnow

log = logging.getLogger(__name__)

BATCH = 500  # rows of each kind deleted per pass; the next pass continues
FINISHED = ("succeeded", "failed", "cancelled")


@dataclass
class RetentionReport:
    """Ids of the rows one pass deleted, and the objects it deleted with them."""

    expired_tinker_checkpoints: list[str] = field(default_factory=list)
    expired_captures: list[str] = field(default_factory=list)
    expired_episodes: list[str] = field(default_factory=list)
    pruned_job_checkpoints: list[str] = field(default_factory=list)
    deleted_objects: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[str]]:
        return asdict(self)


def expire_tinker_checkpoints(
    database: str, store: ObjectStore, *, now: datetime, report: RetentionReport | None = None
) -> RetentionReport:
    """Delete the Tinker checkpoints whose `expires_at` has passed, then their objects."""
    report = report or RetentionReport()
    with session_scope(database) as session:
        rows = (
            session.execute(
                select(TinkerCheckpoint)
                .where(TinkerCheckpoint.expires_at.is_not(None), TinkerCheckpoint.expires_at <= now)
                .order_by(TinkerCheckpoint.expires_at)
                .limit(BATCH)
            )
            .scalars()
            .all()
        )
        # A key written after the row expired belongs to a save since (an overwrite): kept.
        doomed = [(key, as_utc(row.expires_at)) for row in rows if row.expires_at for key in checkpoint_objects(row)]
        report.expired_tinker_checkpoints += [row.id for row in rows]
        for row in rows:
            session.delete(row)
    _delete_objects(database, store, doomed, report)
    return report


def prune_job_checkpoints(
    database: str,
    store: ObjectStore,
    *,
    keep: int,
    retention_s: float,
    now: datetime,
    report: RetentionReport | None = None,
) -> RetentionReport:
    """For each job that finished over `retention_s` ago with more than `keep` checkpoints,
    delete all but its newest `keep` (by step), then their objects."""
    report = report or RetentionReport()
    cutoff = now - timedelta(seconds=retention_s)
    with session_scope(database) as session:
        jobs = session.execute(
            select(TrainingJob.id, TrainingJob.finished_at)
            .join(Checkpoint, Checkpoint.job_id == TrainingJob.id)
            .where(TrainingJob.status.in_(FINISHED), TrainingJob.finished_at <= cutoff)
            .group_by(TrainingJob.id, TrainingJob.finished_at)
            .having(func.count(Checkpoint.id) > keep)
            .limit(BATCH)
        ).all()
        doomed: list[tuple[str, datetime]] = []
        for job_id, finished_at in jobs:
            assert finished_at is not None  # `finished_at <= cutoff` leaves out the NULLs
            older = (
                session.execute(
                    select(Checkpoint)
                    .where(Checkpoint.job_id == job_id)
                    .order_by(Checkpoint.step.desc())
                    .offset(keep)
                    .limit(BATCH)
                )
                .scalars()
                .all()
            )
            # A job writes no checkpoint once it has finished: a later object is not one of these.
            doomed += [(row.object_key, as_utc(finished_at)) for row in older]
            report.pruned_job_checkpoints += [row.id for row in older]
            for row in older:
                session.delete(row)
    _delete_objects(database, store, doomed, report)
    return report


def enforce_retention(settings: Settings, *, now: datetime | None = None) -> RetentionReport:
    """One pass of every policy on `settings`' database and store (beat's task)."""
    now = now or utcnow()
    store = object_store_for(settings)
    report = expire_tinker_checkpoints(settings.database, store, now=now)
    with session_scope(settings.database) as session:
        report.expired_captures = expire_captures(session, now=now, batch=BATCH)
        report.expired_episodes = expire_episodes(session, now=now, batch=BATCH)
    prune_job_checkpoints(
        settings.database,
        store,
        keep=settings.job_checkpoints_keep,
        retention_s=settings.job_checkpoint_retention_s,
        now=now,
        report=report,
    )
    if (
        report.expired_tinker_checkpoints
        or report.pruned_job_checkpoints
        or report.expired_captures
        or report.expired_episodes
    ):
        log.info(
            "retention: %d expired Tinker checkpoints, %d expired captures, %d expired episodes, "
            "%d job checkpoints pruned, %d objects deleted",
            len(report.expired_tinker_checkpoints),
            len(report.expired_captures),
            len(report.expired_episodes),
            len(report.pruned_job_checkpoints),
            len(report.deleted_objects),
        )
    return report


def _delete_objects(
    database: str, store: ObjectStore, doomed: list[tuple[str, datetime]], report: RetentionReport
) -> None:
    """After the rows are committed: delete each object that nothing references any more."""
    for key, written_before in dict(doomed).items():
        if delete_if_unreferenced(database, store, key, written_before=written_before):
            report.deleted_objects.append(key)

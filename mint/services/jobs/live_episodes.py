"""An online RL job's link to its deployment, on the worker: the deployment's rewarded episodes
as they arrive (`DeploymentEpisodes`, the recipe's feed) and each new version made the one the
deployment serves (`VersionPublisher`).

The feed reads the deployment's episodes rewarded since the last it handed over (in the order
their rewards arrived), each turn as the serving engine recorded it: prompt ids, sampled ids,
logprobs and the version that sampled them. A step waits for `batch_size` of them, at most the
plan's `max_wait_s` (then it trains on those that came, or fails the job with `no_episodes`
when none did), renewing the job's lease and heeding a cancel while it waits. An episode
rewarded later than `reward_timeout_s` after its last turn is left out, and so counted, as is
every episode still unrewarded that long.

The publisher registers the policy's weights as a version of the job's adapter every
`publish_every` steps (its lineage names the job, its parent the version before it, and
`published_at_step`), and with `serve: immediate` promotes the deployment to it at once: a
new revision, which each request reads when it starts, so requests in flight finish on the
version they started with and every later turn names the new one. The job's last version is
registered by the job's end, as any job's, and then served the same way (`serve_result`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import Conflict, MintError
from mint.schemas.plans import OnlineRlPlan
from mint.services.catalog import model_ref_of
from mint.services.dispatch import Dispatch
from mint.services.jobs.claims import require_ours
from mint.services.jobs.context import JobContext
from mint.services.jobs.events import emit_event
from mint.services.jobs.versions import version_archive
from mint.services.models import adapters
from mint.services.principal import Principal
from mint.services.serving import deployments
from mint.services.serving.episodes import turns_of
from mint.storage.db import session_scope
from mint.storage.objects import ObjectStore
from mint.storage.tables import Adapter, AdapterVersion, Episode, as_utc, utcnow

if TYPE_CHECKING:
    from mint.services.jobs.context import Training
    from mint.trainer.recipes.common import LiveSource, StepReport
    from mint.trainer.recipes.online_rl import LiveEpisode

log = logging.getLogger(__name__)

POLL_S = 0.5


class NoEpisodes(MintError):
    """An online RL job whose deployment gave it no rewarded episode within its wait."""

    type = "no_episodes"


def job_principal(context: JobContext) -> Principal:
    """Who promotes the deployment in the audit log: the job itself."""
    return Principal(
        organization_id=context.organization_id, key_id=None, role="developer", name=f"job {context.job_id}"
    )


@dataclass
class FeedCounts:
    """What the feed has seen besides the episodes it handed over."""

    late: int = 0  # rewarded after the plan's reward_timeout_s
    waited_s: float = 0.0  # seconds the last step waited for its episodes


@dataclass
class DeploymentEpisodes:
    """The deployment's rewarded episodes, oldest reward first, each handed over once."""

    settings: Settings
    context: JobContext
    plan: OnlineRlPlan
    started_at: datetime
    counts: FeedCounts = field(default_factory=FeedCounts)
    _after: tuple[datetime, str] | None = None

    def next_episodes(self, step: int, count: int) -> list[LiveEpisode]:
        began = time.monotonic()
        deadline = began + self.plan.max_wait_s
        found: list[LiveEpisode] = []
        while True:
            cancelled, found = self._read(count, found)
            self.counts.waited_s = time.monotonic() - began
            if cancelled:
                return []
            if len(found) >= count:
                return found
            if time.monotonic() >= deadline:
                if found:
                    return found
                raise NoEpisodes(
                    f"no rewarded episode of deployment {self.plan.deployment_id} arrived within max_wait_s "
                    f"({self.plan.max_wait_s:g} s) for step {step + 1}: are its clients marking their requests "
                    "(X-Mint-Episode) and rewarding them (POST /v1/episodes/{id}/reward)?"
                )
            time.sleep(POLL_S)

    def _read(self, count: int, found: list[LiveEpisode]) -> tuple[bool, list[LiveEpisode]]:
        """Episodes rewarded since the last read (up to `count` in all), and whether the job was
        cancelled; the job's lease is renewed."""
        from mint.trainer.recipes.online_rl import LiveEpisode, LiveTurn

        timeout = timedelta(seconds=self.plan.reward_timeout_s)
        with session_scope(self.settings.database) as session:
            job = require_ours(session, self.context)
            job.heartbeat_at = utcnow()
            if job.cancel_requested_at is not None:
                return True, found
            query = select(Episode).where(
                Episode.deployment_id == self.plan.deployment_id, Episode.rewarded_at.is_not(None)
            )
            if self._after is not None:
                at, last_id = self._after
                query = query.where(
                    or_(Episode.rewarded_at > at, and_(Episode.rewarded_at == at, Episode.id > last_id))
                )
            rows = session.execute(query.order_by(Episode.rewarded_at, Episode.id).limit(count * 4)).scalars().all()
            kept: list[Episode] = []
            for row in rows:
                if len(found) + len(kept) >= count:
                    break
                self._after = (row.rewarded_at, row.id)  # type: ignore[assignment]
                assert row.rewarded_at is not None
                if as_utc(row.rewarded_at) > as_utc(row.last_turn_at) + timeout:
                    self.counts.late += 1
                    continue
                kept.append(row)
            turns = turns_of(session, [row.id for row in kept])
            for row in kept:
                live = [
                    LiveTurn(
                        prompt_tokens=list(turn.prompt_token_ids),
                        tokens=list(turn.token_ids),
                        logprobs=[float(value) for value in turn.logprobs],
                        adapter_version=turn.model_ref if "@" in turn.model_ref else None,
                    )
                    for turn in turns[row.id]
                    if turn.prompt_token_ids and turn.token_ids
                ]
                if live:
                    assert row.reward is not None
                    found.append(LiveEpisode(id=row.key, task=row.task, reward=float(row.reward), turns=live))
        return False, found

    def unrewarded(self) -> int:
        """Episodes since the job started still without a reward past the plan's reward_timeout_s."""
        cutoff = utcnow() - timedelta(seconds=self.plan.reward_timeout_s)
        with session_scope(self.settings.database) as session:
            return int(
                session.execute(
                    select(func.count())
                    .select_from(Episode)
                    .where(
                        Episode.deployment_id == self.plan.deployment_id,
                        Episode.reward.is_(None),
                        Episode.created_at >= self.started_at,
                        Episode.last_turn_at < cutoff,
                    )
                ).scalar_one()
            )


@dataclass
class VersionPublisher:
    """Registers the policy's weights as a version every `publish_every` steps and, with `serve:
    immediate`, makes the deployment serve it."""

    settings: Settings
    store: ObjectStore
    context: JobContext
    plan: OnlineRlPlan
    training: Training
    send: Dispatch | None
    published: list[str] = field(default_factory=list)
    parent_version_id: str | None = None

    def __call__(self, steps_done: int) -> str:
        if steps_done >= self.plan.steps:
            return ""  # the job's last version is registered by its end (`serve_result`)
        archive, lora = version_archive(self.training)
        with session_scope(self.settings.database) as session:
            job = require_ours(session, self.context)
            version = adapters.register_version(
                session,
                self.store,
                organization_id=self.context.organization_id,
                name=self.context.adapter_name,
                base_model=self.context.base_model,
                archive=archive,
                lora=lora,
                training_job_id=job.id,
                parent_version_id=self.parent_version_id or self.context.from_version_id,
                metrics={
                    "method": "online_rl",
                    "published_at_step": steps_done,
                    "trained_tokens": self.context.trained_tokens,
                    "deployment_id": self.plan.deployment_id,
                },
            )
            adapter = session.get(Adapter, version.adapter_id)
            assert adapter is not None
            ref = model_ref_of(adapter, version)
            self.parent_version_id = version.id
            served = self._serve(session, ref, steps_done)
            emit_event(
                session,
                job.id,
                f"Step {steps_done}: published {ref}" + (", now served" if served else ""),
                data={"step": steps_done, "model": ref, "adapter_version_id": version.id, "served": served},
            )
        self.published.append(ref)
        return ref

    def _serve(self, session: Session, ref: str, steps_done: int) -> bool:
        if self.plan.serve != "immediate":
            return False
        why = f"online RL job {self.context.job_id}, step {steps_done}"
        refused = serve_version(session, self.context, self.plan, ref, why, self.send)
        if refused is not None:
            emit_event(
                session,
                self.context.job_id,
                f"Step {steps_done}: {ref} is registered but not served: {refused}",
                level="warning",
                data={"step": steps_done, "model": ref, "served": False},
            )
        return refused is None

    def earlier(self) -> dict[str, int]:
        """Versions this job published in earlier attempts, with the steps after which each was current."""
        with session_scope(self.settings.database) as session:
            rows = session.execute(
                select(AdapterVersion, Adapter)
                .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
                .where(AdapterVersion.training_job_id == self.context.job_id)
            ).all()
            found = {
                model_ref_of(adapter, version): int(version.metrics["published_at_step"])
                for version, adapter in rows
                if "published_at_step" in version.metrics
            }
            newest = max(rows, key=lambda pair: pair[0].version, default=None)
            if newest is not None and "published_at_step" in newest[0].metrics:
                self.parent_version_id = newest[0].id
            return found


def serve_version(
    session: Session, context: JobContext, plan: OnlineRlPlan, ref: str, reason: str, send: Dispatch | None
) -> str | None:
    """Promote the job's deployment to `ref`, as the job; None once served, else why not (the
    gate refused it, audited, or the deployment was withdrawn meanwhile), the version staying
    registered."""
    try:
        deployments.promote(
            session, job_principal(context), plan.deployment_id, model=ref, mixture=None, reason=reason, send=send
        )
    except Conflict as refused:
        return refused.message
    return None


def serve_result(settings: Settings, context: JobContext, plan: OnlineRlPlan, send: Dispatch | None) -> None:
    """Serve the version an online RL job ended with (`serve: immediate`)."""
    if plan.serve != "immediate":
        return
    with session_scope(settings.database) as session:
        version_id = context.done.get(context.stage.number, (None, 0))[0]
        version = session.get(AdapterVersion, version_id) if version_id else None
        if version is None:
            return
        adapter = session.get(Adapter, version.adapter_id)
        assert adapter is not None
        ref = model_ref_of(adapter, version)
        refused = serve_version(session, context, plan, ref, f"online RL job {context.job_id} finished", send)
        if refused is not None:
            emit_event(session, context.job_id, f"{ref} is not served: {refused}", level="warning")
            return
        emit_event(session, context.job_id, f"The deployment now serves {ref}", data={"model": ref})


def live_source(
    settings: Settings, store: ObjectStore, context: JobContext, training: Training, send: Dispatch | None
) -> tuple[LiveSource, Callable[[StepReport], None]]:
    """An online RL job's deployment as its recipe reads it (see the module's docstring), and what
    adds the feed's counts (episodes rewarded late, still unrewarded, the step's wait) to a
    step's metrics before the step is recorded."""
    from mint.trainer.recipes.common import LiveSource

    plan = context.plan
    assert isinstance(plan, OnlineRlPlan)
    with session_scope(settings.database) as session:
        started_at = as_utc(require_ours(session, context).created_at)
        start_version = None
        if context.from_version_id is not None:
            version = session.get(AdapterVersion, context.from_version_id)
            adapter = session.get(Adapter, version.adapter_id) if version is not None else None
            if version is not None and adapter is not None:
                start_version = model_ref_of(adapter, version)
    feed = DeploymentEpisodes(settings, context, plan, started_at)
    publish = VersionPublisher(settings, store, context, plan, training, send)
    source = LiveSource(feed=feed, publish=publish, start_version=start_version, earlier_versions=publish.earlier())

    def count(report: StepReport) -> None:
        report.metrics["episodes_late"] = float(feed.counts.late)
        report.metrics["episodes_unrewarded"] = float(feed.unrewarded())
        report.metrics["wait_s"] = feed.counts.waited_s

    return source, count

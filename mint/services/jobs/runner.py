"""Running a fine-tuning job on the worker that holds its base: claim, train, checkpoint, finish.

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

import json
import logging
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import InvalidRequest, MintError, NoCapacity
from mint.schemas.job_spec import JobSpec
from mint.services import catalog, datasets
from mint.services.billing import prices as pricing
from mint.services.billing import spend
from mint.services.billing.usage import record_usage
from mint.services.dispatch import Dispatch
from mint.services.jobs.context import JobContext, Stage
from mint.services.jobs.fine_tuning import emit_event, give_up, send_job
from mint.services.leases import (
    WORKER_STOPPED,
    LeaseKeeper,
    capacity_wait_s,
    claim_row,
    exhausted,
    hand_back,
    held_by,
)
from mint.services.models import adapters
from mint.services.tinker import runner
from mint.services.webhooks import events as webhooks
from mint.storage.archives import pack_folder, unpack_folder
from mint.storage.db import session_scope
from mint.storage.objects import ObjectStore, object_store_for
from mint.storage.queries import rowcount
from mint.storage.tables import AdapterVersion, Checkpoint, Dataset, JobEvent, TrainingJob, new_id, utcnow
from mint.trainer.recipes.common import StepReport

if TYPE_CHECKING:
    from mint.trainer.full import FullParameterTrainer
    from mint.trainer.session import ResidentBase
    from mint.trainer.training_session import TrainingSession

    Training = TrainingSession | FullParameterTrainer

log = logging.getLogger(__name__)

TERMINAL = ("succeeded", "failed", "cancelled")


class LostLease(Exception):
    """The job is no longer this worker's (cancelled, or queued again after its lease ran out)."""


def claim(session: Session, job_id: str, worker_id: str, max_attempts: int) -> TrainingJob | None:
    """Move a queued job to running for this worker, counting the attempt; None if another worker
    has it, it ended, or it has had `max_attempts` (see `give_up_exhausted`)."""
    now = utcnow()
    if not claim_row(session, TrainingJob, job_id, worker_id, max_attempts):
        return None
    job = session.get(TrainingJob, job_id)
    assert job is not None
    session.refresh(job)
    if job.started_at is None:
        job.started_at = now
    return job


def give_up_exhausted(session: Session, job_id: str, max_attempts: int, send: Dispatch | None = None) -> bool:
    """Fail a queued job that has had `max_attempts` (its workers kept dying); True if it did."""
    job = session.get(TrainingJob, job_id)
    if job is None or job.status != "queued" or not exhausted(job, max_attempts):
        return False
    give_up(session, job, WORKER_STOPPED, send)
    return True


def _checkpoint_key(job_id: str, step: int) -> str:
    return f"checkpoints/{job_id}/step-{step:07d}.tar"


class JobRun:
    """One attempt at one job on this worker's resident base."""

    def __init__(
        self,
        settings: Settings,
        resident: ResidentBase,
        context: JobContext,
        send: Dispatch | None = None,
        *,
        load_s: float = 0.0,
    ) -> None:
        self.settings = settings
        self.send = send  # sends the webhook deliveries of the job's end
        self.store: ObjectStore = object_store_for(settings)
        self.resident = resident
        self.context = context
        self.session_id = context.job_id
        self.stopped_at_budget = False
        self._clock = time.perf_counter()
        # Seconds this attempt waited for its base to load (0 when it was resident): kept on the
        # job so the cost model's speeds leave it out.
        self.load_s = load_s

    # ---- state ------------------------------------------------------------------------------

    def open_session(self) -> Training:
        """The current stage's trainer: from its newest checkpoint, else from the version it starts
        from (the previous stage's, or the job's `from_adapter`), else fresh with the job's seed.
        A LoRA session on the resident base, or for a full-parameter job a private copy of it."""
        from mint.trainer.types import LoraOptions

        if self.session_id in {s.session_id for s in self.resident.sessions}:
            self.resident.close(self.session_id)  # left open by an attempt that failed in this process
        stage, context = self.context.stage, self.context
        parent, tokens_before = self.parent_of(stage)
        context.stage_tokens_at_start = context.tokens_at_start = context.trained_tokens = tokens_before
        context.start_step = 0
        snapshot = self._newest_checkpoint()
        if context.full:
            return self._full_trainer(snapshot, parent)
        if snapshot is not None:
            step, key, tokens = snapshot
            with tempfile.TemporaryDirectory(prefix="mint-resume-") as scratch:
                unpack_folder(self.store.get_bytes(key), Path(scratch))
                training = self.resident.create_session_from_state(Path(scratch), session_id=self.session_id)
            self._resumed_at(step, tokens)
            return training
        if parent is not None:
            return self._session_from_version(parent)
        options = LoraOptions.model_validate(context.lora)
        return self.resident.create_session(options, session_id=self.session_id)

    def _newest_checkpoint(self) -> tuple[int, str, int] | None:
        """The current stage's newest checkpoint: (job step, object key, trained tokens then)."""
        stage, context = self.context.stage, self.context
        with session_scope(self.settings.database) as session:
            newest = (
                session.execute(
                    select(Checkpoint)
                    .where(
                        Checkpoint.job_id == context.job_id,
                        Checkpoint.step > stage.offset,
                        Checkpoint.step <= stage.offset + stage.plan.steps,
                    )
                    .order_by(Checkpoint.step.desc())
                )
                .scalars()
                .first()
            )
            return (newest.step, newest.object_key, int(newest.metrics.get("trained_tokens", 0))) if newest else None

    def _resumed_at(self, step: int, tokens: int) -> None:
        context = self.context
        context.start_step, context.tokens_at_start = step - context.stage.offset, tokens
        context.trained_tokens = tokens

    def _full_trainer(self, snapshot: tuple[int, str, int] | None, parent: str | None) -> FullParameterTrainer:
        """A private copy of the base for a full-parameter stage, on the resident base's device:
        the base's weights, or a whole-model version's (`parent`), then its newest checkpoint's
        weights, Adam moments and step. It trains on this process alone, also on a worker group."""
        from mint.trainer.full import FullParameterTrainer
        from mint.trainer.models import spec_with_weights

        spec, device = self.resident.spec, str(self.resident.device)
        with tempfile.TemporaryDirectory(prefix="mint-full-") as scratch:
            if parent is not None and snapshot is None:
                spec = spec_with_weights(spec, self._version_folder(parent, Path(scratch), kind="full"))
            training = FullParameterTrainer(spec, self.settings.models_cache_dir, device=device)
            if snapshot is not None:
                step, key, tokens = snapshot
                unpack_folder(self.store.get_bytes(key), Path(scratch) / "state")
                training.load_state(Path(scratch) / "state")
                self._resumed_at(step, tokens)
        return training

    def _version_folder(self, version_id: str, scratch: Path, *, kind: str) -> Path:
        """A ready version's files in `scratch`: a PEFT adapter, or a whole model (`kind` full)."""
        with session_scope(self.settings.database) as session:
            version = session.get(AdapterVersion, version_id)
            if version is None or version.status != "ready":
                raise InvalidRequest(
                    f"the adapter version this job starts from ({version_id}) is no longer ready; "
                    "create the job again from another version",
                    param="from_adapter",
                )
            key = version.object_key
        if kind == "full":
            return adapters.extract_model(self.store.get_bytes(key), scratch / "model")
        return adapters.extract_adapter(self.store.get_bytes(key), scratch)

    def parent_of(self, stage: Stage) -> tuple[str | None, int]:
        """The version `stage` starts from (None: a fresh adapter) and the job's trained tokens then."""
        if stage.number == 1:
            return self.context.from_version_id, 0
        return self.context.done[stage.number - 1]

    def _session_from_version(self, version_id: str) -> TrainingSession:
        """A session holding an adapter version's weights (its rank, alpha and targets), optimizer fresh."""
        with tempfile.TemporaryDirectory(prefix="mint-warm-") as scratch:
            folder = self._version_folder(version_id, Path(scratch), kind="lora")
            return self.resident.create_session_from_adapter(folder, session_id=self.session_id)

    def _stage_versions(self) -> dict[int, tuple[str, int]]:
        """The stages of this job done in earlier attempts: their versions and trained tokens."""
        with session_scope(self.settings.database) as session:
            rows = session.execute(
                select(AdapterVersion).where(AdapterVersion.training_job_id == self.context.job_id)
            ).scalars()
            return {
                int(row.metrics.get("stage", 1)): (row.id, int(row.metrics.get("trained_tokens", 0))) for row in rows
            }

    def save_checkpoint(self, training: Training, report: StepReport) -> None:
        with tempfile.TemporaryDirectory(prefix="mint-ckpt-") as scratch:
            training.save_state(Path(scratch))
            data = pack_folder(Path(scratch))
        step = self.context.stage.offset + report.step  # the job's step
        key = _checkpoint_key(self.context.job_id, step)
        info = self.store.put_bytes(key, data)
        metrics = {**_rounded(report.metrics), "trained_tokens": self.context.trained_tokens, **self._label()}
        with session_scope(self.settings.database) as session:
            self._require_ours(session)
            existing = session.execute(
                select(Checkpoint).where(Checkpoint.job_id == self.context.job_id, Checkpoint.step == step)
            ).scalar_one_or_none()
            if existing is None:
                session.add(
                    Checkpoint(
                        id=new_id("ftckpt"),
                        job_id=self.context.job_id,
                        step=step,
                        object_key=key,
                        sha256=info.sha256,
                        size_bytes=info.size_bytes,
                        metrics=metrics,
                    )
                )
            else:  # the same step, redone after a resume: the same state, rewritten
                existing.sha256, existing.size_bytes, existing.metrics = info.sha256, info.size_bytes, metrics
            self.bill(session, self.context.adapter_name)
            emit_event(
                session,
                self.context.job_id,
                f"Checkpoint saved at step {step}{self._in_stage()}",
                data={"step": step, **self._label()},
            )

    def _label(self) -> dict[str, int]:
        """What events and checkpoints of a chained job carry: the stage's number."""
        return {"stage": self.context.stage.number} if self.context.chained else {}

    def _in_stage(self) -> str:
        stage = self.context.stage
        return f" (stage {stage.number}/{len(self.context.stages)})" if self.context.chained else ""

    def _require_ours(self, session: Session) -> TrainingJob:
        job = session.execute(
            select(TrainingJob).where(*held_by(TrainingJob, self.context.job_id, self.context.worker_id))
        ).scalar_one_or_none()
        if job is None:
            raise LostLease(self.context.job_id)
        return job

    # ---- the step callback ------------------------------------------------------------------

    def on_step(self, training: Training, report: StepReport) -> bool:
        """Record the step and its cost; checkpoint when due; False stops the recipe: a cancel
        was requested, or the next step would take the job past its allowance (it checkpoints
        and fails with `budget_exhausted`)."""
        context = self.context
        trained = int(report.metrics.get("trained_tokens", report.metrics.get("tokens", 0)))
        sampled = int(report.metrics.get("tokens", 0)) if context.plan.method == "rl" else 0
        context.trained_tokens += trained
        step_s = self._device_seconds()
        if context.full:
            context.unbilled_device_s += step_s
        else:
            context.unbilled_trained += trained
            context.unbilled_sampled += sampled
        stage, plan = context.stage, context.plan
        step = stage.offset + report.step  # the job's step
        where = f"Step {step}/{context.total_steps}"
        data: dict[str, Any] = {"step": step}
        if context.chained:
            where += f" (stage {stage.number}/{len(context.stages)} {plan.method}, step {report.step}/{plan.steps})"
            data |= {"stage": stage.number, "stage_step": report.step}
        with session_scope(self.settings.database) as session:
            job = self._require_ours(session)
            job.completed_steps = step
            job.trained_tokens = context.trained_tokens
            job.sampled_tokens += sampled
            job.heartbeat_at = utcnow()
            prices = pricing.prices_for(session, context.base_model)
            if context.full:
                step_cost = prices.device_seconds(step_s)
            else:
                step_cost = prices.of("trained", trained) + prices.of("sampled", sampled)
            billed = pricing.resource_cost(session, "training_job", job.id)
            job.cost_usd = billed + self._unbilled_cost(prices)
            emit_event(
                session,
                job.id,
                f"{where}: "
                + ", ".join(f"{name} {value:.4g}" for name, value in report.metrics.items() if name in SHOWN),
                type="metrics",
                data={**data, "learning_rate": report.learning_rate, **_rounded(report.metrics)}
                | ({"samples": report.samples} if report.samples else {}),
            )
            cancel = job.cancel_requested_at is not None
            allowance = spend.job_allowance(session, job, billed)
            last = report.step == plan.steps and stage.number == len(context.stages)
            over = allowance is not None and not last and job.cost_usd + step_cost > allowance.usd
        due = report.step % plan.checkpoint_interval == 0 and report.step < plan.steps
        if (due or over) and not cancel:
            self.save_checkpoint(training, report)
        if over and not cancel:
            assert allowance is not None
            self.stop_at_budget(step, allowance)
            return False
        return not cancel

    def _device_seconds(self) -> float:
        """Seconds since the last step ended (or training began): what a full-parameter step held
        its device, its checkpoint included."""
        now = time.perf_counter()
        seconds, self._clock = now - self._clock, now
        return seconds

    def _unbilled_cost(self, prices: pricing.Prices) -> float:
        context = self.context
        return (
            prices.of("trained", context.unbilled_trained)
            + prices.of("sampled", context.unbilled_sampled)
            + prices.device_seconds(context.unbilled_device_s)
        )

    def bill(self, session: Session, model_ref: str) -> None:
        """Record the usage of the steps trained since the last record, priced now. Device time
        is recorded in whole seconds; the fraction left waits for the next record."""
        context = self.context
        device_s = int(context.unbilled_device_s)
        context.unbilled_device_s -= device_s
        usage = (("trained", context.unbilled_trained), ("sampled", context.unbilled_sampled))
        for kind, tokens in (*usage, ("device_seconds", device_s)):
            if tokens:
                record_usage(
                    session,
                    organization_id=context.organization_id,
                    kind=kind,
                    tokens=tokens,
                    base_model=context.base_model,
                    model_ref=model_ref,
                    resource_type="training_job",
                    resource_id=context.job_id,
                )
        context.unbilled_trained = context.unbilled_sampled = 0

    def stop_at_budget(self, step: int, allowance: spend.Allowance) -> None:
        """End the job, failed with `budget_exhausted`: its next step would cost more than
        `allowance` leaves. Its checkpoint at `step` was just saved."""
        with session_scope(self.settings.database) as session:
            job = self._require_ours(session)
            message = (
                f"Stopped at step {step}/{self.context.total_steps}: it has cost ${job.cost_usd:.4f}, and another step "
                f"would pass the ${allowance.usd:.4f} that {allowance.source} allows. Its checkpoint at step {step} "
                "is kept. Raise the budget or the limit (PATCH /v1/organization/spend_limits), or train fewer steps."
            )
            job.status, job.finished_at = "failed", utcnow()
            job.error = {"code": "budget_exhausted", "message": message, "param": "budget_usd"}
            emit_event(session, job.id, message, level="error", data={"step": step, "allowed_usd": allowance.usd})
            webhooks.job_event(session, job, self.send)
        self.stopped_at_budget = True

    # ---- the whole attempt ------------------------------------------------------------------

    def run(self) -> None:
        """Train the stages not yet done, in order; each finished stage registers its version."""
        context = self.context
        context.done = self._stage_versions()
        first = True
        for index, stage in enumerate(context.stages):
            if stage.number in context.done:
                continue
            context.current = index
            training = self.open_session()
            try:
                self._note_start(resume=first)
                first = False
                reports = self._train(training)
                finished = bool(reports) and reports[-1].step == stage.plan.steps
                if context.start_step == stage.plan.steps:
                    finished = True
                if not finished:
                    if not self.stopped_at_budget:
                        self.stop_cancelled()
                    return
                if not self.finish(training):
                    return  # cancelled between stages
            finally:
                if not context.full:  # a full-parameter copy is freed with its last reference
                    self.resident.close(self.session_id)
                del training

    def _note_start(self, *, resume: bool) -> None:
        """Events for the stage about to train: the attempt's start or resume, and for a chained
        job the stage and what it starts from."""
        context, stage = self.context, self.context.stage
        at = stage.offset + context.start_step  # the job's step the session holds
        with session_scope(self.settings.database) as session:
            job = self._require_ours(session)
            if resume and job.attempts > 1:
                redone = max(0, job.completed_steps - at)
                where = f"from checkpoint at step {at}" if context.start_step else f"from step {at}"
                job.steps_redone += redone
                emit_event(
                    session,
                    job.id,
                    f"Resuming {where}{self._in_stage()} on {context.worker_id} "
                    f"(attempt {job.attempts}; {redone} steps redone)",
                    level="warning",
                    data={"start_step": at, "steps_redone": redone, "attempt": job.attempts, **self._label()},
                )
            elif resume:
                emit_event(session, job.id, f"Training started on {context.worker_id}")
            if resume:
                spec = JobSpec.model_validate(job.spec)
                spec.base_load_seconds = round(self.load_s, 3)
                job.spec = spec.stored()
            if context.chained and not context.start_step:
                parent, _ = self.parent_of(stage)
                source = "a fresh adapter" if parent is None else catalog.model_ref_of_id(session, parent)
                emit_event(
                    session,
                    job.id,
                    f"Stage {stage.number}/{len(context.stages)} ({stage.plan.method}, {stage.plan.steps} steps) "
                    f"starts from {source}",
                    data={"stage": stage.number, "parent_version_id": parent},
                )
            job.completed_steps = at
            job.trained_tokens = context.trained_tokens

    def _train(self, training: Training) -> list[StepReport]:
        from mint.evals.agent_environments import make_environment
        from mint.evals.graders import GraderSpec
        from mint.trainer.methods import METHODS
        from mint.trainer.recipes.common import RecipeInputs

        def on_step(report: StepReport) -> bool:
            return self.on_step(training, report)

        inputs = RecipeInputs(
            # A full-parameter trainer runs SFT only (the plan says so at create), whose recipe
            # calls no more than the methods both trainers have.
            training=cast("TrainingSession", training),
            tokenizer=self.resident.tokenizer,
            reference=self.resident,
            rows=self._rows(),
            seed=self.context.seed,
            start_step=self.context.start_step,
            on_step=on_step,
            grader_for=GraderSpec.model_validate,
            environment_for=make_environment,
            rl_max_steps_without_signal=self.settings.rl_max_steps_without_signal,
        )
        self._clock = time.perf_counter()  # device time is billed from the first step on
        return METHODS.run(self.context.plan, inputs)

    def _rows(self) -> list[dict[str, Any]]:
        with session_scope(self.settings.database) as session:
            dataset = session.get(Dataset, self.context.stage.training_file)
            assert dataset is not None
            session.expunge(dataset)
        return datasets.read_rows(self.store, dataset)

    def _version_archive(self, training: Training) -> tuple[bytes, dict[str, Any]]:
        """What the stage's version stores: the PEFT adapter and its LoRA settings as saved (the
        registry's defaults resolved), or a full-parameter stage's whole model (no LoRA)."""
        from mint.trainer.full import FullParameterTrainer

        with tempfile.TemporaryDirectory(prefix="mint-adapter-") as scratch:
            if isinstance(training, FullParameterTrainer):
                training.save_weights(Path(scratch))
                return pack_folder(Path(scratch)), {}
            training.save_weights_for_sampler(Path(scratch))
            saved = json.loads((Path(scratch) / "adapter_config.json").read_text())
            lora = {
                "rank": saved.get("r", 0),
                "alpha": saved.get("lora_alpha", 0),
                "targets": [*training.targets.target_modules, *training.targets.target_parameters],
            }
            return adapters.archive_adapter(Path(scratch)), lora

    def finish(self, training: Training) -> bool:
        """Store the stage's version (an adapter, or a full-parameter stage's whole model), then
        in one transaction record it (with its lineage) and move the job on: to the next stage, or
        succeeded after the last. False when a cancel requested meanwhile stops the job between
        stages."""
        context, stage = self.context, self.context.stage
        last = stage.number == len(context.stages)
        parent, _ = self.parent_of(stage)
        archive, lora = self._version_archive(training)
        with session_scope(self.settings.database) as session:
            job = self._require_ours(session)
            dataset = session.get(Dataset, stage.training_file)
            version = adapters.register_version(
                session,
                self.store,
                organization_id=context.organization_id,
                name=context.adapter_name,
                base_model=context.base_model,
                archive=archive,
                lora=lora,
                kind=context.training_type,
                training_job_id=job.id,
                parent_version_id=parent,
                metrics={
                    "optimizer_steps": training.step,
                    "trained_tokens": context.trained_tokens,
                    "method": stage.plan.method,
                    # lineage: what this version was trained on and how
                    "stage": stage.number,
                    "training_file": stage.training_file,
                    "training_file_sha256": dataset.sha256 if dataset is not None else None,
                    "plan": stage.plan.model_dump(mode="json"),
                },
            )
            ref = f"{context.adapter_name}@{version.version}"
            job.completed_steps, job.trained_tokens = stage.offset + stage.plan.steps, context.trained_tokens
            self.bill(session, ref)
            job.cost_usd = pricing.resource_cost(session, "training_job", job.id)
            context.done[stage.number] = (version.id, context.trained_tokens)
            if not last:
                emit_event(
                    session,
                    job.id,
                    f"Stage {stage.number}/{len(context.stages)} succeeded: {ref} ({training.step} optimizer steps)",
                    data={"stage": stage.number, "model": ref, "adapter_version_id": version.id},
                )
                if job.cancel_requested_at is None:
                    return True
                job.status, job.finished_at = "cancelled", utcnow()
                emit_event(session, job.id, f"Job cancelled after stage {stage.number}")
                webhooks.job_event(session, job, self.send, model=ref)
                return False
            job.status, job.finished_at = "succeeded", utcnow()
            job.result_adapter_version_id = version.id
            emit_event(
                session,
                job.id,
                f"Job succeeded: {ref} ({training.step} optimizer steps)",
                data={"model": ref, "adapter_version_id": version.id, **self._label()},
            )
            webhooks.job_event(session, job, self.send, model=ref)
            return True

    def stop_cancelled(self) -> None:
        with session_scope(self.settings.database) as session:
            job = self._require_ours(session)
            self.bill(session, self.context.adapter_name)
            job.cost_usd = pricing.resource_cost(session, "training_job", job.id)
            job.status, job.finished_at = "cancelled", utcnow()
            emit_event(session, job.id, f"Job cancelled after step {job.completed_steps}")
            webhooks.job_event(session, job, self.send)


SHOWN = ("loss", "reward", "reward_std", "groups_with_signal", "kl", "turns", "accuracy", "tokens_per_second")


def _rounded(metrics: dict[str, float]) -> dict[str, float]:
    return {name: round(float(value), 6) for name, value in metrics.items()}


def fail(
    settings: Settings, job_id: str, worker_id: str, code: str, message: str, send: Dispatch | None = None
) -> None:
    with session_scope(settings.database) as session:
        failed = rowcount(
            session.execute(
                update(TrainingJob)
                .where(*held_by(TrainingJob, job_id, worker_id))
                .values(status="failed", finished_at=utcnow(), error={"code": code, "message": message, "param": None})
            )
        )
        if failed:
            emit_event(session, job_id, f"Job failed: {message}", level="error")
            job = session.get(TrainingJob, job_id)
            assert job is not None
            webhooks.job_event(session, job, send)


def _failure_code(exc: MintError) -> str:
    """The job error code of a refusal met while training."""
    if isinstance(exc, InvalidRequest):
        return "invalid_from_adapter" if exc.param == "from_adapter" else "invalid_training_file"
    return exc.type


# The start of the event a job records each time it waits for capacity (they are counted).
CAPACITY_WAIT = "Waiting for capacity"


def wait_for_capacity(settings: Settings, job_id: str, worker_id: str, reason: str, send: Dispatch | None) -> str:
    """The worker had no free LoRA session slot for the job: hand it back to the queue, its
    attempt not counted, to be tried again after a wait that grows with each one; an event says
    why and when. The job stays `queued` (a cancel still works) until a worker has room."""
    with session_scope(settings.database) as session:
        waits = session.scalar(
            select(func.count())
            .select_from(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.message.startswith(CAPACITY_WAIT))
        )
        wait_s = capacity_wait_s(settings, int(waits or 0))
        task_id = f"{job_id}:{uuid.uuid4().hex[:12]}"
        if not hand_back(session, TrainingJob, job_id, worker_id, task_id=task_id, due_in_s=wait_s):
            return "lost-lease"
        job = session.get(TrainingJob, job_id)
        assert job is not None
        session.refresh(job)
        if job.attempts == 0:
            job.started_at = None  # it has not started yet
        emit_event(
            session,
            job_id,
            f"{CAPACITY_WAIT}: {reason}; trying again in {wait_s:g} s (a wait is not a failed attempt)",
            level="warning",
            data={"reason": "capacity", "waits": int(waits or 0) + 1, "retry_in_s": wait_s, "task_id": task_id},
        )
        session.commit()
        if send is not None:  # else the reconciler sends it once it is due
            send_job(job, send, countdown_s=wait_s)
    return "waiting-for-capacity"


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
            runner.release_idle_models(settings)  # slots of ended Tinker sessions first
            JobRun(settings, resident, context, send, load_s=load_s).run()
    except LostLease:
        log.warning("job %s is no longer this worker's; stopped", job_id)
        return "lost-lease"
    except NoCapacity as exc:
        log.info("job %s waits for capacity: %s", job_id, exc.message)
        return wait_for_capacity(settings, job_id, worker_id, exc.message, send)
    except MintError as exc:
        fail(settings, job_id, worker_id, _failure_code(exc), exc.message, send)
        return "failed"
    except Exception as exc:
        log.exception("job %s failed", job_id)
        fail(settings, job_id, worker_id, "internal_error", f"{type(exc).__name__}: {exc}", send)
        return "failed"
    log.info("job %s done in %.1f s", job_id, time.perf_counter() - started)
    return "done"

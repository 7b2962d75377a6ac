"""One attempt at a fine-tuning job on this worker's resident base (`JobRun`): its stages not yet
done trained in order, each from its own newest checkpoint (a resumed stage), the version the
previous stage registered, the job's `from_adapter` version (the first stage) or a fresh
adapter, through the method registry (`mint.trainer.methods`), which picks the recipe. Each
step records progress, metrics and cost and stops the recipe at a cancel or before the step
that would pass the job's allowance; a stage's optimizer starts fresh (another objective), and
RL's KL reference stays the base. Checkpoints, versions and endings are their own modules;
torch is imported only inside the methods that train."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mint.config import Settings
from mint.schemas.job_spec import JobSpec
from mint.schemas.plans import OnlineRlPlan
from mint.services import catalog, datasets
from mint.services.billing import prices as pricing
from mint.services.billing import spend
from mint.services.dispatch import Dispatch
from mint.services.evals.remote_environments import environments_for
from mint.services.evals.remote_rewards import graders_for
from mint.services.jobs.checkpoints import newest_checkpoint, save_checkpoint
from mint.services.jobs.claims import require_ours
from mint.services.jobs.context import JobContext
from mint.services.jobs.endings import finish_stage, stop_at_budget, stop_cancelled
from mint.services.jobs.events import emit_event, rounded
from mint.services.jobs.live_episodes import live_source, serve_result
from mint.services.jobs.usage import unbilled_cost
from mint.services.jobs.versions import done_stages, version_folder
from mint.storage.archives import unpack_folder
from mint.storage.db import session_scope
from mint.storage.objects import ObjectStore, object_store_for
from mint.storage.tables import Dataset, utcnow
from mint.trainer.recipes.common import StepReport

if TYPE_CHECKING:
    from mint.services.jobs.context import Training
    from mint.trainer.full import FullParameterTrainer
    from mint.trainer.session import ResidentBase
    from mint.trainer.training_session import TrainingSession

# The metrics a step's event message shows (its data carries them all).
SHOWN = (
    "loss",
    "reward",
    "reward_std",
    "groups_with_signal",
    "kl",
    "turns",
    "accuracy",
    "tokens_per_second",
    "episodes",
    "episodes_stale",
)


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

    # ---- the trainer ------------------------------------------------------------------------

    def open_session(self) -> Training:
        """The current stage's trainer: from its newest checkpoint, else from the version it starts
        from (the previous stage's, or the job's `from_adapter`), else fresh with the job's seed.
        A LoRA session on the resident base, or for a full-parameter job a private copy of it."""
        from mint.trainer.types import LoraOptions

        if self.session_id in {s.session_id for s in self.resident.sessions}:
            self.resident.close(self.session_id)  # left open by an attempt that failed in this process
        stage, context = self.context.stage, self.context
        parent, tokens_before = context.parent_of(stage)
        context.stage_tokens_at_start = context.tokens_at_start = context.trained_tokens = tokens_before
        context.start_step = 0
        snapshot = newest_checkpoint(self.settings, context.job_id, stage)
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
                folder = version_folder(self.settings, self.store, parent, Path(scratch), kind="full")
                spec = spec_with_weights(spec, folder)
            training = FullParameterTrainer(spec, self.settings.models_cache_dir, device=device)
            if snapshot is not None:
                step, key, tokens = snapshot
                unpack_folder(self.store.get_bytes(key), Path(scratch) / "state")
                training.load_state(Path(scratch) / "state")
                self._resumed_at(step, tokens)
        return training

    def _session_from_version(self, version_id: str) -> TrainingSession:
        """A session holding an adapter version's weights (its rank, alpha and targets), optimizer fresh."""
        with tempfile.TemporaryDirectory(prefix="mint-warm-") as scratch:
            folder = version_folder(self.settings, self.store, version_id, Path(scratch), kind="lora")
            return self.resident.create_session_from_adapter(folder, session_id=self.session_id)

    # ---- the step callback ------------------------------------------------------------------
    def on_step(self, training: Training, report: StepReport) -> bool:
        """Record the step and its cost; checkpoint when due; False stops the recipe: a cancel
        was requested, or the next step would take the job past its allowance (it checkpoints
        and fails with `budget_exhausted`)."""
        context = self.context
        trained = int(report.metrics.get("trained_tokens", report.metrics.get("tokens", 0)))
        sampled = int(report.metrics.get("tokens", 0)) if context.plan.method == "rl" else 0  # online: served
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
            job = require_ours(session, context)
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
            job.cost_usd = billed + unbilled_cost(context, prices)
            emit_event(
                session,
                job.id,
                f"{where}: "
                + ", ".join(f"{name} {value:.4g}" for name, value in report.metrics.items() if name in SHOWN),
                type="metrics",
                data={**data, "learning_rate": report.learning_rate, **rounded(report.metrics)}
                | ({"samples": report.samples} if report.samples else {}),
            )
            cancel = job.cancel_requested_at is not None
            allowance = spend.job_allowance(session, job, billed)
            last = report.step == plan.steps and stage.number == len(context.stages)
            over = allowance is not None and not last and job.cost_usd + step_cost > allowance.usd
        due = report.step % plan.checkpoint_interval == 0 and report.step < plan.steps
        if (due or over) and not cancel:
            save_checkpoint(self.settings, self.store, context, training, report)
        if over and not cancel:
            assert allowance is not None
            stop_at_budget(self.settings, context, step, allowance, self.send)
            self.stopped_at_budget = True
            return False
        return not cancel

    def _device_seconds(self) -> float:
        """Seconds since the last step ended (or training began): what a full-parameter step held
        its device, its checkpoint included."""
        now = time.perf_counter()
        seconds, self._clock = now - self._clock, now
        return seconds

    # ---- the whole attempt ------------------------------------------------------------------

    def run(self) -> None:
        """Train the stages not yet done, in order; each finished stage registers its version."""
        context = self.context
        context.done = done_stages(self.settings, context.job_id)
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
                        stop_cancelled(self.settings, context, self.send)
                    return
                if not finish_stage(self.settings, self.store, context, training, self.send):
                    return  # cancelled between stages
                if isinstance(stage.plan, OnlineRlPlan):
                    serve_result(self.settings, context, stage.plan, self.send)
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
            job = require_ours(session, context)
            if resume and job.attempts > 1:
                redone = max(0, job.completed_steps - at)
                where = f"from checkpoint at step {at}" if context.start_step else f"from step {at}"
                job.steps_redone += redone
                emit_event(
                    session,
                    job.id,
                    f"Resuming {where}{context.in_stage()} on {context.worker_id} "
                    f"(attempt {job.attempts}; {redone} steps redone)",
                    level="warning",
                    data={"start_step": at, "steps_redone": redone, "attempt": job.attempts, **context.label()},
                )
            elif resume:
                emit_event(session, job.id, f"Training started on {context.worker_id}")
            if resume:
                spec = JobSpec.model_validate(job.spec)
                spec.base_load_seconds = round(self.load_s, 3)
                job.spec = spec.stored()
            if context.chained and not context.start_step:
                parent, _ = context.parent_of(stage)
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
        from mint.trainer.methods import METHODS
        from mint.trainer.recipes.common import RecipeInputs

        live, count = None, None
        if self.context.plan.method == "online_rl":  # learns from a deployment's episodes, not rows
            live, count = live_source(self.settings, self.store, self.context, training, self.send)

        def on_step(report: StepReport) -> bool:
            if count is not None:  # an online job's feed counts what it left out
                count(report)
            return self.on_step(training, report)

        inputs = RecipeInputs(
            # A full-parameter trainer runs SFT only (the plan says so at create), whose recipe
            # calls no more than the methods both trainers have.
            training=cast("TrainingSession", training),
            tokenizer=self.resident.tokenizer,
            reference=self.resident,
            rows=self._rows() if live is None else [],
            seed=self.context.seed,
            start_step=self.context.start_step,
            on_step=on_step,
            grader_for=graders_for(self.settings, self.context.organization_id),
            environment_for=environments_for(self.settings, self.context.organization_id),
            rl_max_steps_without_signal=self.settings.rl_max_steps_without_signal,
            live=live,
        )
        self._clock = time.perf_counter()  # device time is billed from the first step on
        return METHODS.run(self.context.plan, inputs)

    def _rows(self) -> list[dict[str, Any]]:
        with session_scope(self.settings.database) as session:
            dataset = session.get(Dataset, self.context.stage.training_file)
            assert dataset is not None
            session.expunge(dataset)
        return datasets.read_rows(self.store, dataset)

"""How a fine-tuning job is shown: OpenAI's job object (`mint.schemas.fine_tuning.FineTuningJob`)
from the row and its spec, with its `method` and hyperparameters from its plan, its estimate and
its expected finish, and for a chained job each stage's status, progress and version. Pure: the
caller reads the versions (`mint.services.jobs.versions`) and passes them in.

**Time you can see.** A job shows how long it has run (`elapsed_s`) and how long it has left
(`eta_s`, and `estimated_finish`): from its estimate until its first step finished, then from its
own measured rate, the seconds since it started less its worker's loading of the base, per step
done (`job_timing`). The estimate made at create is a guess until jobs of its base and method
have finished here; a job's own steps correct it within a step.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mint.schemas.job_spec import JobSpec, StoredStage
from mint.services.billing.prices import BASIS_MEASURED, basis_of
from mint.services.jobs.plans import TYPE_OF_METHOD
from mint.storage.tables import TrainingJob, as_utc

# The RL plan's own knobs, shown with the job's hyperparameters (null: the platform's default).
RL_HYPERPARAMETERS = (
    "group_size",
    "max_tokens",
    "temperature",
    "kl_beta",
    "max_steps_without_signal",
    "max_turns",
    "max_steps_off_policy",
)
# An online RL plan's own knobs, likewise.
ONLINE_RL_HYPERPARAMETERS = ("publish_every", "baseline", "reward_timeout_s", "max_wait_s", "loss_fn", "loss_fn_config")


def method_view(kind: str, plan: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """OpenAI's `method` object of a plan, and the plan's common hyperparameters."""
    hyperparameters = {key: plan[key] for key in ("batch_size", "learning_rate_multiplier", "n_epochs") if key in plan}
    method_type = TYPE_OF_METHOD[kind]
    extra = {key: plan[key] for key in ("beta", *RL_HYPERPARAMETERS, *ONLINE_RL_HYPERPARAMETERS) if key in plan}
    method: dict[str, Any] = {"type": method_type, method_type: {"hyperparameters": hyperparameters | extra}}
    if kind == "rl":
        method[method_type]["grader"] = plan.get("grader")
        method[method_type]["environment"] = plan.get("environment")
    if kind == "online_rl":
        method[method_type]["deployment"] = plan.get("deployment_id")
        method[method_type]["serve"] = plan.get("serve")
    return method, hyperparameters


# A stage's version: (adapter version id, `adapter@version`), by stage number (from 1).
StageVersions = Mapping[int, tuple[str, str]]


def _stages_view(job: TrainingJob, stages: Sequence[StoredStage], versions: StageVersions) -> list[dict[str, Any]]:
    """Each stage of a chained job (`stages`, its spec's) with its status, progress and the version it made."""
    views: list[dict[str, Any]] = []
    offset, ended = 0, job.status in ("succeeded", "failed", "cancelled")
    current = next((number for number in range(1, len(stages) + 1) if number not in versions), None)
    for number, stage in enumerate(stages, start=1):
        plan = stage.plan
        steps = int(plan["steps"])
        if number in versions:
            status = "succeeded"
        elif number == current:
            status = "queued" if job.status == "validating_files" else job.status
        else:
            status = "skipped" if ended else "pending"
        version_id, ref = versions.get(number, (None, None))
        views.append(
            {
                "stage": number,
                "method": method_view(plan["method"], plan)[0],
                "training_file": stage.training_file,
                "validation_file": stage.validation_file,
                "status": status,
                "total_steps": steps,
                "completed_steps": min(steps, max(0, job.completed_steps - offset)),
                "adapter_version_id": version_id,
                "fine_tuned_model": ref,
            }
        )
        offset += steps
    return views


ENDED = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Timing:
    """How long a job has run and has left (seconds), when it should finish (unix seconds), and
    what the time left rests on (`eta_basis`)."""

    elapsed_s: float | None
    eta_s: float | None
    finish_at: float | None
    eta_basis: str | None


def job_timing(
    *,
    status: str,
    now: float,
    started_at: float | None,
    finished_at: float | None,
    completed_steps: int,
    total_steps: int,
    base_load_s: float = 0.0,
    estimate_s: float | None = None,
    estimate_basis: str | None = None,
) -> Timing:
    """A job's timing from its status, its times (unix seconds) and its progress.

    Elapsed: from its start to now, or to its finish once finished; null while queued. Time
    left, of a running job only: once a step finished, the steps left at the mean time of the
    steps done, that is the seconds since it started less `base_load_s` (its worker loading the
    base, paid once) over `completed_steps`; before, its estimate (`estimate_s`) less the time it
    has trained, or null once it has run past its estimate with nothing measured (a guess that
    failed says so, rather than "0 s left"). Null when queued (the queue's wait is not known)
    and when finished."""
    if started_at is None:
        return Timing(None, None, None, None)
    if status in ENDED:
        end = finished_at if finished_at is not None else now
        return Timing(max(end - started_at, 0.0), None, None, None)
    elapsed = max(now - started_at, 0.0)
    if status != "running":
        return Timing(elapsed, None, None, None)
    trained = max(elapsed - base_load_s, 0.0)
    if completed_steps > 0 and total_steps > 0:
        left = max(total_steps - completed_steps, 0) * trained / completed_steps
        return Timing(elapsed, left, now + left, BASIS_MEASURED)
    if estimate_s is None or estimate_s <= trained:
        return Timing(elapsed, None, None, None)
    left = estimate_s - trained
    return Timing(elapsed, left, now + left, estimate_basis)


def _unix(moment: datetime | None) -> float | None:
    """Unix seconds of a stored time (a naive one is UTC, as the database keeps it)."""
    return as_utc(moment).timestamp() if moment is not None else None


def _timing(job: TrainingJob, spec: JobSpec, now: float) -> Timing:
    estimate = spec.estimate
    return job_timing(
        status=job.status,
        now=now,
        started_at=_unix(job.started_at),
        finished_at=_unix(job.finished_at),
        completed_steps=job.completed_steps,
        total_steps=job.total_steps,
        base_load_s=spec.base_load_seconds,
        estimate_s=estimate.seconds if estimate is not None else None,
        estimate_basis=(estimate.basis or basis_of(estimate.calibrated_on)) if estimate is not None else None,
    )


def job_view(
    job: TrainingJob,
    fine_tuned_model: str | None,
    stage_versions: StageVersions | None = None,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """The job in OpenAI's shape (see `mint.schemas.fine_tuning.FineTuningJob`); a chained
    job lists its stages, with the versions of those that succeeded (`stage_versions`); its
    timing as of `now` (unix seconds; default: the clock's)."""
    spec = JobSpec.model_validate(job.spec)
    timing = _timing(job, spec, time.time() if now is None else now)
    method, hyperparameters = method_view(job.method, spec.plan)
    error = job.error
    return {
        "id": job.id,
        "created_at": job.created_at,
        "finished_at": job.finished_at,
        "started_at": job.started_at,
        "model": job.base_model,
        "fine_tuned_model": fine_tuned_model,
        "organization_id": job.organization_id,
        "status": job.status,
        "training_file": job.training_dataset_id,
        "validation_file": job.validation_dataset_id,
        "hyperparameters": hyperparameters,
        "method": method,
        "seed": job.seed,
        "suffix": job.suffix,
        "metadata": spec.metadata or None,
        "trained_tokens": job.trained_tokens if job.status == "succeeded" else None,
        "estimate": spec.estimate.public() if spec.estimate is not None else None,
        "cost_usd": round(job.cost_usd, 6),
        "budget_usd": spec.budget_usd,
        "estimated_finish": int(timing.finish_at) if timing.finish_at is not None else None,
        "elapsed_s": round(timing.elapsed_s, 1) if timing.elapsed_s is not None else None,
        "eta_s": round(timing.eta_s, 1) if timing.eta_s is not None else None,
        "eta_basis": timing.eta_basis,
        "error": error,
        "training_type": spec.training_type,
        "lora": spec.lora,
        "total_steps": job.total_steps,
        "completed_steps": job.completed_steps,
        "attempts": job.attempts,
        "steps_redone": job.steps_redone,
        "adapter_version_id": job.result_adapter_version_id,
        "from_adapter": spec.from_adapter.ref if spec.from_adapter is not None else None,
        "stages": _stages_view(job, spec.stages, stage_versions or {}) if spec.stages is not None else None,
    }

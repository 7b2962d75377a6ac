"""How a fine-tuning job is shown: OpenAI's job object (`mint.schemas.fine_tuning.FineTuningJob`)
from the row and its spec, with its `method` and hyperparameters from its plan, its estimate and
its expected finish, and for a chained job each stage's status, progress and version. Pure: the
caller reads the versions (`mint.services.jobs.versions`) and passes them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mint.schemas.job_spec import JobSpec, StoredEstimate, StoredStage
from mint.services.jobs.plans import TYPE_OF_METHOD
from mint.storage.tables import TrainingJob

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


def method_view(kind: str, plan: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """OpenAI's `method` object of a plan, and the plan's common hyperparameters."""
    hyperparameters = {key: plan[key] for key in ("batch_size", "learning_rate_multiplier", "n_epochs") if key in plan}
    method_type = TYPE_OF_METHOD[kind]
    extra = {key: plan[key] for key in ("beta", *RL_HYPERPARAMETERS) if key in plan}
    method: dict[str, Any] = {"type": method_type, method_type: {"hyperparameters": hyperparameters | extra}}
    if kind == "rl":
        method[method_type]["grader"] = plan.get("grader")
        method[method_type]["environment"] = plan.get("environment")
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


def _estimated_finish(job: TrainingJob, estimate: StoredEstimate | None) -> int | None:
    """OpenAI's `estimated_finish` (unix seconds) of a running job: its start plus the estimate."""
    if job.status != "running" or job.started_at is None or estimate is None:
        return None
    return int(job.started_at.timestamp() + estimate.seconds)


def job_view(
    job: TrainingJob, fine_tuned_model: str | None, stage_versions: StageVersions | None = None
) -> dict[str, Any]:
    """The job in OpenAI's shape (see `mint.schemas.fine_tuning.FineTuningJob`); a chained
    job lists its stages, with the versions of those that succeeded (`stage_versions`)."""
    spec = JobSpec.model_validate(job.spec)
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
        "estimated_finish": _estimated_finish(job, spec.estimate),
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

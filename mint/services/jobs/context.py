"""What one attempt at a fine-tuning job knows: the job's stages, read back from its row and
validated again (`stages_of`, `stored_plan`), and where the attempt is in them (`JobContext`):
ids, the current stage, the step its trainer starts from, and the tokens and device time not
billed yet, and what a chained job's events carry of its stage. The attempt
(`mint.services.jobs.training.JobRun`) moves it on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mint.errors import InvalidRequest
from mint.schemas.job_spec import JobSpec, StoredStage
from mint.schemas.plans import TrainingPlan, parse_plan
from mint.storage.tables import TrainingJob

if TYPE_CHECKING:
    from mint.trainer.full import FullParameterTrainer
    from mint.trainer.training_session import TrainingSession

    # What trains a stage: a LoRA session on the resident base, or a full-parameter copy of it.
    Training = TrainingSession | FullParameterTrainer


@dataclass(frozen=True)
class Stage:
    """One stage of a job: its number (from 1), plan and training file, and the job steps
    of the stages before it (its step `s` is the job's step `offset + s`)."""

    number: int
    plan: TrainingPlan
    training_file: str | None  # None: an online RL stage, which learns from a deployment's episodes
    offset: int


def stages_of(job: TrainingJob, spec: JobSpec | None = None) -> list[Stage]:
    """The job's stages from its row (`spec`: its spec, if read already) (one, of its method and
    plan, for a job without `stages`); `InvalidRequest` if a stored plan is refused."""
    spec = JobSpec.model_validate(job.spec) if spec is None else spec
    stored = spec.stages or [StoredStage(plan=spec.plan, training_file=job.training_dataset_id)]
    stages, offset = [], 0
    for number, entry in enumerate(stored, start=1):
        try:
            plan = stored_plan(entry.plan.get("method", job.method), entry.plan)
        except InvalidRequest as exc:
            if len(stored) == 1:
                raise
            raise InvalidRequest(f"stage {number}: {exc.message}", param=exc.param) from None
        stages.append(Stage(number=number, plan=plan, training_file=entry.training_file, offset=offset))
        offset += plan.steps
    return stages


@dataclass
class JobContext:
    """What one attempt at a job knows: ids, the stages, and where it is in them."""

    job_id: str
    organization_id: str
    base_model: str
    stages: list[Stage]
    lora: dict[str, Any]
    adapter_name: str
    seed: int
    worker_id: str
    training_type: str = "lora"  # or "full": every weight of a private copy of the base
    chained: bool = False
    from_version_id: str | None = None
    current: int = 0  # index of the stage being trained
    start_step: int = 0  # the stage's step the session starts from
    tokens_at_start: int = 0
    trained_tokens: int = 0
    stage_tokens_at_start: int = 0  # the job's trained tokens when the current stage began
    # Tokens of this attempt not yet in a usage record (billed at checkpoints and at the end).
    unbilled_trained: int = 0
    unbilled_sampled: int = 0
    # A full-parameter job bills the seconds it holds its device, not tokens.
    unbilled_device_s: float = 0.0
    # stage number -> (version id, the job's trained tokens then) of stages already done
    done: dict[int, tuple[str, int]] = field(default_factory=dict)

    @property
    def full(self) -> bool:
        return self.training_type == "full"

    @property
    def stage(self) -> Stage:
        return self.stages[self.current]

    @property
    def plan(self) -> TrainingPlan:
        return self.stage.plan

    @property
    def total_steps(self) -> int:
        return sum(stage.plan.steps for stage in self.stages)

    def parent_of(self, stage: Stage) -> tuple[str | None, int]:
        """The version `stage` starts from (None: a fresh adapter) and the job's trained tokens then."""
        if stage.number == 1:
            return self.from_version_id, 0
        return self.done[stage.number - 1]

    def label(self) -> dict[str, int]:
        """What events and checkpoints of a chained job carry: the stage's number."""
        return {"stage": self.stage.number} if self.chained else {}

    def in_stage(self) -> str:
        """The ` (stage n/N)` an event message of a chained job names its stage with."""
        return f" (stage {self.stage.number}/{len(self.stages)})" if self.chained else ""

    @classmethod
    def claimed(cls, job: TrainingJob, worker_id: str) -> JobContext:
        """The context of a job this worker just claimed; `InvalidRequest` if a stored plan is refused."""
        spec = JobSpec.model_validate(job.spec)
        if spec.adapter_name is None:  # create_job records it on every job
            raise KeyError("the job's spec has no adapter_name")
        return cls(
            job_id=job.id,
            organization_id=job.organization_id,
            base_model=job.base_model,
            stages=stages_of(job, spec),
            lora=dict(spec.lora),
            adapter_name=spec.adapter_name,
            seed=job.seed,
            worker_id=worker_id,
            training_type=spec.training_type,
            chained=spec.chained,
            from_version_id=spec.from_adapter.adapter_version_id if spec.from_adapter is not None else None,
        )


def stored_plan(method: str, stored: Mapping[str, Any]) -> TrainingPlan:
    """A job's plan as read back from its row, validated again; `InvalidRequest` names the field.

    Rows written before plans named their method carry it only in the `method` column.
    """
    return parse_plan({"method": method, **stored})

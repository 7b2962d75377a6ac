"""Auto mode (`/v1/autotune`): a goal, a budget and constraints in; trials (ordinary jobs and
eval runs) chosen by a search, and the best adapter version out, with every decision's reason."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mint.schemas.common import ID_PATTERN, MAX_SEED, RequestModel
from mint.schemas.evals import SPLIT_PATTERN, ResourceId, Timestamp
from mint.schemas.fine_tuning import TrainingType

AutotuneMethod = Literal["sft", "dpo", "rl"]
AutotuneStatus = Literal["queued", "running", "succeeded", "stopped", "failed", "cancelled"]
# Trials of one run at most: each is a job and an eval run.
MAX_TRIALS = 64
MAX_BUDGET_USD = 1_000_000.0
MAX_BUDGET_S = 30 * 24 * 3600
MAX_AUTOTUNE_RANK = 128
# Bases one run considers at most, `model` included: each costs two eval runs and a trial.
MAX_BASES = 4


class _Strict(RequestModel):
    model_config = ConfigDict(extra="forbid")


class AutotuneSplits(_Strict):
    """Which splits of the benchmark version play which part: training data comes from `train`
    (its failures are mined), trials are chosen on `dev`, and only the final comparison reads
    `heldout`. A version without `dev` gets one: Mint makes a new version whose `dev` is a
    quarter of `train`'s tasks, by content hash."""

    train: str = Field(default="train", max_length=50, pattern=SPLIT_PATTERN)
    dev: str = Field(default="dev", max_length=50, pattern=SPLIT_PATTERN)
    heldout: str = Field(default="heldout", max_length=50, pattern=SPLIT_PATTERN)

    @model_validator(mode="after")
    def _distinct(self) -> AutotuneSplits:
        if len({self.train, self.dev, self.heldout}) < 3:
            raise ValueError("splits.train, splits.dev and splits.heldout must be three different splits")
        return self


class AutotuneTarget(_Strict):
    """What counts as done: a held-out pass rate, or (with `deployment`) a pass-rate gain over
    the version that deployment serves now."""

    pass_rate: float | None = Field(default=None, ge=0.0, le=1.0, description="Held-out pass rate to reach.")
    delta_over_production: float | None = Field(
        default=None, ge=-1.0, le=1.0, description="Held-out pass-rate gain over `deployment`'s version to reach."
    )
    deployment: str | None = Field(default=None, max_length=200, pattern=ID_PATTERN)

    @model_validator(mode="after")
    def _one_target(self) -> AutotuneTarget:
        if (self.pass_rate is None) == (self.delta_over_production is None):
            raise ValueError("give exactly one of target.pass_rate and target.delta_over_production")
        if self.delta_over_production is not None and self.deployment is None:
            raise ValueError("target.delta_over_production needs target.deployment: the deployment to beat")
        return self


class AutotuneBudget(_Strict):
    """What the run may spend: money (priced as the organization's jobs are), time, or both."""

    usd: float | None = Field(default=None, gt=0, le=MAX_BUDGET_USD, description="Money for trials and evals.")
    seconds: int | None = Field(default=None, ge=1, le=MAX_BUDGET_S, description="Wall time from the start.")

    @model_validator(mode="after")
    def _some_budget(self) -> AutotuneBudget:
        if self.usd is None and self.seconds is None:
            raise ValueError("give budget.usd, budget.seconds or both")
        return self


ALL_METHODS: tuple[AutotuneMethod, ...] = ("sft", "dpo", "rl")
LORA_ONLY: tuple[TrainingType, ...] = ("lora",)


class AutotuneConstraints(_Strict):
    methods: list[AutotuneMethod] = Field(
        default_factory=lambda: list(ALL_METHODS), min_length=1, max_length=3, description="Methods allowed."
    )
    max_rank: int = Field(default=16, ge=1, le=MAX_AUTOTUNE_RANK, description="Largest LoRA rank tried.")
    training_types: list[TrainingType] = Field(
        default_factory=lambda: list(LORA_ONLY),
        min_length=1,
        max_length=2,
        description="`lora`, `full` or both. With both, SFT trials may train every weight (priced by device time) "
        "when the budget affords it; with `full` alone, every trial is full-parameter SFT.",
    )
    max_trials: int = Field(default=6, ge=1, le=MAX_TRIALS, description="Trials (jobs) at most.")
    patience: int = Field(
        default=3, ge=1, le=MAX_TRIALS, description="Stop after this many trials in a row without a better dev score."
    )
    deadline: datetime | None = Field(default=None, description="Stop by then, whatever the budget says.")
    max_steps: int = Field(default=32, ge=1, le=10_000, description="Most optimizer steps of one trial.")
    bases: list[Annotated[str, Field(max_length=100, pattern=ID_PATTERN)]] = Field(
        default_factory=list,
        max_length=MAX_BASES - 1,
        description="Other base models to consider besides `model`: each is evaluated on dev and held-out, "
        "its default trial is tried, and the search goes on from the best.",
    )

    @model_validator(mode="after")
    def _distinct_training_types(self) -> AutotuneConstraints:
        if len(set(self.training_types)) != len(self.training_types):
            raise ValueError("constraints.training_types lists a training type twice")
        if self.training_types == ["full"] and "sft" not in self.methods:
            raise ValueError(
                "constraints.training_types ['full'] trains SFT only, and constraints.methods has no 'sft': "
                "allow 'sft', or add 'lora' to training_types"
            )
        return self


class AutotuneCreate(_Strict):
    """Start an auto run on a base and a benchmark."""

    model: str = Field(max_length=100, pattern=ID_PATTERN, description="The base model.")
    benchmark_id: ResourceId
    version: int | None = Field(
        default=None, ge=1, le=1_000_000, description="The benchmark version; newest if omitted."
    )
    splits: AutotuneSplits = Field(default_factory=AutotuneSplits)
    target: AutotuneTarget
    budget: AutotuneBudget
    constraints: AutotuneConstraints = Field(default_factory=AutotuneConstraints)
    suffix: str | None = Field(
        default=None, max_length=48, pattern=r"^[a-z0-9][a-z0-9-]*$", description="Names the trials' adapter."
    )
    eval_max_tokens: int = Field(default=64, ge=1, le=8192, description="Largest assistant turn in the evals.")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="Seeds the search and the trials.")


class AutotuneDecision(BaseModel):
    at: Timestamp
    decision: str
    reason: str


class AutotuneTrialPublic(BaseModel):
    number: int
    method: str
    params: dict[str, Any]
    status: str
    job_id: str | None
    eval_id: str | None
    model: str | None = Field(description="The trial's adapter version (`name@N`) once its job succeeded.")
    dev_pass_rate: float | None
    dev_mean_score: float | None
    estimated_usd: float | None
    cost_usd: float | None


class AutotunePublic(BaseModel):
    id: str
    object: Literal["autotune.run"] = "autotune.run"
    model: str
    benchmark_id: str
    status: AutotuneStatus
    phase: str = Field(description="baseline, search, final or done: where the run is.")
    request: dict[str, Any]
    cost_usd: float = Field(description="Spent so far: trials' jobs and the run's evals, at the price table's rates.")
    elapsed_s: float
    best: dict[str, Any] | None = Field(description="The best version so far: its trial, model and dev score.")
    result: dict[str, Any] | None = Field(
        description="When done: held-out pass rates of base, best (and production) and the paired bootstrap "
        "comparison of best against each, and why the run stopped."
    )
    decisions: list[AutotuneDecision]
    trials: list[AutotuneTrialPublic]
    error: dict[str, Any] | None
    warnings: list[str] = Field(
        default_factory=list,
        description="Judges grading the run's benchmark version whose agreement with the experts' reviews is "
        "below the threshold: the run's pass rates rest on their grades. They warn; they stop nothing.",
    )
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None

"""Wire types for fine-tuning jobs, shaped like OpenAI's so its client works unchanged.

A request is OpenAI's `fine_tuning.jobs.create` body (`model`, `training_file`, `method`
with `supervised` | `dpo` | `reinforcement` hyperparameters, `seed`, `suffix`, `metadata`)
plus Mint's own fields: the LoRA adapter (`lora`), an exact number of optimizer `steps`, an
absolute `learning_rate`, `checkpoint_interval`, a warm start (`from_adapter`: an adapter
version to continue training) and a chain of `stages` (each its own method, file and
schedule, each stage's result an adapter version of its own). Times are Unix seconds, as OpenAI's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from mint.schemas.common import ID_PATTERN, FiniteJson, RequestModel, WireModel
from mint.schemas.losses import RlLossName
from mint.schemas.plans import (
    DEFAULT_MAX_TURNS,
    MAX_BATCH_SIZE,
    MAX_BETA,
    MAX_EPOCHS,
    MAX_GROUP_SIZE,
    MAX_LEARNING_RATE_MULTIPLIER,
    MAX_STEPS,
    MAX_STEPS_OFF_POLICY,
    MAX_TURNS,
    EnvironmentSpecIn,
)

Auto = Literal["auto"]
MethodType = Literal["supervised", "dpo", "reinforcement", "online_rl"]
TrainingType = Literal["lora", "full"]
JobStatus = Literal["validating_files", "queued", "running", "succeeded", "failed", "cancelled"]
SUFFIX_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
# `adapter@version`, or `adapter` alone (its newest ready version).
ADAPTER_REF_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*(@[0-9]+)?$"
# Stages of one chained job: each holds a worker for its whole run, and a chain longer than a
# few stages is better run as separate jobs, each warm-started from the last.
MAX_STAGES = 4
StageStatus = Literal["pending", "queued", "running", "succeeded", "failed", "cancelled", "skipped"]


# The bounds are the plan's (`mint.schemas.plans`), so a request the schema takes can only be
# refused later for what its values lead to together (epochs x rows past MAX_STEPS, say).
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]
Epochs = Annotated[int, Field(ge=1, le=MAX_EPOCHS)]
Multiplier = Annotated[float, Field(gt=0, le=MAX_LEARNING_RATE_MULTIPLIER)]
Beta = Annotated[float, Field(gt=0, le=MAX_BETA)]
GroupSize = Annotated[int, Field(ge=1, le=MAX_GROUP_SIZE)]
# LoRA's update is scaled by alpha / rank; 4x the largest rank (1024) is past any scale in use.
MAX_LORA_ALPHA = 4096.0


class _Strict(RequestModel):
    model_config = ConfigDict(extra="forbid")


class SupervisedHyperparameters(_Strict):
    batch_size: BatchSize | Auto = Field(default="auto", description="Examples per optimizer step (`auto`: up to 8).")
    learning_rate_multiplier: Multiplier | Auto = Field(
        default="auto", description="Scales the base's default learning rate for the method."
    )
    n_epochs: Epochs | Auto = Field(default="auto", description="Passes over the training file (`auto`: 3).")


class DpoHyperparameters(SupervisedHyperparameters):
    beta: Beta | Auto = Field(default="auto", description="DPO temperature (`auto`: 0.1).")


class ReinforcementHyperparameters(SupervisedHyperparameters):
    group_size: GroupSize | Auto = Field(default="auto", description="Samples per prompt (`auto`: 4).")
    max_tokens: int = Field(default=32, ge=1, le=4096, description="Longest sampled completion.")
    temperature: float = Field(default=1.0, gt=0, le=2.0)
    kl_beta: float = Field(default=0.0, ge=0, le=MAX_BETA, description="KL penalty towards the base.")
    max_steps_without_signal: Annotated[int, Field(ge=1, le=MAX_STEPS)] | Auto = Field(
        default="auto",
        description="Steps in a row in which no group of samples has reward signal (all got the same reward) "
        "before the job stops with `no_reward_signal` (`auto`: the platform's MINT_RL_MAX_STEPS_WITHOUT_SIGNAL).",
    )
    loss_fn: RlLossName = Field(
        default="importance_sampling",
        description="The policy-gradient loss, by Tinker's name: importance_sampling, ppo, cispo, dro, gspo or "
        "stable_reinforce (weighed against the logprobs of the distribution each token was drawn from).",
    )
    loss_fn_config: dict[str, Annotated[float, Field(ge=-1e6, le=1e6)]] = Field(
        default_factory=dict,
        max_length=16,
        description="The loss's options, e.g. clip_low_threshold / clip_high_threshold (ppo, cispo, gspo), "
        "beta (dro), clip_high_threshold / kl_coeff (stable_reinforce).",
    )
    max_turns: int = Field(
        default=DEFAULT_MAX_TURNS,
        ge=1,
        le=MAX_TURNS,
        description="Assistant turns per episode in a row's tool environment (a prompt without one takes one).",
    )
    max_steps_off_policy: int = Field(
        default=0,
        ge=0,
        le=MAX_STEPS_OFF_POLICY,
        description="Asynchronous RL: how many steps ahead of training a copy of the policy may sample (its "
        "weights refreshed in memory after each update; the loss's importance ratio corrects for the lag). "
        "0: every step samples with the policy it trains.",
    )


class SupervisedMethod(_Strict):
    hyperparameters: SupervisedHyperparameters = Field(default_factory=SupervisedHyperparameters)


class DpoMethod(_Strict):
    hyperparameters: DpoHyperparameters = Field(default_factory=DpoHyperparameters)


class ReinforcementMethod(_Strict):
    grader: FiniteJson | None = Field(
        default=None,
        description='A grader of Mint\'s closed registry, e.g. `{"type": "numeric", "config": {"abs_tol": 0.01}}`, '
        "optionally with `penalties` for steps and tokens; "
        "needed unless `environment` gives the reward. Rows with their own grader in `metadata.grader` (RL "
        "prompts mined from a benchmark's failures) are scored by it.",
    )
    environment: EnvironmentSpecIn | None = Field(
        default=None,
        description='A Python environment registered in Mint\'s code, e.g. `{"name": "account_deletion"}`: each '
        "episode of a row that does not name or script its own acts in it, and it gives rewards.",
    )
    hyperparameters: ReinforcementHyperparameters = Field(default_factory=ReinforcementHyperparameters)


class OnlineRlHyperparameters(_Strict):
    batch_size: BatchSize | Auto = Field(default="auto", description="Rewarded episodes per step (`auto`: 8).")
    learning_rate_multiplier: Multiplier | Auto = Field(
        default="auto", description="Scales the base's default learning rate for RL."
    )
    publish_every: int = Field(default=1, ge=1, le=MAX_STEPS, description="Steps between published versions.")
    baseline: Literal["group", "task_mean"] = Field(
        default="group",
        description="group: episodes sharing a task key (X-Mint-Task) in one step form a group, each rewarded "
        "against the group's mean; task_mean: against the running mean reward of its task.",
    )
    reward_timeout_s: float = Field(
        default=3600,
        gt=0,
        le=30 * 86400,
        description="An episode not rewarded this long after its last turn is left out of training (and counted).",
    )
    max_wait_s: float = Field(
        default=600,
        gt=0,
        le=7 * 86400,
        description="How long a step waits for its episodes before the job fails with `no_episodes`.",
    )
    kl_beta: float = Field(default=0.0, ge=0, le=MAX_BETA, description="KL penalty towards the base.")
    max_steps_without_signal: Annotated[int, Field(ge=1, le=MAX_STEPS)] | Auto = Field(
        default="auto", description="Steps in a row without reward signal before the job stops."
    )
    loss_fn: RlLossName = Field(default="importance_sampling", description="The policy-gradient loss.")
    loss_fn_config: dict[str, Annotated[float, Field(ge=-1e6, le=1e6)]] = Field(default_factory=dict, max_length=16)
    max_steps_off_policy: int = Field(
        default=2,
        ge=0,
        le=MAX_STEPS_OFF_POLICY,
        description="How many updates behind the policy the version that sampled an episode may be; older "
        "episodes are dropped (and counted), newer ones corrected by the importance ratio.",
    )


class OnlineRlMethod(_Strict):
    deployment: str = Field(
        min_length=1, max_length=200, description="The deployment (name or id) whose live episodes it learns from."
    )
    serve: Literal["immediate", "register"] = Field(
        default="immediate",
        description="immediate: the deployment serves each published version at once (requests in flight finish "
        "on theirs); register: versions are registered for a promotion through the deployment's gate.",
    )
    hyperparameters: OnlineRlHyperparameters = Field(default_factory=OnlineRlHyperparameters)


class Method(_Strict):
    type: MethodType
    supervised: SupervisedMethod | None = None
    dpo: DpoMethod | None = None
    reinforcement: ReinforcementMethod | None = None
    online_rl: OnlineRlMethod | None = None


class LoraSpec(_Strict):
    """The adapter to train; omitted fields take the base's registry defaults."""

    rank: int | None = Field(default=None, ge=1, le=1024)
    alpha: float | None = Field(default=None, gt=0, le=MAX_LORA_ALPHA)
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True
    train_experts: bool = True
    target_modules: list[str] | None = None
    target_parameters: list[str] | None = None


class StageCreate(_Strict):
    """One stage of a chained job: its method and, where they differ from the job's, its own
    training file and schedule. A stage starts from the adapter the previous stage made."""

    method: Method = Field(description="supervised | dpo | reinforcement, with its hyperparameters (and grader).")
    training_file: str | None = Field(
        default=None, max_length=100, pattern=ID_PATTERN, description="This stage's dataset (default: the job's)."
    )
    validation_file: str | None = Field(default=None, max_length=100, pattern=ID_PATTERN)
    steps: int | None = Field(default=None, ge=1, le=MAX_STEPS, description="Optimizer steps (default: the job's).")
    learning_rate: float | None = Field(default=None, gt=0, le=1.0, description="Overrides the multiplier.")
    checkpoint_interval: int | None = Field(default=None, ge=1, le=MAX_STEPS)


class FineTuningJobCreate(_Strict):
    model: str = Field(max_length=100, pattern=ID_PATTERN, description="The base model, e.g. `tiny-glm-moe`.")
    training_file: str | None = Field(
        default=None,
        max_length=100,
        pattern=ID_PATTERN,
        description="A dataset (file) id; required unless every stage names its own.",
    )
    validation_file: str | None = Field(default=None, max_length=100, pattern=ID_PATTERN)
    method: Method | None = Field(default=None, description="supervised (default) | dpo | reinforcement.")
    hyperparameters: SupervisedHyperparameters | None = Field(
        default=None, description="OpenAI's older place for supervised hyperparameters."
    )
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    suffix: str | None = Field(
        default=None,
        max_length=64,
        pattern=SUFFIX_PATTERN,
        description="Names the adapter; a job with the same suffix adds a new version to it.",
    )
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    integrations: list[FiniteJson] | None = Field(default=None, max_length=16, description="Accepted and ignored.")
    # Mint's own fields.
    training_type: TrainingType = Field(
        default="lora",
        description="`lora` (default): a LoRA adapter on the shared resident base, billed by tokens trained. "
        "`full`: every weight of a private copy of the base trains (supervised stages only), billed by the "
        "seconds it holds the worker's device at the base's GPU-hour price; its version is a whole model, "
        "evaluated and downloaded like any version, but not deployed on multi-LoRA serving nodes.",
    )
    lora: LoraSpec = Field(default_factory=LoraSpec)
    steps: int | None = Field(default=None, ge=1, le=MAX_STEPS, description="Optimizer steps; overrides n_epochs.")
    learning_rate: float | None = Field(default=None, gt=0, le=1.0, description="Overrides the multiplier.")
    checkpoint_interval: int | None = Field(
        default=None, ge=1, le=MAX_STEPS, description="Steps between resumable checkpoints (`None`: about 5 per job)."
    )
    from_adapter: str | None = Field(
        default=None,
        max_length=200,
        pattern=ADAPTER_REF_PATTERN,
        description="Warm start: continue training this adapter version (`name@3`; `name`: its newest) of "
        "the same base, with its rank, alpha and targets. RL's KL penalty still pulls towards the base.",
    )
    stages: list[StageCreate] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_STAGES,
        description="Instead of `method`: stages run in order in this one job (e.g. SFT, then RL on the same "
        "prompts), each starting from the previous stage's adapter and registering its own version. A "
        "stage's unset `training_file`, `validation_file`, `steps`, `learning_rate` and `checkpoint_interval` "
        "take the job's.",
    )
    budget_usd: float | None = Field(
        default=None,
        ge=0,
        le=1e9,
        description="The most this job may cost: refused at create (402) when its estimate is more, stopped "
        "with a checkpoint (`budget_exhausted`) before a step would take it past. The organization's spend "
        "limits apply as well.",
    )


class JobEstimate(BaseModel):
    """What a job is expected to use and cost, before it runs."""

    object: Literal["fine_tuning.job.estimate"] = "fine_tuning.job.estimate"
    model: str
    trained_tokens: int
    sampled_tokens: int = Field(description="Tokens sampled by RL stages (0 for SFT and DPO).")
    steps: int
    seconds: float = Field(description="Claim to finish on one worker, queueing not included.")
    cost_usd: float
    calibrated_on: int = Field(
        description="Finished jobs of this base and method the cost model was calibrated on (the fewest over the "
        "job's stages); 0: the platform's defaults, before any such job ran here."
    )
    seconds_low: float | None = Field(
        default=None,
        description="The low end of the time it may take: the point figure times the smallest ratio of actual to "
        "estimated time seen (half of it, uncalibrated).",
    )
    seconds_high: float | None = Field(
        default=None,
        description="The high end of the time it may take: wide (x20 and more) while uncalibrated, the largest ratio "
        "of actual to estimated time of the calibrating jobs once calibrated.",
    )
    cost_usd_low: float | None = Field(default=None, description="The low end of what it may cost.")
    cost_usd_high: float | None = Field(default=None, description="The high end of what it may cost.")
    basis: str | None = Field(
        default=None,
        description="What the figures rest on: `uncalibrated: the platform's defaults`, or `calibrated on N finished "
        "jobs of this base and method`.",
    )
    prices: dict[str, float] = Field(description="The base's prices: USD per million tokens, and per GPU-hour.")
    allowed_usd: float | None = Field(
        description="The most the job may cost under its budget and the organization's spend limits; null: no limit."
    )
    limited_by: str | None = Field(description="Which limit sets `allowed_usd`.")


class JobError(BaseModel):
    code: str
    message: str
    param: str | None = None


def _unix(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


class JobStage(BaseModel):
    """One stage of a chained job: what it trains, how far it got, and the version it made."""

    stage: int = Field(description="1 for the first stage.")
    method: dict[str, Any]
    training_file: str | None
    validation_file: str | None
    status: StageStatus
    total_steps: int
    completed_steps: int
    adapter_version_id: str | None
    fine_tuned_model: str | None = Field(description="`adapter@version` this stage made, once it succeeded.")


class FineTuningJob(WireModel):
    """A fine-tuning job as OpenAI's client reads it, with Mint's progress fields."""

    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: datetime
    finished_at: datetime | None
    model: str
    fine_tuned_model: str | None = Field(description="`adapter@version` once the job succeeded: a model reference.")
    organization_id: str
    status: JobStatus
    training_file: str | None = Field(description="The dataset it trains on; null for an online RL job.")
    validation_file: str | None
    hyperparameters: dict[str, Any]
    method: dict[str, Any]
    seed: int
    suffix: str | None
    metadata: dict[str, str] | None = None
    trained_tokens: int | None
    error: JobError | None
    result_files: list[str] = Field(default_factory=list)
    estimated_finish: int | None = Field(
        default=None,
        description="When a running job is expected to finish (unix seconds): now plus `eta_s`.",
    )
    integrations: list[dict[str, Any]] | None = None
    # Mint's fields.
    training_type: TrainingType = "lora"
    lora: dict[str, Any]
    total_steps: int
    completed_steps: int
    attempts: int
    steps_redone: int
    adapter_version_id: str | None
    started_at: datetime | None
    from_adapter: str | None = Field(default=None, description="The adapter version this job started from.")
    stages: list[JobStage] | None = Field(default=None, description="A chained job's stages, in order.")
    estimate: dict[str, Any] | None = Field(
        default=None,
        description="What the job was estimated at when created (tokens, steps, seconds, cost_usd, their range "
        "`seconds_low`..`seconds_high`, `cost_usd_low`..`cost_usd_high`, and its `basis`).",
    )
    cost_usd: float = Field(default=0.0, description="What it has cost so far, at the price table's rates.")
    budget_usd: float | None = None
    elapsed_s: float | None = Field(
        default=None,
        description="Seconds since the job started (to its finish once finished); null while queued.",
    )
    eta_s: float | None = Field(
        default=None,
        description="Seconds left of a running job: from its own measured step time once a step finished, from its "
        "estimate before; null when queued, finished, or past its estimate with no step measured yet.",
    )
    eta_basis: str | None = Field(
        default=None,
        description="What `eta_s` (and `estimated_finish`) rest on: `measured: this job's first steps`, or the "
        "estimate's basis.",
    )

    @field_serializer("created_at", "finished_at", "started_at")
    def _times(self, moment: datetime | None) -> int | None:
        return _unix(moment)


class FineTuningJobEvent(WireModel):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: datetime
    level: Literal["info", "warning", "error"]
    message: str
    type: Literal["message", "metrics"]
    data: dict[str, Any]

    @field_serializer("created_at")
    def _time(self, moment: datetime) -> int | None:
        return _unix(moment)


class FineTuningJobCheckpoint(WireModel):
    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: datetime
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: dict[str, Any]
    step_number: int

    @field_serializer("created_at")
    def _time(self, moment: datetime) -> int | None:
        return _unix(moment)


class EventPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJobEvent]
    has_more: bool

"""Training plans: the concrete, typed description of what one fine-tuning job trains.

The API resolves a request into a plan (`auto` hyperparameters filled in, steps counted),
validates it, and stores it as JSON on the job's row (`spec["plan"]`); the worker validates
the stored JSON again into the same type before it trains, so a plan that no longer
validates fails its job with a message instead of reaching a recipe.

    plan = parse_plan({"method": "dpo", "steps": 20, "batch_size": 4, "beta": 0.1, ...})
    plan.beta  # a float, checked once

`method` tells the plans apart: `SftPlan | DpoPlan | RlPlan` is a union discriminated on it,
and `PLAN_TYPES` (method -> plan type) is read from that union, so adding a method here is
one class and one member of the union. The trainer's registry (`mint.trainer.methods`) maps
the same names to the recipes that run them. No torch here: the API process imports this.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mint.errors import InvalidRequest
from mint.schemas.common import FiniteJson, RequestModel
from mint.schemas.evals import GraderSpecIn
from mint.schemas.losses import RlLossName, check_loss_config

# The same ceiling as a request's explicit `steps`; also keeps `total_steps` in a 32-bit column.
MAX_STEPS = 1_000_000
# Each epoch is at least one step, so more epochs than steps could never fit the cap.
MAX_EPOCHS = MAX_STEPS
# Examples per step: a step's batch is held at once on one worker; OpenAI's own cap is 256.
MAX_BATCH_SIZE = 1024
# The methods' default rates are 1e-4 to 4e-4: 10,000x spans every rate up to the plan's cap
# of 1.0, which the resolved plan then checks.
MAX_LEARNING_RATE_MULTIPLIER = 10_000.0
# DPO's beta and RL's KL penalty scale a log-ratio; past 10 the sigmoid saturates at once
# (DPO) or the penalty drowns the reward (RL). Typical values are 0.01 to 0.5.
MAX_BETA = 10.0
# Samples per prompt of an RL step, all sampled on one worker.
MAX_GROUP_SIZE = 256
# Assistant turns of one RL episode (each a sampling call, its sequence growing every turn).
MAX_TURNS = 32
# Enough for a look-up, an action and an answer; a prompt without tools takes one turn anyway.
DEFAULT_MAX_TURNS = 4
# Steps an RL run's sampler copy may sample ahead of its training (asynchronous RL).
MAX_STEPS_OFF_POLICY = 8
ENVIRONMENT_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"


def known_loss_options(config: dict[str, float], info: ValidationInfo) -> dict[str, float]:
    """A plan's `loss_fn_config`, checked against its `loss_fn`'s options (a validator of the RL plans)."""
    if "loss_fn" in info.data:
        try:
            check_loss_config(info.data["loss_fn"], config)
        except InvalidRequest as exc:
            raise ValueError(exc.message) from None
    return config


class _Plan(BaseModel):
    """What every method's plan holds: the optimizer's schedule and the checkpoint cadence."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    steps: int = Field(ge=1, le=MAX_STEPS, description="Optimizer steps.")
    batch_size: int = Field(ge=1, le=MAX_BATCH_SIZE, description="Examples (pairs, prompts) per optimizer step.")
    # An int when the request gave epochs; a float when it gave `steps` (steps * batch / rows).
    n_epochs: int | float = Field(gt=0, le=MAX_EPOCHS, description="Passes over the training file.")
    learning_rate_multiplier: float = Field(
        gt=0, le=MAX_LEARNING_RATE_MULTIPLIER, description="The multiplier of the method's default rate."
    )
    learning_rate: float = Field(gt=0, le=1.0, description="The absolute peak learning rate.")
    checkpoint_interval: int = Field(ge=1, le=MAX_STEPS, description="Steps between resumable checkpoints.")


class SftPlan(_Plan):
    """Supervised fine-tuning on chat rows."""

    method: Literal["sft"] = "sft"


class DpoPlan(_Plan):
    """Direct preference optimisation on preference rows."""

    method: Literal["dpo"] = "dpo"
    beta: float = Field(gt=0, le=MAX_BETA, description="DPO temperature.")


class EnvironmentSpecIn(RequestModel):
    """A Python environment registered in Mint's code, by name, with its options."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(
        pattern=ENVIRONMENT_NAME_PATTERN, description="A registered environment, e.g. `account_deletion`."
    )
    config: FiniteJson = Field(default_factory=dict, description="Its options.")


class RlPlan(_Plan):
    """Group-normalised RL on prompt rows: each sample an episode of up to `max_turns` turns,
    rewarded by its environment and/or a grader of the closed registry."""

    method: Literal["rl"] = "rl"
    group_size: int = Field(ge=1, le=MAX_GROUP_SIZE, description="Samples per prompt.")
    max_tokens: int = Field(ge=1, le=4096, description="Longest sampled turn.")
    temperature: float = Field(gt=0, le=2.0, description="Sampling temperature.")
    kl_beta: float = Field(ge=0, le=MAX_BETA, description="KL penalty towards the base (0: none).")
    grader: GraderSpecIn | None = Field(
        default=None,
        description="Scores each episode; its options are checked by the grader registry. Needed unless "
        "`environment` gives the reward. A row with its own grader in `metadata.grader` (RL prompts mined from "
        "a benchmark's failures) is scored by that one.",
    )
    max_turns: int = Field(
        default=DEFAULT_MAX_TURNS,
        ge=1,
        le=MAX_TURNS,
        description="Assistant turns per episode; an episode also ends when its environment says so.",
    )
    environment: EnvironmentSpecIn | None = Field(
        default=None,
        description="The registered Python environment of rows that do not name or script their own.",
    )
    max_steps_without_signal: int | None = Field(
        default=None,
        ge=1,
        le=MAX_STEPS,
        description="Steps in a row in which no group has reward signal before the job stops with "
        "`no_reward_signal`; none: the worker's MINT_RL_MAX_STEPS_WITHOUT_SIGNAL.",
    )
    loss_fn: RlLossName = Field(default="importance_sampling", description="The policy-gradient loss.")
    loss_fn_config: dict[str, float] = Field(default_factory=dict, description="The loss's options over its defaults.")
    max_steps_off_policy: int = Field(
        default=0,
        ge=0,
        le=MAX_STEPS_OFF_POLICY,
        description="Steps a sampler copy of the policy may sample ahead while it trains (0: on policy).",
    )

    _known_keys = field_validator("loss_fn_config")(known_loss_options)

    @model_validator(mode="after")
    def _rewarded(self) -> RlPlan:
        if self.grader is None and self.environment is None:
            raise ValueError("an RL plan needs a grader, an environment that gives rewards, or both")
        return self


class OnlineRlPlan(_Plan):
    """Online RL from a deployment's live episodes: each step trains on `batch_size` rewarded
    episodes recorded token-exact on the serving path, importance-weighted against the logprobs
    the serving engine recorded, and every `publish_every` steps the policy becomes a version the
    deployment serves (`serve: immediate`) or that waits to be promoted (`serve: register`)."""

    method: Literal["online_rl"] = "online_rl"
    deployment_id: str = Field(
        min_length=1, max_length=100, description="The deployment whose episodes it learns from."
    )
    serve: Literal["immediate", "register"] = Field(
        description="immediate: the deployment serves each new version at once; register: versions wait for a "
        "promotion (through the deployment's gate)."
    )
    publish_every: int = Field(ge=1, le=MAX_STEPS, description="Steps between published versions.")
    baseline: Literal["group", "task_mean"] = Field(
        description="group: episodes of one task in a step form a group; task_mean: each task's running mean reward."
    )
    reward_timeout_s: float = Field(gt=0, le=30 * 86400, description="An episode unrewarded this long is left out.")
    max_wait_s: float = Field(gt=0, le=7 * 86400, description="How long a step waits for its episodes.")
    kl_beta: float = Field(ge=0, le=MAX_BETA, description="KL penalty towards the base (0: none).")
    max_steps_without_signal: int | None = Field(default=None, ge=1, le=MAX_STEPS)
    loss_fn: RlLossName = Field(default="importance_sampling", description="The policy-gradient loss.")
    loss_fn_config: dict[str, float] = Field(default_factory=dict, description="The loss's options over its defaults.")
    max_steps_off_policy: int = Field(
        ge=0,
        le=MAX_STEPS_OFF_POLICY,
        description="Updates an episode's version may lag the policy before it is dropped.",
    )

    _known_keys = field_validator("loss_fn_config")(known_loss_options)


TrainingPlan = Annotated[SftPlan | DpoPlan | RlPlan | OnlineRlPlan, Field(discriminator="method")]
PLAN_ADAPTER: TypeAdapter[TrainingPlan] = TypeAdapter(TrainingPlan)
# method name -> plan type, read from the union so the two cannot disagree.
PLAN_TYPES: dict[str, type[SftPlan | DpoPlan | RlPlan | OnlineRlPlan]] = {
    get_args(plan_type.model_fields["method"].annotation)[0]: plan_type
    for plan_type in get_args(get_args(TrainingPlan)[0])
}


def parse_plan(data: Mapping[str, Any]) -> TrainingPlan:
    """Validate a plan into its method's type; `InvalidRequest` names the first bad field."""
    try:
        return PLAN_ADAPTER.validate_python(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        # loc is (method, field, ...) for a field of a known method; () when `method` itself is bad.
        loc = error["loc"]
        if len(loc) < 2:
            raise InvalidRequest(f"plan method: {error['msg']}", param="method") from None
        field = str(loc[1])
        got = "" if error["type"] == "missing" else f" (got {error['input']!r})"
        raise InvalidRequest(f"plan {field}: {error['msg']}{got}", param=field) from None

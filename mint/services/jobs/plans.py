"""The typed plan a stage's request resolves to: its method's `auto` hyperparameters filled in
with the platform's defaults, its steps counted from its file's rows and its checkpoint interval
set, then every number checked (`mint.schemas.plans`). `create_job` stores it on the row; the
worker validates it again when it claims the job (`mint.services.jobs.context`).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from mint.errors import InvalidRequest
from mint.evals.agent_environments import check_environment_spec
from mint.evals.graders import reward_spec
from mint.schemas.fine_tuning import Method
from mint.schemas.plans import TrainingPlan, parse_plan

METHOD_OF_TYPE = {"supervised": "sft", "dpo": "dpo", "reinforcement": "rl", "online_rl": "online_rl"}
TYPE_OF_METHOD = {method: kind for kind, method in METHOD_OF_TYPE.items()}
# Defaults an `auto` hyperparameter takes.
DEFAULT_EPOCHS = 3
DEFAULT_BATCH = {"sft": 8, "dpo": 4, "rl": 4, "online_rl": 8}
DEFAULT_LEARNING_RATE = {"sft": 4e-4, "dpo": 1e-4, "rl": 1e-4, "online_rl": 1e-4}
DEFAULT_BETA = 0.1
DEFAULT_GROUP_SIZE = 4
CHECKPOINTS_PER_JOB = 5


def _resolve(value: Any, default: Any) -> Any:
    return default if value == "auto" else value


class Schedule(Protocol):
    """The schedule fields a job or one of its stages gives."""

    steps: int | None
    learning_rate: float | None
    checkpoint_interval: int | None


def resolve_online_plan(body: Schedule, method: Method, deployment_id: str) -> TrainingPlan:
    """An online RL stage's plan: it has no file to count steps from, so `steps` is required."""
    assert method.online_rl is not None
    if body.steps is None:
        raise InvalidRequest(
            "an online RL job trains as episodes arrive, with no file to count epochs from: give `steps`",
            param="steps",
        )
    hyper = method.online_rl.hyperparameters
    batch = _resolve(hyper.batch_size, DEFAULT_BATCH["online_rl"])
    multiplier = _resolve(hyper.learning_rate_multiplier, 1.0)
    return parse_plan(
        {
            "method": "online_rl",
            "batch_size": batch,
            "n_epochs": 1,
            "learning_rate_multiplier": multiplier,
            "learning_rate": body.learning_rate or DEFAULT_LEARNING_RATE["online_rl"] * multiplier,
            "steps": body.steps,
            "checkpoint_interval": body.checkpoint_interval or max(1, body.steps // CHECKPOINTS_PER_JOB),
            "deployment_id": deployment_id,
            "serve": method.online_rl.serve,
            "publish_every": hyper.publish_every,
            "baseline": hyper.baseline,
            "reward_timeout_s": hyper.reward_timeout_s,
            "max_wait_s": hyper.max_wait_s,
            "kl_beta": hyper.kl_beta,
            "max_steps_without_signal": _resolve(hyper.max_steps_without_signal, None),
            "loss_fn": hyper.loss_fn,
            "loss_fn_config": hyper.loss_fn_config,
            "max_steps_off_policy": hyper.max_steps_off_policy,
        }
    )


def resolve_plan(body: Schedule, method: Method, rows: int) -> TrainingPlan:
    """A stage's typed plan: `auto` values filled in, steps counted, every number checked.

    A plan the checks refuse (a non-finite or out-of-range value the request's fields led to,
    such as a NaN multiplier or more epochs than `MAX_STEPS` steps) is an `InvalidRequest`
    naming the plan's field.
    """
    kind = METHOD_OF_TYPE[method.type]
    section = getattr(method, method.type)
    hyper = section.hyperparameters if section is not None else None
    batch = min(_resolve(getattr(hyper, "batch_size", "auto"), DEFAULT_BATCH[kind]), rows)
    epochs = _resolve(getattr(hyper, "n_epochs", "auto"), DEFAULT_EPOCHS)
    multiplier = _resolve(getattr(hyper, "learning_rate_multiplier", "auto"), 1.0)
    steps = body.steps or epochs * math.ceil(rows / batch)
    plan: dict[str, Any] = {
        "method": kind,
        "batch_size": batch,
        "n_epochs": epochs if body.steps is None else steps * batch / rows,
        "learning_rate_multiplier": multiplier,
        "learning_rate": body.learning_rate or DEFAULT_LEARNING_RATE[kind] * multiplier,
        "steps": steps,
        "checkpoint_interval": body.checkpoint_interval or max(1, steps // CHECKPOINTS_PER_JOB),
    }
    if kind == "dpo":
        plan["beta"] = _resolve(getattr(hyper, "beta", "auto"), DEFAULT_BETA)
    if kind == "rl":
        assert method.reinforcement is not None
        rl = method.reinforcement.hyperparameters
        plan |= {
            "group_size": _resolve(rl.group_size, DEFAULT_GROUP_SIZE),
            "max_tokens": rl.max_tokens,
            "temperature": rl.temperature,
            "kl_beta": rl.kl_beta,
            "max_steps_without_signal": _resolve(rl.max_steps_without_signal, None),
            "loss_fn": rl.loss_fn,
            "loss_fn_config": rl.loss_fn_config,
            "max_turns": rl.max_turns,
            "max_steps_off_policy": rl.max_steps_off_policy,
        }
        if method.reinforcement.grader is not None:
            plan["grader"] = reward_spec(method.reinforcement.grader).model_dump()
        if method.reinforcement.environment is not None:
            environment = method.reinforcement.environment.model_dump()
            plan["environment"] = check_environment_spec(environment, "method.reinforcement.environment")
    return parse_plan(plan)

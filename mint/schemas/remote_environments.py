"""Wire types for environment servers: a team's environment (a `verifiers` one, served by
`mint env-server`), whose episodes Mint plays with its own model, one turn at a time.

An environment server is registered as an endpoint the team hosts (`/v1/reward_endpoints`: the
same URL, secret and signing as a reward server) and named by a task's or a job's environment
spec, `{"name": "remote", "config": {"endpoint": ..., "task": ...}}` (`RemoteEnvironmentConfig`).
Mint POSTs a signed JSON body whose `type` is one of:

- `environment.tasks` -> `{"tasks": [{"index", "id", "name", "prompt", "system_prompt"}, ...]}`:
  what the environment offers (for the team's own tooling; Mint names tasks by index);
- `environment.start` with `task` (the index) -> an `Observation`: the conversation of the
  episode's first model call (its system prompt, prompt and the tools it offers);
- `environment.step` with `episode` and `message` (the assistant's turn) -> the next
  `Observation`: the messages the environment added (tool results, a user's reply), or the end
  of the episode with its reward;
- `environment.close` with `episode` -> `{"closed": true}`: an episode Mint stops early (a
  turn limit, a context full), so that the server does not keep it.

The protocol's constants and answers live here, for both of its sides: Mint's caller
(`mint.services.evals.remote_environments`) and the team's server
(`mint.integrations.verifiers.server`).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

ENVIRONMENT_TASKS_TYPE = "environment.tasks"
ENVIRONMENT_START_TYPE = "environment.start"
ENVIRONMENT_STEP_TYPE = "environment.step"
ENVIRONMENT_CLOSE_TYPE = "environment.close"
ENVIRONMENT_REQUEST_TYPES = (
    ENVIRONMENT_TASKS_TYPE,
    ENVIRONMENT_START_TYPE,
    ENVIRONMENT_STEP_TYPE,
    ENVIRONMENT_CLOSE_TYPE,
)
# The name a task's or job's environment spec gives an environment server.
REMOTE_ENVIRONMENT = "remote"
# The largest answer Mint reads (an observation may carry a long tool result).
MAX_OBSERVATION_BYTES = 8 * 1024 * 1024
MAX_TASK_INDEX = 10_000_000
MAX_TIMEOUT_S = 600.0
MAX_RETRIES = 5


class RemoteEnvironmentConfig(BaseModel):
    """Which environment server plays a task's episodes, and which of its tasks.

    `endpoint` is the registered endpoint's name or id; `task` the index of the server's task
    (`environment.tasks`), which a job's environment may leave to its rows (each row naming its
    task in its own `environment`). A call (a start or a step) ends after `timeout_s`, retried up to
    `retries` times on a 5xx, a 429 or a connection error; the server answers a retried call
    as it answered the first, so no turn is played twice.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str = Field(
        min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$", description="The environment server's name or id."
    )
    task: int | None = Field(
        default=None, ge=0, le=MAX_TASK_INDEX, description="The index of the server's task this episode plays."
    )
    timeout_s: float = Field(default=120.0, gt=0.0, le=MAX_TIMEOUT_S, description="The deadline of one call.")
    retries: int = Field(default=2, ge=0, le=MAX_RETRIES, description="Retries after a 5xx, 429 or connection error.")


class Observation(BaseModel):
    """What an environment server answers a start or a step.

    While the episode goes on: `messages` (all of the conversation on a start; what the
    environment added since the model's last turn on a step) and the `tools` offered. Once it
    ended (`done`): its `reward` (the rubric's weighted sum), each named reward, metrics, and
    the errors the environment recorded.
    """

    model_config = ConfigDict(extra="ignore")

    episode: str = Field(min_length=1, max_length=200)
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    done: bool = False
    reward: float = 0.0
    rewards: dict[str, float] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)

    @field_validator("reward")
    @classmethod
    def _finite(cls, reward: float) -> float:
        if not math.isfinite(reward):
            raise ValueError(f"the reward must be a finite number, got {reward!r}")
        return reward

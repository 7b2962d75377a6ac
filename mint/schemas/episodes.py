"""Wire types of episodes: an agent's task on a deployment, recorded turn by turn token-exact,
and the reward given to it afterwards.

A client marks the requests of one episode with the `X-Mint-Episode` header (its own key for
the episode) and optionally `X-Mint-Task` (the task it works on: episodes of one task form an
RL group), or with the request field `episode` (`{"id": ..., "task": ...}`, sent with the
`openai` client's `extra_body`). A deployment records them when its capture has `tokens` on.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mint.schemas.common import LABEL_PATTERN, TEXT_PATTERN, FiniteJson, FiniteJsonValue, RequestModel, WireModel

EPISODE_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
EPISODE_HEADER = "X-Mint-Episode"
TASK_HEADER = "X-Mint-Task"
MAX_TURN_SCORES = 256
# A reward is any finite float; bounded like every number a request sends.
MAX_SCORE = 1e6
MAX_COMMENT = 10_000


class EpisodeMark(RequestModel):
    """Which episode a request belongs to: the client's key for it, and the task it works on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=EPISODE_KEY_PATTERN, description="The client's key for the episode, unique in the org.")
    task: str | None = Field(
        default=None, pattern=EPISODE_KEY_PATTERN, description="The task key: episodes sharing it form an RL group."
    )


class EpisodeReward(RequestModel):
    """The reward of a finished episode: a score (any finite float; [0, 1] by convention), or a
    grader of the registry (a judge's included) with its reference, run on the episode's
    messages; optionally a score per turn, a label and a comment. Given again, it replaces the last."""

    model_config = ConfigDict(extra="forbid")

    score: float | None = Field(
        default=None, ge=-MAX_SCORE, le=MAX_SCORE, description="The episode's reward (or give `grader`)."
    )
    grader: FiniteJson | None = Field(
        default=None,
        description='A grader of the registry, e.g. `{"type": "regex", "config": {"pattern": "shipped"}}` or a '
        "`judge` naming a model of the organization, run on what the model and the harness added after the first "
        "prompt; its score is the reward, its detail the comment unless one is given.",
    )
    reference: FiniteJsonValue = Field(default=None, description="The grader's reference (any JSON value).")
    turn_scores: list[Annotated[float, Field(ge=-MAX_SCORE, le=MAX_SCORE)]] | None = Field(
        default=None, max_length=MAX_TURN_SCORES, description="A score per turn, in order (as many as it has turns)."
    )
    label: str | None = Field(
        default=None, min_length=1, max_length=100, pattern=LABEL_PATTERN, description="e.g. `solved`, `gave_up`."
    )
    comment: str | None = Field(default=None, max_length=MAX_COMMENT, pattern=TEXT_PATTERN)

    @model_validator(mode="after")
    def _score_or_grader(self) -> EpisodeReward:
        if (self.score is None) == (self.grader is None):
            raise ValueError("give a score, or a grader (with its reference) to compute it, not both")
        return self


class EpisodeTurnPublic(BaseModel):
    """One turn of an episode, token-exact: the messages the harness added since the last turn
    (its tool results, a user's reply), the prompt ids the engine rendered, the ids it sampled
    with their logprobs, the version that sampled them, and the assistant message."""

    id: str = Field(description="The completion's id (`chatcmpl-...`).")
    index: int
    model: str = Field(description="The adapter version (or base) that sampled this turn.")
    revision: int = Field(description="The deployment's revision that served it.")
    added_messages: list[Any] = Field(description="Messages the harness sent that the previous turn had not.")
    message: dict[str, Any] | None = Field(description="The assistant message (tool calls parsed).")
    finish_reason: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    latency_ms: float
    created_at: datetime


class EpisodePublic(WireModel):
    """An episode: its key, task and deployment, its reward once given, and (read alone) its
    turns in order and its whole conversation, shaped like an eval trajectory."""

    id: str = Field(description="The client's key for the episode.")
    object: Literal["episode"] = "episode"
    deployment_id: str
    task: str | None
    status: Literal["open", "rewarded"]
    reward: float | None
    turn_scores: list[float] | None
    label: str | None
    comment: str | None
    rewarded_by: str | None
    rewarded_at: datetime | None
    steps: int = Field(description="Turns recorded.")
    tokens_in: int = Field(description="Prompt tokens over all turns.")
    tokens_out: int = Field(description="Sampled tokens over all turns.")
    latency_ms: float
    models: list[str] = Field(description="The versions that sampled its turns, in order of first use.")
    created_at: datetime
    last_turn_at: datetime
    expires_at: datetime
    messages: list[Any] | None = Field(default=None, description="The whole conversation (read alone).")
    turns: list[EpisodeTurnPublic] | None = Field(default=None, description="Its turns in order (read alone).")

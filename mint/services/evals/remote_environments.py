"""Environment servers: a team's environment, hosted by the team, whose episodes Mint plays with
its own model (the protocol is `mint.schemas.remote_environments`).

`RemoteEnvironment` is one episode, with the shape both of Mint's episode players use
(`mint.trainer.episodes.Env`: `tools`, `initial_observation()`, `step(message)` -> (messages,
reward, done)): an RL job's policy and an eval run's model take the turns, the server's
environment answers them (tool results, a user's reply) and, at the end, rewards the episode
with its own rubric. Each call goes through `TeamEndpoints` (signed, egress-checked, retried
within the config's deadline); an episode that stops before the server ends it is closed.

A server that gives no usable answer raises `EnvironmentUnavailable`, naming the endpoint and
what went wrong: an eval run records it on the task's trajectory and goes on; an RL job stops
with it, since its rewards would otherwise be silently wrong.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from mint.chat.messages import message_text, tool_calls_of
from mint.config import Settings
from mint.errors import InvalidRequest
from mint.evals.agent_environments import AgentEnvironment, make_environment
from mint.evals.benchmark import BenchmarkTask
from mint.schemas.remote_environments import (
    ENVIRONMENT_CLOSE_TYPE,
    ENVIRONMENT_START_TYPE,
    ENVIRONMENT_STEP_TYPE,
    MAX_OBSERVATION_BYTES,
    Observation,
    RemoteEnvironmentConfig,
)
from mint.services.evals.team_endpoints import EndpointFailed, TeamEndpoints, excerpt

log = logging.getLogger(__name__)

REFUSAL_HINT = "an environment server answers 200 with an observation"


class EnvironmentUnavailable(InvalidRequest):
    """The environment server gave no usable answer; the message names it and says why."""


def _call(endpoints: TeamEndpoints, config: RemoteEnvironmentConfig, payload: Mapping[str, Any]) -> bytes:
    where = f"environment server {config.endpoint!r}"
    try:
        body = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise EnvironmentUnavailable(f"{where}: the request cannot be sent as JSON: {exc}") from None
    try:
        answer = endpoints.post(
            config.endpoint,
            body,
            timeout_s=config.timeout_s,
            retries=config.retries,
            answer_bytes=MAX_OBSERVATION_BYTES,
            refusal_hint=REFUSAL_HINT,
        )
    except EndpointFailed as exc:
        raise EnvironmentUnavailable(f"{where}: {exc}") from None
    if len(answer) > MAX_OBSERVATION_BYTES:
        raise EnvironmentUnavailable(f"{where}: oversized answer: more than {MAX_OBSERVATION_BYTES} bytes")
    return answer


def _observation(config: RemoteEnvironmentConfig, answer: bytes) -> Observation:
    try:
        return Observation.model_validate_json(answer)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise EnvironmentUnavailable(
            f"environment server {config.endpoint!r}: malformed answer: {where}: {first['msg']}: {excerpt(answer)}"
        ) from None


def _wire_tool_calls(message: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant's turn with its tool calls in OpenAI's structured form (however the model
    wrote them), which an environment's harness reads."""
    turn: dict[str, Any] = {"role": "assistant", "content": message_text(message)}
    calls = tool_calls_of(message)
    if calls:
        turn["tool_calls"] = [call.to_openai(call.id or f"call_{index + 1}") for index, call in enumerate(calls)]
    return turn


class RemoteEnvironment:
    """One episode of a task of an environment server."""

    def __init__(self, endpoints: TeamEndpoints, config: RemoteEnvironmentConfig) -> None:
        self.endpoints, self.config = endpoints, config
        self.episode: str | None = None
        self.tools: list[dict[str, Any]] | None = None
        self.ended: Observation | None = None
        self._first: list[dict[str, Any]] | None = None

    def initial_observation(self) -> Sequence[Mapping[str, Any]]:
        """The conversation of the episode's first model call (the episode starts on the first ask)."""
        if self._first is None:
            answer = _call(self.endpoints, self.config, {"type": ENVIRONMENT_START_TYPE, "task": self.config.task})
            observation = _observation(self.config, answer)
            if observation.done:
                raise EnvironmentUnavailable(
                    f"environment server {self.config.endpoint!r}: task {self.config.task} ended before the model's "
                    f"first turn ({'; '.join(observation.errors) or 'no error given'})"
                )
            self.episode, self.tools, self._first = observation.episode, observation.tools, observation.messages
        return self._first

    def step(self, action: Mapping[str, Any]) -> tuple[list[dict[str, Any]], float, bool]:
        """Send the model's turn; the messages the environment added, and its reward once it ended."""
        if self.episode is None:
            self.initial_observation()
        payload = {"type": ENVIRONMENT_STEP_TYPE, "episode": self.episode, "message": _wire_tool_calls(action)}
        observation = _observation(self.config, _call(self.endpoints, self.config, payload))
        if observation.done:
            self.ended = observation
            return [], observation.reward, True
        if observation.tools is not None:
            self.tools = observation.tools
        return observation.messages, 0.0, False

    def close(self) -> None:
        """End an episode the server has not ended; a failure here is only logged."""
        if self.episode is None or self.ended is not None:
            return
        try:
            _call(self.endpoints, self.config, {"type": ENVIRONMENT_CLOSE_TYPE, "episode": self.episode})
        except EnvironmentUnavailable as exc:
            log.warning("could not close episode %s: %s", self.episode, exc.message)
        self.ended = Observation(episode=self.episode, done=True, errors=["closed by Mint before it ended"])

    def summary(self) -> str:
        """The end of the episode as a grade's detail: its reward, each named reward, its errors."""
        if self.ended is None:
            return "the episode did not end"
        parts = [f"reward {self.ended.reward:g}"]
        if self.ended.rewards:
            parts.append(", ".join(f"{name} {value:g}" for name, value in sorted(self.ended.rewards.items())))
        if self.ended.errors:
            parts.append("errors: " + "; ".join(self.ended.errors))
        return f"environment server {self.config.endpoint!r}: " + "; ".join(parts)


def environments_for(
    settings: Settings, organization_id: str
) -> Callable[[Mapping[str, Any], Mapping[str, Any] | None], Callable[[], AgentEnvironment] | None]:
    """An RL job's `environment_for`: `make_environment` with the organization's environment servers."""
    endpoints = TeamEndpoints.of(settings, organization_id)

    def remote(config: RemoteEnvironmentConfig) -> RemoteEnvironment:
        return RemoteEnvironment(endpoints, config)

    return lambda row, job_environment: make_environment(row, job_environment, remote)


def acting_for(settings: Settings, organization_id: str) -> Callable[[BenchmarkTask], AgentEnvironment]:
    """An eval run's `act_in`: a fresh environment for one episode of a task that names one."""
    environment_for = environments_for(settings, organization_id)

    def act_in(task: BenchmarkTask) -> AgentEnvironment:
        make = environment_for(task.model_dump(mode="json"), None)
        assert make is not None, "act_in is asked only for tasks that name an environment"
        return make()

    return act_in

"""The grader spec, the registry it names a grader from, and the `Grade` every grader returns.

This is the part of grading that does not depend on which grader runs: `GraderSpec` validates
a `{"type", "config"}` once, against the config model the named grader registered with
(`_grader`, private, so the set of types stays closed), and `grade` calls that grader. The
grader families live in the sibling modules and register themselves here when the package
is imported. Also here are what every family shares: reading the text and the tool calls of
an output in any of its forms, and the helpers that phrase a grade's detail.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from mint.chat.messages import message_text, tool_calls_of
from mint.chat.tool_calls import ToolCall, parse_tool_calls
from mint.errors import ConfigurationError, InvalidRequest
from mint.schemas.evals import RewardPenalties

Output = str | Mapping[str, Any] | Sequence[Mapping[str, Any]] | None
# (prompt, the judge model the spec names or None) -> the model's reply.
JudgeFn = Callable[[str, str | None], str]
# (the endpoint's name or id, one item of the remote reward protocol, timeout_s, retries) -> the
# endpoint's reward for the item and its detail (None if it gave none); `RewardUnavailable` when
# no usable reward came (see `mint.evals.graders.remote`).
RewardFn = Callable[[str, Mapping[str, Any], float, int], tuple[float, str | None]]


class RewardUnavailable(Exception):
    """A reward endpoint gave no usable reward (timeout, error status, malformed answer): the
    message says what went wrong, and the `remote` grader's grade is 0 with it as its detail."""


class JudgeVerdict(BaseModel):
    """What a judge model was asked and what it answered, kept with the grade.

    `verdict` is the number read from the reply's last `SCORE: n` line, or None when the reply
    had none (the grade is then 0 and says so).
    """

    model_config = ConfigDict(frozen=True)

    model: str | None
    prompt: str
    reply: str
    verdict: float | None
    max_score: int


class Grade(BaseModel):
    """A score in [0, 1], whether the output passed (full credit), and a short human reason.

    A composite grade lists its `parts`; a judge's grade keeps the `judge` prompt and reply.
    """

    model_config = ConfigDict(frozen=True)

    score: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    passed: bool
    detail: str = ""
    parts: tuple[GradePart, ...] = ()
    judge: JudgeVerdict | None = None

    def record(self) -> dict[str, Any]:
        """The grade as JSON for a trajectory: detail always, parts and judge where present."""
        return self.model_dump(mode="json", exclude_defaults=True) | {"detail": self.detail}


class GradePart(BaseModel):
    """One part of a composite grade: its grader type, its normalised weight and its grade."""

    model_config = ConfigDict(frozen=True)

    type: str
    weight: float
    grade: Grade


Grade.model_rebuild()


@dataclass(frozen=True)
class GradeContext:
    """What a grader may use from its caller: `judge` sends a prompt to a model and returns its reply;
    `reward` asks a reward endpoint of the caller's organization (the `remote` grader);
    `environment_reward` is what the task's environment rewarded (the `environment` grader).

    An eval run builds the judge from the model its spec names (`config.model`: a base, an
    `adapter@version` or a deployment of the run's organization), generating through the
    same path as the run's own model; tests pass a local function. The `remote` grader also
    reads what was asked: `prompt` (the messages before the answer) and `task` (the task's
    metadata or the dataset row, for `data_source`, `extra_info` and `columns`), which the
    caller sets per task with `about`; `source` names the benchmark, the default `data_source`.
    """

    judge: JudgeFn | None = None
    reward: RewardFn | None = None
    prompt: Sequence[Mapping[str, Any]] = ()
    task: Mapping[str, Any] = field(default_factory=dict)
    task_id: str | None = None
    source: str | None = None
    # What the environment that played the task rewarded its episode, and how it says it reached
    # that (the `environment` grader's score); None where no environment ended the episode.
    environment_reward: tuple[float, str] | None = None

    def about(
        self, prompt: Sequence[Mapping[str, Any]], task: Mapping[str, Any], task_id: str | None = None
    ) -> GradeContext:
        """This context for grading one task: its prompt messages and its metadata (or row)."""
        return replace(self, prompt=prompt, task=task, task_id=task_id)

    def rewarded(self, reward: float, detail: str) -> GradeContext:
        """This context after an environment ended the task's episode with `reward`."""
        return replace(self, environment_reward=(reward, detail))


def _brief(text: str, limit: int = 80) -> str:
    """A quoted excerpt for details, so a huge output does not become a huge detail."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


# ---- reading outputs -------------------------------------------------------------------------


def output_text(output: Output) -> str:
    """The text of the answer: the string itself, a message's content, or a trajectory's last assistant message."""
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    if isinstance(output, Mapping):
        return message_text(output)
    for message in reversed(output):
        if isinstance(message, Mapping) and message.get("role", "assistant") == "assistant":
            return message_text(message)
    return ""


def output_tool_calls(output: Output) -> list[ToolCall]:
    """Every tool call in the output, in order: structured `tool_calls`, else calls in text form."""
    if output is None:
        return []
    if isinstance(output, str):
        return parse_tool_calls(output)
    if isinstance(output, Mapping):
        return tool_calls_of(output)
    return [
        call
        for message in output
        if isinstance(message, Mapping) and message.get("role", "assistant") == "assistant"
        for call in tool_calls_of(message)
    ]


def _text_references(reference: Any) -> list[str]:
    """A text reference, or a list of acceptable ones; integers are accepted as their digits."""
    candidates = reference if isinstance(reference, list) else [reference]
    texts: list[str] = []
    for candidate in candidates:
        if isinstance(candidate, str):
            texts.append(candidate)
        elif isinstance(candidate, int) and not isinstance(candidate, bool):
            texts.append(str(candidate))
        else:
            raise InvalidRequest(
                f"this grader compares text: the reference must be a string or a list of strings, got {candidate!r}; "
                "fix the task's reference",
                param="reference",
            )
    if not texts:
        raise InvalidRequest("the reference list is empty; give at least one acceptable answer", param="reference")
    return texts


# ---- the registry ----------------------------------------------------------------------------


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @property
    def specs(self) -> tuple[GraderSpec, ...]:
        """The grader specs inside this config: none, except for a composite's parts."""
        return ()


GraderFn = Callable[[Output, Any, Any, GradeContext], Grade]


@dataclass(frozen=True)
class _Grader:
    config_model: type[_Config]
    fn: GraderFn


_GRADERS: dict[str, _Grader] = {}


def _grader(name: str, config_model: type[_Config]) -> Callable[[GraderFn], GraderFn]:
    """Register a built-in grader; private, so the set of grader types is closed."""

    def register(fn: GraderFn) -> GraderFn:
        if name in _GRADERS:
            raise ConfigurationError(f"grader {name!r} is registered twice; give the second one another name")
        _GRADERS[name] = _Grader(config_model, fn)
        return fn

    return register


def grader_types() -> list[str]:
    """The names a `GraderSpec.type` may take."""
    return sorted(_GRADERS)


def _describe(exc: ValidationError, prefix: str, model: type[BaseModel]) -> tuple[str, str | None]:
    """The first validation error as `grader prefix.field: message` with the fix, and the path for `param`."""
    error = exc.errors()[0]
    path = ".".join([prefix, *(str(part) for part in error["loc"])]).strip(".")
    options = ", ".join(model.model_fields) or "none"
    if error["type"] == "missing":
        message = "is required"
    elif error["type"] == "extra_forbidden":
        message = f"is not an option here; the options are: {options}"
    else:
        message = str(error["msg"]).removeprefix("Value error, ")
    return (f"grader {path}: {message}", path) if path else (f"grader: {message}", None)


class GraderSpec(BaseModel):
    """Which grader scores a task, and its configuration; validated once, when built.

    Example: `{"type": "regex", "config": {"pattern": "ANSWER: (\\\\w+)", "group": 1}}`.
    Any problem raises `InvalidRequest` naming the field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str = Field(description="A grader from the closed registry: see grader_types().")
    config: dict[str, Any] = Field(default_factory=dict, description="That grader's options.")
    penalties: RewardPenalties | None = Field(
        default=None, description="Step and token costs subtracted from the score when it is a reward."
    )

    _parsed: _Config = PrivateAttr()

    @model_validator(mode="wrap")
    @classmethod
    def _validate(cls, data: Any, handler: ModelWrapValidatorHandler[GraderSpec]) -> GraderSpec:
        try:
            spec = handler(data)
        except ValidationError as exc:
            message, path = _describe(exc, "", cls)
            raise InvalidRequest(message, param=path) from None
        entry = _GRADERS.get(spec.type)
        if entry is None:
            raise InvalidRequest(
                f"unknown grader type {spec.type!r}; use one of: {', '.join(grader_types())}", param="type"
            )
        try:
            spec._parsed = entry.config_model.model_validate(spec.config)
        except ValidationError as exc:
            message, path = _describe(exc, "config", entry.config_model)
            raise InvalidRequest(message, param=path) from None
        return spec

    @model_serializer(mode="wrap")
    def _omit_unset_penalties(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Without penalties a spec serialises as it always has, so the canonical form (and the
        # sha256) of existing benchmark versions and stored plans does not change.
        data: dict[str, Any] = handler(self)
        if data.get("penalties") is None:
            data.pop("penalties", None)
        return data

    @property
    def parsed_config(self) -> _Config:
        """The config as its grader's typed model."""
        return self._parsed

    def specs(self) -> list[GraderSpec]:
        """This spec and, for a composite, every spec inside it (depth first)."""
        found, stack = [], [self]
        while stack:
            spec = stack.pop()
            found.append(spec)
            stack += reversed(spec.parsed_config.specs)
        return found

    def kinds(self) -> set[str]:
        """The grader types this spec uses, a composite's parts included."""
        return {spec.type for spec in self.specs()}

    def reward(
        self,
        output: Output,
        reference: Any,
        *,
        steps: int = 1,
        tokens: int = 0,
        context: GradeContext | None = None,
    ) -> float:
        """The RL reward of `output` (`mint.trainer.recipes.common.Grader`): its grade's score less the
        spec's penalties for `steps` (model turns) and `tokens` (generated)."""
        return penalized(grade(self, output, reference, context=context).score, self.penalties, steps, tokens)

    def explain(self, output: Output, reference: Any) -> str:
        """Why `output` earned its grade (the grade's detail): what an RL step shows beside its samples."""
        return grade(self, output, reference).detail


def reward_spec(data: Any) -> GraderSpec:
    """A grader spec for RL rewards: any spec but one that needs a judge model, which a training
    worker has none of to ask (it would fail the job at its first step)."""
    spec = GraderSpec.model_validate(data)
    if "judge" in spec.kinds():
        raise InvalidRequest(
            "the judge grader cannot score RL samples: a training job has no judge model to ask. "
            "Use judge graders in eval runs, and a reward made of the other graders (a composite of "
            "them, for several criteria) for RL",
            param="grader",
        )
    return spec


def penalized(score: float, penalties: RewardPenalties | None, steps: int, tokens: int) -> float:
    """`score` less the step and token costs of `penalties` (see `RewardPenalties`); floored at 0
    unless they allow negative rewards."""
    if penalties is None:
        return score
    cost = penalties.step * max(0, steps - penalties.free_steps) + penalties.token * max(
        0, tokens - penalties.free_tokens
    )
    reward = score - cost
    return reward if penalties.allow_negative else max(0.0, reward)


def grade(spec: GraderSpec, output: Output, reference: Any, *, context: GradeContext | None = None) -> Grade:
    """Score `output` against `reference` with the grader `spec` names."""
    return _GRADERS[spec.type].fn(output, reference, spec.parsed_config, context or GradeContext())


def _match(passed: bool, detail: str) -> Grade:
    return Grade(score=1.0 if passed else 0.0, passed=passed, detail=detail)

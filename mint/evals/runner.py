"""Running benchmark tasks against a model: batched turns, multi-step tool use, grading.

The model is a `Generate` callable: given a batch of conversations (each with its tools),
it returns one assistant turn per conversation with its token counts and latency. The runner
calls it once per step for every task still going, so a batched engine serves a whole
benchmark step in one call:

    step 1: [task 1 prompt, task 2 prompt, ...]            -> one generate call
    step 2: [task 1 + call + tool result, task 3 + ...]    -> one generate call
    ...

A task that offers tools (or scripts their results) continues while the model calls tools:
its calls are answered by the task's scripted `Environment` and the next turn sees the
results; it ends at the first turn without a call, or after `max_steps` turns. A task without
tools ends after one turn. A task whose `environment` names one (a registered Python
environment, or a remote environment server's task) is played in it instead: the episode starts
from the environment's first observation and tools, every turn goes to the environment, which
answers (tool results, a user's reply) until it ends the episode with its reward; the caller
makes those environments (`act_in`), and one that fails is recorded on the task's trajectory.
Each task is graded with its own grader on what the model and the environment added (the
`environment` grader reads the environment's reward), and becomes a `TrajectoryRecord`.

Nothing here imports torch: `SamplerGenerate` drives a resident base through its
`sample_batch` method (every live task's turn decoded in one batch) behind the same `Generate`
protocol that a serving engine implements.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mint.chat.completion_text import sampled_text
from mint.chat.messages import tool_calls_of
from mint.chat.render import render_prompt
from mint.errors import InvalidRequest
from mint.evals.agent_environments import AgentEnvironment
from mint.evals.benchmark import BenchmarkTask
from mint.evals.environments import Environment
from mint.evals.graders import GradeContext, output_text
from mint.trainer.types import SampledSequence, SampleRequest, SamplingParams, close_environment

DEFAULT_MAX_STEPS = 8


@dataclass(frozen=True)
class GenerateRequest:
    """One conversation to continue by one assistant turn; `seed` makes sampling reproducible."""

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] | None = None
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """One assistant turn: its text (and structured tool calls, if the engine parses them).

    `tokens_in` counts the prompt's tokens, `tokens_out` the generated ones. `error` says why
    a request produced nothing (e.g. a prompt longer than the context); the task then ends.
    """

    text: str
    tokens_in: int
    tokens_out: int
    latency_ms: float
    tool_calls: list[dict[str, Any]] | None = None
    error: str | None = None
    # Which adapter answered and why, where the model chose it per request (a mixture
    # deployment's router): `{"adapter": "name@version", "route": {...the router's decision}}`.
    served: dict[str, Any] | None = None

    def to_message(self) -> dict[str, Any]:
        """The OpenAI assistant message of this turn."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


class Generate(Protocol):
    """A model: one assistant turn for each request, in order."""

    def __call__(self, requests: Sequence[GenerateRequest]) -> Sequence[Generation]: ...


@dataclass(frozen=True)
class TrajectoryRecord:
    """Everything one task did: the whole conversation, the answer, its grade and its cost.

    `messages` holds the task's messages followed by what the model and the environment added
    (the first `prompt_length` are the task's). `error` is set when the task could not run to
    its end (generation failed, the step limit was hit while calling tools, the grader failed).
    `grade` is how the grader reached its score (`Grade.record`: detail, a composite's parts,
    a judge's prompt and reply); None when grading failed.
    """

    task_id: str
    messages: list[dict[str, Any]]
    prompt_length: int
    output: str
    score: float
    passed: bool
    steps: int
    tokens_in: int
    tokens_out: int
    latency_ms: float
    error: str | None
    detail: str
    grade: dict[str, Any] | None = None
    # One entry per step whose model was chosen per request: the step (0-based) and what served it.
    routes: list[dict[str, Any]] | None = None

    @property
    def added(self) -> list[dict[str, Any]]:
        """The messages the model and the environment added."""
        return self.messages[self.prompt_length :]


# act_in(task) -> a fresh environment for one episode of a task whose `environment` names one
ActIn = Callable[[BenchmarkTask], AgentEnvironment]


@dataclass
class _Episode:
    task: BenchmarkTask
    environment: Environment
    messages: list[dict[str, Any]]
    prompt_length: int
    tools: list[dict[str, Any]] | None
    acting: AgentEnvironment | None = None  # the environment that plays a task naming one
    reward: float = 0.0
    ended: bool = False  # the acting environment ended the episode
    steps: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    latency_ms: float = 0.0
    error: str | None = None
    done: bool = False
    pending_calls: bool = field(default=False)
    routes: list[dict[str, Any]] = field(default_factory=list)


def request_seed(seed: int, task_id: str, step: int) -> int:
    """The sampling seed of one task's step: the same whatever the batch a task ran in."""
    digest = hashlib.sha256(f"{seed}|{task_id}|{step}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF


def _start(task: BenchmarkTask, act_in: ActIn | None) -> _Episode:
    """A task's episode before its first turn; one whose environment cannot start is over, with the error."""
    episode = _Episode(
        task=task,
        environment=task.make_environment(),
        messages=[dict(m) for m in task.messages],
        prompt_length=len(task.messages),
        tools=task.tools,
    )
    if task.named_environment is None:
        return episode
    try:
        if act_in is None:
            raise InvalidRequest("this runner was given no way to make the environments tasks name (act_in)")
        acting = act_in(task)
        episode.messages = [dict(message) for message in acting.initial_observation()]
    except InvalidRequest as exc:
        episode.error, episode.done = f"the environment could not start: {exc.message}", True
        return episode
    episode.acting, episode.prompt_length = acting, len(episode.messages)
    episode.tools = [dict(tool) for tool in acting.tools] if acting.tools else None
    return episode


def _act(episode: _Episode, message: dict[str, Any]) -> None:
    """Give the model's turn to the environment that plays the episode."""
    assert episode.acting is not None
    try:
        observation, reward, done = episode.acting.step(message)
    except InvalidRequest as exc:
        episode.error, episode.done = f"the environment failed: {exc.message}", True
        return
    episode.reward += float(reward)
    episode.messages += [dict(item) for item in observation]
    if episode.acting.tools:
        episode.tools = [dict(tool) for tool in episode.acting.tools]
    episode.done = episode.ended = bool(done)
    episode.pending_calls = not done


def _advance(episodes: list[_Episode], generate: Generate, step: int, seed: int) -> None:
    """One batched turn for every episode still going."""
    requests = [
        GenerateRequest(
            messages=list(episode.messages), tools=episode.tools, seed=request_seed(seed, episode.task.id, step)
        )
        for episode in episodes
    ]
    generations = list(generate(requests))
    if len(generations) != len(requests):
        raise InvalidRequest(
            f"the model returned {len(generations)} turns for {len(requests)} requests; a Generate "
            "implementation must answer every request, in order"
        )
    for episode, generation in zip(episodes, generations, strict=True):
        if generation.served is not None:
            episode.routes.append({"step": episode.steps, **generation.served})
        episode.steps += 1
        episode.tokens_in += generation.tokens_in
        episode.tokens_out += generation.tokens_out
        episode.latency_ms += generation.latency_ms
        if generation.error is not None:
            episode.error, episode.done = generation.error, True
            continue
        message = generation.to_message()
        episode.messages.append(message)
        if episode.acting is not None:
            _act(episode, message)
            continue
        calls = tool_calls_of(message) if episode.task.uses_tools else []
        if calls:
            episode.messages += episode.environment.step(message)
            episode.pending_calls = True
        else:
            episode.done, episode.pending_calls = True, False


def _record(episode: _Episode, max_steps: int, context: GradeContext | None) -> TrajectoryRecord:
    task = episode.task
    prompt_length = episode.prompt_length
    added = episode.messages[prompt_length:]
    error = episode.error
    if episode.acting is not None:
        close_environment(episode.acting)
        if episode.ended:
            summary = getattr(episode.acting, "summary", None)
            account = summary() if callable(summary) else f"the environment's reward: {episode.reward:g}"
            context = (context or GradeContext()).rewarded(episode.reward, account)
        elif error is None:
            error = f"stopped after {max_steps} steps before the environment ended the episode"
    if error is None and episode.pending_calls:
        error = f"stopped after {max_steps} steps while the model was still calling tools"
    score, passed, detail, record = 0.0, False, "", None
    try:
        grade = task.grade(added, context=context)
        score, passed, detail, record = grade.score, grade.passed, grade.detail, grade.record()
    except InvalidRequest as exc:  # the benchmark's spec cannot be graded: the task's bug, not the model's
        error = f"grading failed: {exc.message}"
    except Exception as exc:  # a registered python grader that raised: recorded, the run goes on
        error = f"grading failed: {type(exc).__name__}: {exc}"
    return TrajectoryRecord(
        task_id=task.id,
        messages=episode.messages,
        prompt_length=prompt_length,
        output=output_text(added),
        score=score,
        passed=passed,
        steps=episode.steps,
        tokens_in=episode.tokens_in,
        tokens_out=episode.tokens_out,
        latency_ms=episode.latency_ms,
        error=error,
        detail=detail,
        grade=record,
        routes=episode.routes or None,
    )


def run_batch(
    tasks: Sequence[BenchmarkTask],
    generate: Generate,
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    seed: int = 0,
    context: GradeContext | None = None,
    act_in: ActIn | None = None,
) -> list[TrajectoryRecord]:
    """Run `tasks` together: each step sends every unfinished task's turn in one generate call."""
    if max_steps < 1:
        raise InvalidRequest(f"max_steps must be at least 1, got {max_steps}", param="max_steps")
    episodes = [_start(task, act_in) for task in tasks]
    for step in range(max_steps):
        active = [episode for episode in episodes if not episode.done]
        if not active:
            break
        _advance(active, generate, step, seed)
    return [_record(episode, max_steps, context) for episode in episodes]


def run_tasks(
    tasks: Sequence[BenchmarkTask],
    generate: Generate,
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    seed: int = 0,
    batch_size: int | None = None,
    context: GradeContext | None = None,
    on_batch: Callable[[list[TrajectoryRecord]], None] | None = None,
    act_in: ActIn | None = None,
) -> list[TrajectoryRecord]:
    """Run `tasks` in batches of `batch_size` (all at once for None); `on_batch` sees each batch's records.

    A batch of 1 runs the tasks one at a time. Records come back in task order, and with the
    same seed each task gets the same sampling seeds whatever the batch size.
    """
    if batch_size is not None and batch_size < 1:
        raise InvalidRequest(f"batch_size must be at least 1, got {batch_size}", param="batch_size")
    size = batch_size or max(len(tasks), 1)
    records: list[TrajectoryRecord] = []
    for start in range(0, len(tasks), size):
        batch = run_batch(
            tasks[start : start + size], generate, max_steps=max_steps, seed=seed, context=context, act_in=act_in
        )
        if on_batch is not None:
            on_batch(batch)
        records += batch
    return records


class Outcome(Protocol):
    """What metrics read of a trajectory (a `TrajectoryRecord` or a stored row)."""

    score: float
    passed: bool
    steps: int
    tokens_in: int
    tokens_out: int
    latency_ms: float
    error: str | None


def summarize(outcomes: Sequence[Outcome]) -> dict[str, float | int]:
    """Accuracy beside efficiency: pass rate, mean score, and mean steps, tokens and latency per task."""
    if not outcomes:
        return {"tasks": 0, "passed": 0, "errors": 0, "accuracy": 0.0, "mean_score": 0.0}
    return {
        "tasks": len(outcomes),
        "passed": sum(o.passed for o in outcomes),
        "errors": sum(o.error is not None for o in outcomes),
        "accuracy": sum(o.passed for o in outcomes) / len(outcomes),
        "mean_score": statistics.fmean(o.score for o in outcomes),
        "mean_steps": statistics.fmean(o.steps for o in outcomes),
        "mean_tokens_in": statistics.fmean(o.tokens_in for o in outcomes),
        "mean_tokens_out": statistics.fmean(o.tokens_out for o in outcomes),
        "mean_latency_ms": statistics.fmean(o.latency_ms for o in outcomes),
    }


# ---- a resident base behind the Generate protocol --------------------------------------------


class Sampler(Protocol):
    """What `SamplerGenerate` needs of a resident base (`mint.trainer.session.ResidentBase`)."""

    tokenizer: Any

    def check_sample_request(self, request: SampleRequest) -> object: ...

    def sample_batch(
        self, adapter_name: str | None, requests: Sequence[SampleRequest]
    ) -> list[list[SampledSequence]]: ...


class SamplerGenerate:
    """`Generate` over a resident base's sampler: prompts rendered with the base's chat template
    exactly as in training (`render_prompt`), and the turns of every task still running decoded
    together in one batch under an adapter (None: the base itself). Each request keeps its own
    seed, so its turn does not depend on the others in the batch. A prompt the base refuses
    (longer than its context) becomes a turn with `error` set; other failures propagate.

    A turn's latency is the batch's: the time its caller waited for it.
    """

    def __init__(
        self,
        sampler: Sampler,
        *,
        adapter_name: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
    ) -> None:
        self.sampler = sampler
        self.adapter_name = adapter_name
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_p = top_p

    def __call__(self, requests: Sequence[GenerateRequest]) -> list[Generation]:
        started = time.perf_counter()
        tokenizer = self.sampler.tokenizer
        prompts: list[list[int]] = []
        refused: dict[int, str] = {}  # request index -> why the base cannot run it
        batch: list[SampleRequest] = []
        for index, request in enumerate(requests):
            prompt: list[int] = []
            try:
                prompt = render_prompt(tokenizer, request.messages, request.tools)
                sample_request = SampleRequest(prompt, self._params(request.seed), 1)
                self.sampler.check_sample_request(sample_request)
                batch.append(sample_request)
            except InvalidRequest as exc:
                refused[index] = exc.message
            prompts.append(prompt)
        sampled = iter(self.sampler.sample_batch(self.adapter_name, batch) if batch else [])
        elapsed_ms = (time.perf_counter() - started) * 1000
        generations = []
        for index, prompt in enumerate(prompts):
            sample = None if index in refused else next(sampled)[0]
            tokens = sample.tokens if sample is not None else []
            text = sampled_text(tokenizer, sample) if sample is not None else ""
            generations.append(
                Generation(
                    text=text,
                    tokens_in=len(prompt),
                    tokens_out=len(tokens),
                    latency_ms=elapsed_ms,
                    error=refused.get(index),
                )
            )
        return generations

    def _params(self, seed: int | None) -> SamplingParams:
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, seed=seed)

"""Training data from failed trajectories, in the dataset formats the trainer reads.

- `chat` (SFT): the task's messages followed by the reference continuation as the target.
  The continuation is the task's `solution` (for tool tasks, the reference trajectory with its
  tool calls and the environment's answers); without one it is built from the reference: the
  answer text (a string, a number, JSON for a JSON reference), or for a `tool_call` reference
  the calls made one by one with the scripted results.
- `preference` (DPO): at the first assistant turn where the model left the reference path,
  the reference's turn is preferred over the model's, on the conversation up to that turn:
  `{"input": {"messages", "tools"}, "preferred_output": [..], "non_preferred_output": [..]}`.
- `prompts` (RL): the task's messages, tools, scripted environment and reference, with the
  task's grader in `metadata.grader`, so an RL job scores samples exactly as the benchmark did.

A trajectory that carries `lineage` (a dict: an expert review's reviewer, queue and item, see
`mint.services.evals.review_mining`) gives each row mined from it `metadata.lineage`, so that
what a model learns names who taught it.

A continuation built from the reference is kept only if it passes the task's own grader, and
every row is checked with the trainer's row validators: a task that cannot give a valid row is
listed in `skipped` with the reason, never written half right.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from mint.chat.messages import message_text, tool_calls_of
from mint.chat.rows import validate_chat_row, validate_preference_row, validate_prompt_row
from mint.chat.tool_calls import ToolCall, canonical_arguments
from mint.errors import InvalidRequest
from mint.evals.benchmark import BenchmarkTask

MiningKind = Literal["chat", "preference", "prompts"]
KINDS: tuple[MiningKind, ...] = ("chat", "preference", "prompts")
# Graders that need a model or code to judge: a built continuation cannot be checked with them.
_UNCHECKED_GRADERS = {"judge", "python"}


class MinedTrajectory(Protocol):
    """What mining reads of a trajectory (a stored row or a runner record); read only, so that
    frozen records qualify."""

    @property
    def task_id(self) -> str: ...

    @property
    def messages(self) -> list[Any]: ...

    @property
    def passed(self) -> bool: ...


@dataclass
class MiningResult:
    """The rows mined, and the failed tasks that gave none, with why."""

    kind: MiningKind
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def first_reasons(self, count: int = 3) -> str:
        """`task: why; ...` of the first skipped tasks, for a message that says why nothing was mined."""
        return "; ".join(f"{task_id}: {why}" for task_id, why in self.skipped[:count])


def _answer_text(reference: Any) -> str | None:
    if isinstance(reference, list) and reference and all(isinstance(item, str) for item in reference):
        return reference[0]  # a list of acceptable answers: the first
    if isinstance(reference, str):
        return reference
    if isinstance(reference, bool) or reference is None:
        return None
    if isinstance(reference, int | float):
        return str(reference)
    if isinstance(reference, dict | list):
        return json.dumps(reference, ensure_ascii=False)
    return None


def _calls_continuation(task: BenchmarkTask) -> list[dict[str, Any]] | None:
    """The reference calls made one per turn, each answered by the task's environment."""
    items = task.reference if isinstance(task.reference, list) else [task.reference]
    if not all(isinstance(item, Mapping) and isinstance(item.get("name"), str) for item in items):
        return None
    environment = task.make_environment()
    messages: list[dict[str, Any]] = []
    for number, item in enumerate(items, start=1):
        call = ToolCall(name=item["name"], arguments=item.get("arguments", {}))
        message = {"role": "assistant", "content": None, "tool_calls": [call.to_openai(f"call_{number}")]}
        messages += [message, *environment.step(message)]
    return messages


def reference_continuation(task: BenchmarkTask) -> tuple[list[dict[str, Any]] | None, str]:
    """The ideal continuation of a task and, when there is none, why."""
    if task.solution is not None:
        return [dict(message) for message in task.solution], ""
    if task.grader.type == "tool_call":
        continuation = _calls_continuation(task)
        if continuation is None:
            return None, "its tool_call reference is not a list of calls"
    else:
        text = _answer_text(task.reference)
        if text is None or not text.strip():
            return None, "it has no solution and its reference is not an answer text"
        continuation = [{"role": "assistant", "content": text}]
    unchecked = task.grader.kinds() & _UNCHECKED_GRADERS  # a composite's parts included
    if unchecked:
        if "python" in unchecked or not isinstance(task.reference, str):
            kind = "python" if "python" in unchecked else "judge"
            return None, f"it has no solution, and a {kind} grader cannot vouch for the reference"
        return continuation, ""
    try:
        verdict = task.grade(continuation)
    except InvalidRequest as exc:
        return None, f"its reference cannot be graded: {exc.message}"
    if not verdict.passed:
        return None, (
            f"it has no solution and its reference alone does not pass its grader ({verdict.detail}); "
            "give the task a solution"
        )
    return continuation, ""


def _tools(task: BenchmarkTask) -> dict[str, Any]:
    return {"tools": task.tools} if task.tools else {}


def _chat_row(task: BenchmarkTask, trajectory: MinedTrajectory) -> tuple[dict[str, Any] | None, str]:
    continuation, why = reference_continuation(task)
    if continuation is None:
        return None, why
    return {"messages": [*task.messages, *continuation], **_tools(task)}, ""


def _turn_key(message: Mapping[str, Any]) -> tuple[str, ...]:
    """What makes two assistant turns the same: their calls (name and arguments), else their text."""
    calls = tool_calls_of(message)
    if calls:
        return tuple(f"{call.name}:{canonical_arguments(call.arguments)}" for call in calls)
    return ("text", message_text(message).strip())


def _assistant_positions(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    return [index for index, message in enumerate(messages) if message.get("role") == "assistant"]


def _model_turn(message: Mapping[str, Any]) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": "assistant", "content": message_text(message)}
    if message.get("tool_calls"):
        turn["tool_calls"] = message["tool_calls"]
    return turn


def _preference_row(task: BenchmarkTask, trajectory: MinedTrajectory) -> tuple[dict[str, Any] | None, str]:
    reference, why = reference_continuation(task)
    if reference is None:
        return None, why
    added = list(trajectory.messages[len(task.messages) :])
    ours, theirs = _assistant_positions(reference), _assistant_positions(added)
    for turn, position in enumerate(ours):
        if turn >= len(theirs):
            return None, f"the model stopped before assistant turn {turn + 1}: there is no output to reject"
        model_message = added[theirs[turn]]
        if _turn_key(model_message) == _turn_key(reference[position]):
            continue
        rejected = _model_turn(model_message)
        if not rejected["content"] and not rejected.get("tool_calls"):
            return None, f"the model's assistant turn {turn + 1} is empty: there is no output to reject"
        row = {
            "input": {"messages": [*task.messages, *reference[:position]], **_tools(task)},
            "preferred_output": [reference[position]],
            "non_preferred_output": [rejected],
        }
        return row, ""
    return None, "the model followed the reference turn by turn; no pair to prefer"


def _prompt_row(task: BenchmarkTask, trajectory: MinedTrajectory) -> tuple[dict[str, Any] | None, str]:
    row: dict[str, Any] = {"id": task.id, "messages": task.messages, **_tools(task), "reference": task.reference}
    if task.named_environment is not None:  # the RL job plays the task's episodes in the same environment
        row["environment"] = task.named_environment.model_dump(mode="json")
    elif task.environment:
        row["environment"] = [entry.model_dump(mode="json") for entry in task.scripted_calls]
    row["metadata"] = {"grader": task.grader.model_dump(mode="json"), "task_id": task.id}
    if task.split is not None:
        row["metadata"]["split"] = task.split
    return row, ""


_BUILDERS = {"chat": _chat_row, "preference": _preference_row, "prompts": _prompt_row}
_VALIDATORS = {"chat": validate_chat_row, "preference": validate_preference_row, "prompts": validate_prompt_row}


def mine_failures(
    kind: MiningKind, tasks: Sequence[BenchmarkTask], trajectories: Sequence[MinedTrajectory]
) -> MiningResult:
    """Rows of `kind` from the failed trajectories, in trajectory order; passed ones are ignored."""
    if kind not in KINDS:
        raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}, got {kind!r}", param="kind")
    by_id = {task.id: task for task in tasks}
    result = MiningResult(kind=kind)
    for trajectory in trajectories:
        if trajectory.passed:
            continue
        task = by_id.get(trajectory.task_id)
        if task is None:
            result.skipped.append((trajectory.task_id, "the benchmark version has no such task"))
            continue
        row, why = _BUILDERS[kind](task, trajectory)
        if row is None:
            result.skipped.append((task.id, why))
            continue
        lineage = getattr(trajectory, "lineage", None)  # optional: the Protocol's readers need not have it
        if isinstance(lineage, dict):
            row["metadata"] = {**row.get("metadata", {}), "lineage": lineage}
        errors = _VALIDATORS[kind](row)
        if errors:
            result.skipped.append((task.id, f"the row would not validate: {'; '.join(errors[:3])}"))
            continue
        result.rows.append(row)
    return result

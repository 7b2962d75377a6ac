"""The `tool_call` grader: the calls an output makes against the reference's calls.

Calls are read from structured `tool_calls` or, failing those, from text
(`mint.chat.tool_calls`), in every assistant message of a trajectory. A call with the right
name earns `name_weight`, and the rest in proportion to its argument leaves that match (the
same leaf counting as `json_match`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from mint.chat.tool_calls import ToolCall
from mint.errors import InvalidRequest
from mint.evals.graders.json_match import leaf_match
from mint.evals.graders.spec import Grade, GradeContext, Output, _Config, _grader, _match, output_tool_calls


class ToolCallConfig(_Config):
    """The calls the output makes must be the reference's calls (one `{"name", "arguments"}` or a list).

    A call with the right name and wrong arguments scores `name_weight` plus the rest in
    proportion to the arguments that match; the score is divided by the larger of the two
    call counts, so missing and extra calls both cost. `passed` needs every call exact.
    """

    ordered: bool = Field(default=True, description="Compare the n-th call with the n-th reference call.")
    name_weight: float = Field(default=0.5, ge=0.0, le=1.0, description="Credit for the right tool name alone.")
    allow_extra_arguments: bool = Field(default=False, description="Ignore arguments the reference does not name.")
    partial_credit: bool = Field(default=True, description="Credit right names and arguments (false: 1 or 0).")


def _reference_calls(reference: Any) -> list[ToolCall]:
    items = reference if isinstance(reference, list) else [reference]
    calls = []
    for item in items:
        if not (
            isinstance(item, Mapping)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("arguments", {}), dict)
        ):
            raise InvalidRequest(
                'the tool_call reference must be {"name": str, "arguments": object} or a list of them '
                f"([] for no call), got {item!r}; fix the task's reference",
                param="reference",
            )
        calls.append(ToolCall(name=item["name"], arguments=item.get("arguments", {})))
    return calls


def _call_score(expected: ToolCall, got: ToolCall, config: ToolCallConfig) -> float:
    if got.name != expected.name:
        return 0.0
    if not isinstance(got.arguments, dict):
        return config.name_weight
    if not expected.arguments and (config.allow_extra_arguments or not got.arguments):
        return 1.0
    # Arguments by leaf: a nested object argument earns credit for each of its fields.
    right, total, _ = leaf_match(expected.arguments, got.arguments, count_extra=not config.allow_extra_arguments)
    return config.name_weight + (1.0 - config.name_weight) * right / total


@_grader("tool_call", ToolCallConfig)
def _tool_call(output: Output, reference: Any, config: ToolCallConfig, context: GradeContext) -> Grade:
    expected = _reference_calls(reference)
    got = output_tool_calls(output)
    if not expected and not got:
        return _match(True, "no tool call, as expected")
    if config.ordered:
        scores = [_call_score(want, have, config) for want, have in zip(expected, got, strict=False)]
    else:
        unused = list(got)
        scores = []
        for want in expected:
            if not unused:
                break
            best = max(range(len(unused)), key=lambda index: (_call_score(want, unused[index], config), -index))
            scores.append(_call_score(want, unused.pop(best), config))
    total = sum(scores) / max(len(expected), len(got))
    exact = sum(score == 1.0 for score in scores)
    passed = exact == len(expected) == len(got)
    if not config.partial_credit:
        total = float(passed)
    detail = f"{exact} of {len(expected)} expected calls exact; the output made {len(got)}"
    if not passed and got and expected and got[0].name != expected[0].name:
        detail += f" (first call {got[0].name!r}, expected {expected[0].name!r})"
    return Grade(score=min(total, 1.0), passed=passed, detail=detail)

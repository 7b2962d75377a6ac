"""The scripted environments that answer tool calls during agent tasks.

An `Environment` replays the results a task scripted (`mint.chat.tool_calls.ScriptedCall`)
for each (tool name, arguments) pair; the calls themselves are read from assistant messages
in either of the forms `mint.chat.tool_calls` describes. It never raises on what a model
sends: an unknown tool, unscripted arguments or arguments that are not JSON come back as an
error observation, which the model sees and the trajectory records.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mint.chat.messages import tool_calls_of
from mint.chat.tool_calls import ScriptedCall, ToolCall, canonical_arguments


@dataclass(frozen=True)
class ToolResult:
    """What the environment answered to one call; `content` is what the model reads."""

    call: ToolCall
    call_id: str
    content: str
    is_error: bool

    def to_message(self) -> dict[str, Any]:
        """The OpenAI `tool` message that carries this result back to the model."""
        return {"role": "tool", "tool_call_id": self.call_id, "content": self.content}


def _error(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)


@dataclass
class Environment:
    """Replays scripted tool results; every call made is kept in `history`.

    `tool_names` are the tools the task offers (its `tools` list); a call to another name is
    reported as unknown. Without it, the names in the script are the tools.
    """

    script: Sequence[ScriptedCall]
    tool_names: Iterable[str] | None = None
    history: list[ToolResult] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._results = {(entry.name, canonical_arguments(entry.arguments)): entry.result for entry in self.script}
        names = self.tool_names if self.tool_names is not None else (entry.name for entry in self.script)
        self._names = sorted(set(names))

    @property
    def errors(self) -> int:
        """How many calls so far got an error observation."""
        return sum(result.is_error for result in self.history)

    def call(self, call: ToolCall) -> ToolResult:
        """Answer one call with its scripted result, or with an error observation; never raises."""
        call_id = call.id or f"call_{len(self.history) + 1}"
        content, is_error = self._answer(call)
        result = ToolResult(call=call, call_id=call_id, content=content, is_error=is_error)
        self.history.append(result)
        return result

    def _answer(self, call: ToolCall) -> tuple[str, bool]:
        if call.name not in self._names:
            return _error(f"unknown tool {call.name!r}; the tools are: {', '.join(self._names) or 'none'}"), True
        if not isinstance(call.arguments, dict):
            return _error(f"the arguments of {call.name} must be a JSON object, got {call.arguments!r}"), True
        key = (call.name, canonical_arguments(call.arguments))
        if key not in self._results:
            return _error(f"{call.name} has no result for arguments {key[1]}"), True
        result = self._results[key]
        return (result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)), False

    def step(self, assistant_message: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The `tool` messages answering every call in an assistant message (none if it makes no call)."""
        return [self.call(call).to_message() for call in tool_calls_of(assistant_message)]

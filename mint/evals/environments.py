"""Tool calls, and the scripted environments that answer them during agent tasks.

A tool call reaches Mint in one of two forms:

- OpenAI's structured form, on an assistant message:
  `"tool_calls": [{"id": "call_1", "type": "function",
                   "function": {"name": "lookup_order", "arguments": "{\"order_id\": \"A1\"}"}}]`
  (`arguments` is a JSON string; a JSON object is accepted too).
- Mint's text form, for chat templates that cannot render tool calls (SmolLM2's ChatML among
  them): one JSON object per call, `{"name": "<tool>", "arguments": {...}}`, each on its own
  line. Text around the objects is ignored when parsing, so a call wrapped in prose or in
  `<tool_call>` tags is still found.

`format_tool_calls` writes the text form (the trainer renders training rows with it) and
`parse_tool_calls` reads it back (the `tool_call` grader and the agent loop read model output
with it): training and grading agree on one form.

An `Environment` replays the results a task scripted for each (tool name, arguments) pair.
It never raises on what a model sends: an unknown tool, unscripted arguments or arguments
that are not JSON come back as an error observation, which the model sees and the trajectory
records.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Parsing scans every "{" with a JSON decoder; a cap keeps one pathological output cheap.
MAX_PARSE_CHARS = 100_000


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool by name.

    `arguments` is the decoded JSON value (a dict when the call is well formed); when a model
    wrote arguments that are not JSON, it is the raw string, so graders and environments can
    report it rather than crash.
    """

    name: str
    arguments: Any
    id: str | None = None

    @classmethod
    def from_openai(cls, call: Mapping[str, Any]) -> ToolCall:
        """Read one entry of an OpenAI `tool_calls` list (or a flat `{"name", "arguments"}` object).

        Lenient on purpose: a malformed entry becomes a call with an empty name or raw-string
        arguments, which the environment and the grader then report.
        """
        function = call.get("function")
        body: Mapping[str, Any] = function if isinstance(function, Mapping) else call
        name = body.get("name")
        call_id = call.get("id")
        return cls(
            name=name if isinstance(name, str) else "",
            arguments=_decode_arguments(body.get("arguments", {})),
            id=call_id if isinstance(call_id, str) else None,
        )

    def to_openai(self, call_id: str) -> dict[str, Any]:
        """This call as an entry of an OpenAI `tool_calls` list (arguments as a JSON string)."""
        arguments = self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": arguments}}

    def to_text(self) -> str:
        """This call in Mint's text form: `{"name": ..., "arguments": {...}}` on one line."""
        return json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)


def _decode_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return arguments
    return arguments


def _canonical_value(value: Any) -> Any:
    # 2 and 2.0 are the same argument to a tool; JSON text would tell them apart.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(key): _canonical_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical_value(item) for item in value]
    return value


def canonical_arguments(arguments: Any) -> str:
    """The key under which a scripted result is stored: sorted keys, no spaces, integral floats as ints."""
    return json.dumps(_canonical_value(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def format_tool_calls(calls: Iterable[ToolCall]) -> str:
    """Calls in Mint's text form, one JSON object per line."""
    return "\n".join(call.to_text() for call in calls)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `{"name": str, "arguments": ...}` object in `text`, in order; other text is ignored.

    `arguments` may be an object or a JSON string holding one. Only the first
    `MAX_PARSE_CHARS` characters are read.
    """
    text = text[:MAX_PARSE_CHARS]
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    position = text.find("{")
    while position != -1:
        try:
            value, end = decoder.raw_decode(text, position)
        except (ValueError, RecursionError):
            position = text.find("{", position + 1)
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str) and "arguments" in value:
            calls.append(ToolCall(name=value["name"], arguments=_decode_arguments(value["arguments"])))
        position = text.find("{", end)
    return calls


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message's `content`: a string, a list of text parts joined, or "" for none."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"] for part in content if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def tool_calls_of(message: Mapping[str, Any]) -> list[ToolCall]:
    """The calls an assistant message makes: its structured `tool_calls`, else those written in its text."""
    structured = message.get("tool_calls")
    if isinstance(structured, Sequence) and not isinstance(structured, str) and structured:
        return [ToolCall.from_openai(call) for call in structured if isinstance(call, Mapping)]
    return parse_tool_calls(message_text(message))


class ScriptedCall(BaseModel):
    """One scripted tool result: calling `name` with exactly `arguments` returns `result` (any JSON value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128)
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: Any


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

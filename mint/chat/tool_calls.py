"""Tool calls: the call type, Mint's text form of calls, and scripted results.

A tool call reaches Mint in one of two forms:

- OpenAI's structured form, on an assistant message:
  `"tool_calls": [{"id": "call_1", "type": "function",
                   "function": {"name": "lookup_order", "arguments": "{\"order_id\": \"A1\"}"}}]`
  (`arguments` is a JSON string; a JSON object is accepted too).
- Mint's text form, for chat templates that cannot render tool calls (SmolLM2's ChatML among
  them): one JSON object per call, `{"name": "<tool>", "arguments": {...}}`, each on its own
  line. Text around the objects is ignored when parsing, so a call wrapped in prose or in
  `<tool_call>` tags is still found.

`format_tool_calls` writes the text form (training rows are rendered with it) and
`parse_tool_calls` reads it back (the `tool_call` grader, the agent loop and the serving node
read model output with it): training and grading agree on one form.

A `ScriptedCall` is the result a benchmark task or an RL prompt row scripts for one call; the
evals' `Environment` replays them, keyed by `canonical_arguments`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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


class ScriptedCall(BaseModel):
    """One scripted tool result: calling `name` with exactly `arguments` returns `result` (any JSON value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128)
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: Any

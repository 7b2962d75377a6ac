"""Dataset rows checked before anything trains on them: SFT chat rows, DPO pairs and RL prompts.

Each validator takes one parsed JSONL row and returns its problems, every one naming the
field it is about (`messages[2].role: ...`), at most `_MAX_ERRORS` of them; an empty list
means the row is valid. OpenAI's chat format, with Mint's additions for RL prompts
(`reference`, a scripted `environment`). Rows are checked in the API process when a dataset is
uploaded and again when a conversation is rendered, so both agree on what is valid.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pydantic import ValidationError

from mint.chat.messages import ROLES, message_text
from mint.chat.tool_calls import ScriptedCall, ToolCall, parse_tool_calls

_MAX_ERRORS = 20
_MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "weight")


@dataclass
class _CallsMade:
    """The tool calls made so far in a conversation, which tool messages must answer.

    Calls in text form carry no id (the environment numbers them), so once one is made a
    tool message's id cannot be checked.
    """

    ids: set[str] = field(default_factory=set)
    in_text: bool = False

    def copy(self) -> _CallsMade:
        return _CallsMade(set(self.ids), self.in_text)


def _unknown(row: Mapping[str, Any], allowed: Sequence[str], where: str) -> list[str]:
    prefix = f"{where}." if where else ""
    return [f"{prefix}{key}: unknown field; allowed: {', '.join(allowed)}" for key in row if key not in allowed]


def _each(items: Any, where: str, what: str, check: Callable[[Any, str], list[str]]) -> list[str]:
    """`check(item, "where[i]")` for each item of a non-empty list."""
    if not isinstance(items, list) or not items:
        return [f"{where}: must be a non-empty list of {what}"]
    return [error for index, item in enumerate(items) for error in check(item, f"{where}[{index}]")]


def _tool_errors(tool: Any, where: str) -> list[str]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
        return [f'{where}: must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}']
    if not isinstance(function.get("name"), str) or not function["name"]:
        return [f"{where}.function.name: must be a non-empty string"]
    if "parameters" in function and not isinstance(function["parameters"], dict):
        return [f"{where}.function.parameters: must be a JSON schema object"]
    return []


def _tools_errors(tools: Any, where: str) -> list[str]:
    return _each(tools, where, "function tools", _tool_errors)


def _tool_call_errors(call: Any, where: str, made: _CallsMade) -> list[str]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(function, dict):
        return [f'{where}: must be {{"id": ..., "type": "function", "function": {{"name": ..., "arguments": ...}}}}']
    errors = []
    if not isinstance(call.get("id"), str) or not call["id"]:
        errors.append(f"{where}.id: must be a non-empty string (tool messages answer it by tool_call_id)")
    else:
        made.ids.add(call["id"])
    if call.get("type", "function") != "function":
        errors.append(f"{where}.type: must be 'function'")
    if not isinstance(function.get("name"), str) or not function["name"]:
        errors.append(f"{where}.function.name: must be a non-empty string")
    if not isinstance(ToolCall.from_openai(call).arguments, dict):
        errors.append(f"{where}.function.arguments: must be a JSON object (or a string holding one)")
    return errors


def _content_errors(message: Mapping[str, Any], where: str) -> list[str]:
    content = message.get("content")
    has_calls = bool(message.get("tool_calls"))
    if content is None:
        return [] if has_calls else [f"{where}.content: is required"]
    if isinstance(content, list):
        if not all(
            isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            for part in content
        ):
            return [f'{where}.content: a list of parts may hold only {{"type": "text", "text": ...}} parts']
    elif not isinstance(content, str):
        return [f"{where}.content: must be a string or a list of text parts"]
    if message.get("role") == "assistant" and not message_text(message) and not has_calls:
        return [f"{where}.content: an assistant message needs content or tool_calls"]
    return []


def _message_errors(message: Any, where: str, made: _CallsMade) -> list[str]:
    if not isinstance(message, dict):
        return [f"{where}: must be an object with role and content"]
    role = message.get("role")
    if role not in ROLES:
        got = f"got {role!r}" if "role" in message else "missing"
        return [f"{where}.role: must be one of {', '.join(ROLES)} ({got})"]
    errors = _unknown(message, _MESSAGE_FIELDS, where) + _content_errors(message, where)
    if "name" in message and not isinstance(message["name"], str):
        errors.append(f"{where}.name: must be a string")
    if role == "assistant" and "tool_calls" not in message and parse_tool_calls(message_text(message)):
        made.in_text = True
    if "tool_calls" in message:
        if role != "assistant":
            errors.append(f"{where}.tool_calls: only assistant messages make tool calls")
        else:
            errors += _each(
                message["tool_calls"], f"{where}.tool_calls", "tool calls", partial(_tool_call_errors, made=made)
            )
    if "weight" in message and (
        role != "assistant" or message["weight"] not in (0, 1) or isinstance(message["weight"], bool)
    ):
        errors.append(f"{where}.weight: only assistant messages have a weight, and it must be 0 or 1")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            errors.append(f"{where}.tool_call_id: is required on tool messages (the id of the call it answers)")
        elif call_id not in made.ids and not made.in_text:
            errors.append(f"{where}.tool_call_id: {call_id!r} answers no earlier tool call")
    elif "tool_call_id" in message:
        errors.append(f"{where}.tool_call_id: only tool messages have one")
    return errors


def _messages_list_errors(messages: Any, where: str, made: _CallsMade) -> list[str]:
    return _each(messages, where, "messages", partial(_message_errors, made=made))


def conversation_errors(messages: Any, where: str) -> list[str]:
    """A chat conversation to train on: valid messages, opened by system or user, with an assistant turn to learn."""
    errors = _messages_list_errors(messages, where, _CallsMade())
    if errors or not isinstance(messages, list):
        return errors
    if messages[0]["role"] not in ("system", "user"):
        errors.append(f"{where}[0].role: a conversation must start with a system or user message")
    if not any(message["role"] == "assistant" and message.get("weight", 1) != 0 for message in messages):
        errors.append(f"{where}: needs at least one assistant message to train on (with weight 1)")
    return errors


def _row_errors(row: Any, allowed: Sequence[str]) -> list[str]:
    if not isinstance(row, dict):
        return [f"row: must be a JSON object with {', '.join(allowed)}"]
    errors = _unknown(row, allowed, "")
    if "tools" in row:
        errors += _tools_errors(row["tools"], "tools")
    if "parallel_tool_calls" in row and not isinstance(row["parallel_tool_calls"], bool):
        errors.append("parallel_tool_calls: must be true or false")
    return errors


def _metadata_errors(row: Mapping[str, Any]) -> list[str]:
    return ["metadata: must be an object"] if "metadata" in row and not isinstance(row["metadata"], dict) else []


def validate_chat_row(row: Any) -> list[str]:
    """Problems with one SFT row `{"messages": [...], "tools"?: [...], "metadata"?: {...}}` (OpenAI
    chat format; `metadata` keeps what a row read from another format held besides); empty when valid."""
    errors = _row_errors(row, ("messages", "tools", "parallel_tool_calls", "metadata"))
    if isinstance(row, dict):
        errors += _metadata_errors(row) + conversation_errors(row.get("messages"), "messages")
    return errors[:_MAX_ERRORS]


def _prompt_errors(messages: Any, where: str, made: _CallsMade) -> list[str]:
    """A conversation the model continues: valid messages, not ending in an assistant message."""
    errors = _messages_list_errors(messages, where, made)
    if errors or not isinstance(messages, list):
        return errors
    if not any(message["role"] == "user" for message in messages):
        errors.append(f"{where}: needs a user message")
    if messages[-1]["role"] == "assistant":
        errors.append(
            f"{where}[{len(messages) - 1}].role: the last message must not be the assistant's; the model writes it"
        )
    return errors


def validate_preference_row(row: Any) -> list[str]:
    """Problems with one DPO row (OpenAI's shape); empty when valid.

    `{"input": {"messages": [...], "tools"?: [...]}, "preferred_output": [assistant message],
    "non_preferred_output": [assistant message], "metadata"?: {...}}`.
    """
    errors = _row_errors(row, ("input", "preferred_output", "non_preferred_output", "metadata"))
    if not isinstance(row, dict):
        return errors
    errors += _metadata_errors(row)
    source = row.get("input")
    made = _CallsMade()
    if not isinstance(source, dict):
        errors.append("input: must be an object with messages")
    else:
        errors += _unknown(source, ("messages", "tools", "parallel_tool_calls"), "input")
        errors += _prompt_errors(source.get("messages"), "input.messages", made)
        if "tools" in source:
            errors += _tools_errors(source["tools"], "input.tools")
    for key in ("preferred_output", "non_preferred_output"):
        output = row.get(key)
        if not isinstance(output, list) or len(output) != 1:
            errors.append(f"{key}: must be a list holding exactly one assistant message")
            continue
        errors += _message_errors(output[0], f"{key}[0]", made.copy())
        if isinstance(output[0], dict) and output[0].get("role") not in ("assistant", None):
            errors.append(f"{key}[0].role: must be assistant")
    if not errors and row["preferred_output"] == row["non_preferred_output"]:
        errors.append("non_preferred_output: is the same as preferred_output; a pair must differ")
    return errors[:_MAX_ERRORS]


def named_environment_errors(spec: Any, where: str) -> list[str]:
    """The shape of `{"name": ..., "config"?: {...}}`, which names an environment registered in
    Mint's code (whether the name is registered is checked where the registry is known)."""
    if not isinstance(spec, dict):
        return [f'{where}: must be an object {{"name": ..., "config"?: {{...}}}}']
    errors = _unknown(spec, ("name", "config"), where)
    name = spec.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        errors.append(f"{where}.name: must be the name of a registered environment (a string of 1 to 64 characters)")
    if "config" in spec and not isinstance(spec["config"], dict):
        errors.append(f"{where}.config: must be an object")
    return errors


def validate_prompt_row(row: Any) -> list[str]:
    """Problems with one RL prompt row; empty when valid.

    `{"messages": [...], "tools"?: [...], "reference"?: any, "environment"?: [{"name",
    "arguments", "result"}] | {"name", "config"?}, "id"?: str, "metadata"?: object}`: the
    conversation ends before the assistant's turn; `reference` is what the job's grader compares
    with; `environment` either scripts tool results as in a benchmark task, or names a Python
    environment registered in Mint's code that answers the model's turns.
    """
    allowed = ("messages", "tools", "parallel_tool_calls", "reference", "environment", "id", "metadata")
    errors = _row_errors(row, allowed)
    if not isinstance(row, dict):
        return errors
    errors += _prompt_errors(row.get("messages"), "messages", _CallsMade())
    if "id" in row and not isinstance(row["id"], str):
        errors.append("id: must be a string")
    if "metadata" in row and not isinstance(row["metadata"], dict):
        errors.append("metadata: must be an object")
    environment = row.get("environment", [])
    if isinstance(environment, dict):
        errors += named_environment_errors(environment, "environment")
    elif not isinstance(environment, list):
        errors.append(
            'environment: must be a list of scripted calls {name, arguments, result}, or {"name": ...} naming '
            "a registered environment"
        )
    else:
        for index, entry in enumerate(environment):
            try:
                ScriptedCall.model_validate(entry)
            except ValidationError as exc:
                error = exc.errors()[0]
                field = "".join(f".{part}" for part in error["loc"])
                errors.append(f"environment[{index}]{field}: {error['msg']}")
    return errors[:_MAX_ERRORS]

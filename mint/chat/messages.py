"""Chat messages in OpenAI's format: their roles, the text of their content and the calls they make."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mint.chat.tool_calls import ToolCall, parse_tool_calls

ROLES = ("system", "user", "assistant", "tool")


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

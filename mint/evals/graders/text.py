"""Text graders: the output's text against a text reference, exactly, after normalization, or by regex.

`exact` and `normalized` compare the whole answer with one or several acceptable answers;
`regex` checks the answer's shape and can pull out one group to compare. A regex pattern
comes from a benchmark, so it is checked for the shapes that backtrack exponentially
(`mint.chat.patterns`) and never runs on more than MAX_REGEX_INPUT_CHARS of output.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from mint.chat.patterns import MAX_PATTERN_CHARS, compile_pattern
from mint.chat.text import normalize_text
from mint.evals.graders.spec import (
    Grade,
    GradeContext,
    Output,
    _brief,
    _Config,
    _grader,
    _match,
    _text_references,
    output_text,
)

# The most output a regex runs on, so one grade stays cheap whatever the model wrote.
MAX_REGEX_INPUT_CHARS = 20_000


# ---- exact and normalized --------------------------------------------------------------------


class ExactConfig(_Config):
    """No options: the output, stripped, must equal a reference, stripped."""


@_grader("exact", ExactConfig)
def _exact(output: Output, reference: Any, config: ExactConfig, context: GradeContext) -> Grade:
    text = output_text(output).strip()
    references = [candidate.strip() for candidate in _text_references(reference)]
    if text in references:
        return _match(True, "exact match")
    return _match(False, f"{_brief(text)} is not {_brief(references[0])}")


class NormalizedConfig(_Config):
    """Compare after case folding, Unicode NFKC, removing punctuation and collapsing whitespace."""

    remove_articles: bool = Field(default=False, description="Also drop English a / an / the (SQuAD-style).")


@_grader("normalized", NormalizedConfig)
def _normalized(output: Output, reference: Any, config: NormalizedConfig, context: GradeContext) -> Grade:
    text = normalize_text(output_text(output), remove_articles=config.remove_articles)
    references = [normalize_text(item, remove_articles=config.remove_articles) for item in _text_references(reference)]
    if text in references:
        return _match(True, "match after normalization")
    return _match(False, f"{_brief(text)} is not {_brief(references[0])} after normalization")


# ---- regex -----------------------------------------------------------------------------------


class RegexConfig(_Config):
    """The output (stripped) must match `pattern`; with `group`, that group must also equal the reference."""

    pattern: str = Field(min_length=1, max_length=MAX_PATTERN_CHARS)
    mode: Literal["fullmatch", "search"] = Field(
        default="fullmatch", description="fullmatch: the whole output; search: anywhere in it."
    )
    ignore_case: bool = False
    multiline: bool = False
    dotall: bool = False
    group: int | str | None = Field(default=None, description="A group whose text must equal the reference.")

    @property
    def flags(self) -> int:
        return (
            (re.IGNORECASE if self.ignore_case else 0)
            | (re.MULTILINE if self.multiline else 0)
            | (re.DOTALL if self.dotall else 0)
        )

    @model_validator(mode="after")
    def _compiles(self) -> RegexConfig:
        compiled = compile_pattern(self.pattern, self.flags)
        if isinstance(self.group, int) and not 0 <= self.group <= compiled.groups:
            raise ValueError(f"group {self.group} does not exist: the pattern has {compiled.groups} groups")
        if isinstance(self.group, str) and self.group not in compiled.groupindex:
            raise ValueError(f"the pattern has no group named {self.group!r}; name it with (?P<{self.group}>...)")
        return self


@_grader("regex", RegexConfig)
def _regex(output: Output, reference: Any, config: RegexConfig, context: GradeContext) -> Grade:
    text = output_text(output).strip()
    if len(text) > MAX_REGEX_INPUT_CHARS:
        return _match(
            False, f"the output is {len(text)} characters; regex grading reads at most {MAX_REGEX_INPUT_CHARS}"
        )
    compiled = compile_pattern(config.pattern, config.flags)
    found = compiled.fullmatch(text) if config.mode == "fullmatch" else compiled.search(text)
    if found is None:
        return _match(False, f"{_brief(text)} does not {config.mode} {config.pattern!r}")
    if config.group is None:
        return _match(True, "pattern matched")
    captured = (found.group(config.group) or "").strip()
    references = [candidate.strip() for candidate in _text_references(reference)]
    if captured in references:
        return _match(True, f"pattern matched with group {config.group} = {_brief(captured)}")
    return _match(False, f"group {config.group} is {_brief(captured)}, not {_brief(references[0])}")

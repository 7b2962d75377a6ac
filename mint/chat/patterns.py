"""Regular expressions that benchmark graders and routing rules run, on a linear-time engine.

Python's `re` backtracks and has no time limit: `^(a|a)*$` or `.*a.*a.*a.*=` on a long input
can hang the API, a serving node or a worker. Every user-supplied pattern is compiled here by
RE2 (`google-re2`), whose matching time is linear in the input whatever the pattern, so no
pattern shape needs refusing for speed. RE2 has no backreferences and no lookarounds; a
pattern that uses them is refused with a message saying what to write instead.

The compiled object answers `search`, `fullmatch`, `match`, `groups` and `groupindex` like a
`re.Pattern`. RE2's classes `\\w`, `\\d`, `\\s` and `\\b` are ASCII; `\\pL` (letters) and
`\\pN` (digits) match any script.
"""

from __future__ import annotations

import re
import re._parser as sre_parse  # the stdlib's own regex parser, to name what RE2 does not support
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import re2

MAX_PATTERN_CHARS = 512

# The flags a caller may pass, as `re` spells them.
SUPPORTED_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL

# RE2's compiled pattern type (search, fullmatch, match, groups, groupindex).
Pattern = Any

_UNSUPPORTED = {
    "GROUPREF": "backreferences (\\1, (?P=name)) are not supported; match the text again explicitly, "
    "or capture both parts with groups and compare them with the grader's `group` option",
    "GROUPREF_EXISTS": "conditional groups ((?(1)...|...)) are not supported; write the alternatives with |",
    "ASSERT": "lookarounds ((?=...), (?!...), (?<=...), (?<!...)) are not supported; "
    "match the surrounding text instead, or use \\b for word boundaries",
    "ASSERT_NOT": "lookarounds ((?=...), (?!...), (?<=...), (?<!...)) are not supported; "
    "match the surrounding text instead, or use \\b for word boundaries",
    "ATOMIC_GROUP": "atomic groups ((?>...)) are not needed and not supported; write (?:...) instead",
    "POSSESSIVE_REPEAT": "possessive repeats (a*+, a++) are not needed and not supported; write a* or a+ instead",
}


def _unsupported(items: Any) -> str | None:
    """The first construct of a parsed `re` pattern that RE2 does not support, as a fix; None if none."""
    for op, argument in items:
        name = str(op)
        if name in _UNSUPPORTED:
            return _UNSUPPORTED[name]
        if name in {"MAX_REPEAT", "MIN_REPEAT"}:
            children = [argument[2]]
        elif name == "SUBPATTERN":
            children = [argument[-1]]
        elif name == "BRANCH":
            children = list(argument[1])
        else:
            children = []
        for child in children:
            found = _unsupported(child)
            if found is not None:
                return found
    return None


def _explain(pattern: str, flags: int, error: Exception) -> str:
    """Why RE2 refused `pattern`, with the fix."""
    try:
        parsed = sre_parse.parse(pattern, flags)
    except re.error as exc:
        return f"not a valid regular expression: {exc}"
    found = _unsupported(parsed)
    if found is not None:
        return found
    if "\\Z" in pattern:
        return "\\Z is not supported; write \\z (end of text) or $ instead"
    reason = error.args[0].decode() if error.args and isinstance(error.args[0], bytes) else str(error)
    return f"the pattern is not supported by the linear-time regex engine (RE2 syntax): {reason}"


def _options(flags: int) -> Any:
    options = re2.Options()
    options.log_errors = False  # the refusal goes back to the caller, not to the log
    options.case_sensitive = not flags & re.IGNORECASE
    options.dot_nl = bool(flags & re.DOTALL)
    return options


@lru_cache(maxsize=256)
def compile_pattern(pattern: str, flags: int) -> Pattern:
    """Compile a user's pattern once with RE2 (linear-time matching); raises ValueError with the fix.

    `flags` is a combination of re.IGNORECASE, re.MULTILINE and re.DOTALL.
    """
    if flags & ~SUPPORTED_FLAGS:
        raise ValueError(f"only IGNORECASE, MULTILINE and DOTALL are supported, not flags {flags & ~SUPPORTED_FLAGS}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"the pattern is {len(pattern)} characters; keep it under {MAX_PATTERN_CHARS}")
    # RE2 options have no multiline switch outside POSIX syntax; the inline flag says the same.
    source = f"(?m){pattern}" if flags & re.MULTILINE else pattern
    try:
        return re2.compile(source, _options(flags))
    except re2.error as exc:
        raise ValueError(_explain(pattern, flags, exc)) from None


_NOT_WORD = r"[^\pL\pN_]"


def compile_keywords(keywords: Sequence[str], ignore_case: bool) -> Pattern:
    """A pattern that finds any of `keywords` as a whole word (no letter, digit or _ on either side).

    Works for keywords that start or end with punctuation ("c++", "e-mail"); RE2 has no
    lookarounds, so the neighbours are matched, which is the same for a search.
    """
    alternatives = "|".join(re2.escape(keyword) for keyword in keywords)
    options = _options(re.IGNORECASE if ignore_case else 0)
    options.max_mem = 64 << 20  # up to 200 keywords of 200 characters
    try:
        return re2.compile(rf"(?:^|{_NOT_WORD})(?:{alternatives})(?:{_NOT_WORD}|$)", options)
    except re2.error as exc:
        raise ValueError(f"the keywords do not compile: {_explain(alternatives, 0, exc)}") from None

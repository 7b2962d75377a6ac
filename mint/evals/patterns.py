"""Regular expressions that benchmark graders and routing rules run, checked before they compile.

Python's `re` backtracks and has no time limit, so a pattern from a request could hang a
worker on a short input. `compile_pattern` bounds its size and refuses the shapes that
backtrack exponentially; every user-supplied pattern goes through it.
"""

from __future__ import annotations

import re
import re._parser as sre_parse  # the stdlib's own regex parser, to inspect a pattern's structure
from functools import lru_cache
from typing import Any

MAX_PATTERN_CHARS = 512

_REPEATS = {"MAX_REPEAT", "MIN_REPEAT"}


def _check_backtracking(items: Any, inside_unbounded: bool) -> None:
    """Refuse the two pattern shapes that make Python's backtracking engine exponential.

    A repetition inside an unbounded repetition (`(a+)+`, `(\\w+\\s?)*`) and backreferences.
    `re` has no time limit, so a pattern is refused rather than left to hang a worker.
    """
    for op, argument in items:
        name = str(op)
        if name.startswith("GROUPREF"):
            raise ValueError("backreferences (\\1, (?P=name), (?(1)...)) are not supported; match without them")
        if name in _REPEATS or name == "POSSESSIVE_REPEAT":
            _low, high, body = argument
            if inside_unbounded and high > 1 and name in _REPEATS:
                raise ValueError(
                    "a repetition inside an unbounded repetition, such as (a+)+, can take exponential time; "
                    "rewrite the pattern so that a repeated group does not itself repeat"
                )
            # Possessive repeats never backtrack, so they do not make what is inside dangerous.
            _check_backtracking(body, inside_unbounded or (name in _REPEATS and high == sre_parse.MAXREPEAT))
        elif name == "SUBPATTERN":
            _check_backtracking(argument[-1], inside_unbounded)
        elif name == "BRANCH":
            for branch in argument[1]:
                _check_backtracking(branch, inside_unbounded)
        elif name in {"ASSERT", "ASSERT_NOT"}:
            _check_backtracking(argument[1], inside_unbounded)
        elif name == "ATOMIC_GROUP":
            _check_backtracking(argument, inside_unbounded)


@lru_cache(maxsize=256)
def compile_pattern(pattern: str, flags: int) -> re.Pattern[str]:
    """Compile a grader pattern once, after checking its size and shape; raises ValueError with the fix."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"the pattern is {len(pattern)} characters; keep it under {MAX_PATTERN_CHARS}")
    try:
        parsed = sre_parse.parse(pattern, flags)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    _check_backtracking(parsed, inside_unbounded=False)
    return re.compile(pattern, flags)

"""The `json_match` grader: the output as strict JSON, equal to the reference, containing it, or valid under a schema.

Partial credit is by leaf field (`json_leaves`, `leaf_match`), so a reward can tell an answer
with one wrong field from one with all wrong; the `tool_call` grader scores arguments the same
way. Parsing refuses NaN and infinities and output over MAX_JSON_CHARS.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import Field, model_validator

from mint.evals.graders.spec import Grade, GradeContext, Output, _brief, _Config, _grader, _match, output_text
from mint.evals.json_schema import check_json_schema, json_equal, validate_json

# The most output parsed as JSON, so one grade stays cheap whatever the model wrote.
MAX_JSON_CHARS = 1_000_000


class JsonMatchConfig(_Config):
    """The output must be JSON and equal the reference, contain it, or satisfy a schema."""

    mode: Literal["equal", "subset", "schema"] = Field(
        default="equal",
        description="equal: same value; subset: every key of the reference (recursively) with the same value; "
        "schema: valid under json_schema, reference ignored.",
    )
    json_schema: dict[str, Any] | None = Field(default=None, description="For mode=schema: a JSON-schema subset.")
    allow_code_fence: bool = Field(default=False, description="Accept output wrapped in a ```json fence.")
    partial_credit: bool = Field(
        default=True, description="Score the fraction of leaf fields that match (false: 1 or 0). Passing needs all."
    )

    @model_validator(mode="after")
    def _schema_for_schema_mode(self) -> JsonMatchConfig:
        if self.mode == "schema":
            if self.json_schema is None:
                raise ValueError("mode 'schema' needs json_schema, e.g. {'type': 'object', 'required': ['city']}")
            check_json_schema(self.json_schema)
        elif self.json_schema is not None:
            raise ValueError(
                f"json_schema is used only in mode 'schema'; remove it or set mode to 'schema', not {self.mode!r}"
            )
        return self


_FENCE = re.compile(r"^```(?:json)?\s*\n(.*)\n```$", re.DOTALL)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_json(text: str, allow_code_fence: bool) -> Any:
    """Strict JSON (no NaN or Infinity); raises ValueError with the reason."""
    text = text.strip()
    if allow_code_fence and (fenced := _FENCE.match(text)):
        text = fenced.group(1)
    if len(text) > MAX_JSON_CHARS:
        raise ValueError(f"the output is {len(text)} characters; JSON grading reads at most {MAX_JSON_CHARS}")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("the JSON nests too deeply") from None


def _subset(reference: Any, value: Any) -> bool:
    if isinstance(reference, dict):
        return isinstance(value, dict) and all(
            key in value and _subset(item, value[key]) for key, item in reference.items()
        )
    return json_equal(reference, value)


Path = tuple[str, ...]


def json_leaves(value: Any) -> dict[Path, Any]:
    """Each leaf of a JSON value by its path of object keys: a non-empty object is walked into,
    anything else (a scalar, a list, an empty object) is one leaf. Iterative, so depth is no risk."""
    leaves: dict[Path, Any] = {}
    stack: list[tuple[Path, Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict) and item:
            stack += [((*path, str(key)), child) for key, child in item.items()]
        else:
            leaves[path] = item
    return leaves


def _at(value: Any, path: Path) -> tuple[bool, Any]:
    """(found, the value at `path` of object keys in `value`)."""
    for key in path:
        if not (isinstance(value, dict) and key in value):
            return False, None
        value = value[key]
    return True, value


def leaf_match(reference: Any, value: Any, *, count_extra: bool) -> tuple[int, int, list[str]]:
    """How many of the reference's leaves `value` has with the same value, out of how many, and
    the dotted paths that differ. With `count_extra`, leaves only `value` has count as wrong."""
    expected = json_leaves(reference)
    wrong = []
    for path, leaf in expected.items():
        found, got = _at(value, path)
        # An empty object in the reference asks only for an object there (as `_subset` does).
        if not (found and (isinstance(got, dict) if leaf == {} and not count_extra else json_equal(leaf, got))):
            wrong.append(path)
    total = len(expected)
    if count_extra:
        extra = [path for path in json_leaves(value) if path not in expected]
        wrong += extra
        total += len(extra)
    names = sorted(".".join(path) or "(the whole value)" for path in wrong)
    return total - len(wrong), total, names


@_grader("json_match", JsonMatchConfig)
def _json_match(output: Output, reference: Any, config: JsonMatchConfig, context: GradeContext) -> Grade:
    try:
        value = _parse_json(output_text(output), config.allow_code_fence)
    except ValueError as exc:
        return _match(False, f"the output is not JSON: {exc}")
    if config.mode == "schema":
        assert config.json_schema is not None  # the config validator guarantees it
        errors = validate_json(value, config.json_schema)
        return _match(not errors, "valid under the schema" if not errors else "; ".join(errors[:3]))
    compare = _subset if config.mode == "subset" else json_equal
    if compare(reference, value):
        return _match(True, f"JSON {config.mode} match")
    # Partial credit by leaf field, so a reward can tell close from far.
    if config.partial_credit and isinstance(reference, dict) and isinstance(value, dict) and reference:
        right, total, wrong = leaf_match(reference, value, count_extra=config.mode == "equal")
        listed = ", ".join(wrong[:5]) + (f" and {len(wrong) - 5} more" if len(wrong) > 5 else "")
        return Grade(score=right / total, passed=False, detail=f"{right} of {total} fields match; differ: {listed}")
    return _match(False, f"{_brief(json.dumps(value))} does not {config.mode}-match the reference")

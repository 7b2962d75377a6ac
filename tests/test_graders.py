"""Graders: every grader passing and failing, the edge cases of model output, and the closed registries.

The judge grader is tested with a deterministic local function standing in for the model:
in production the evals service injects a call to a deployed model through `GradeContext`.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from mint.errors import ConfigurationError, InvalidRequest
from mint.evals import graders
from mint.evals.graders import (
    Grade,
    GradeContext,
    GraderSpec,
    grade,
    grader_types,
    register_python_grader,
)
from mint.evals.graders import spec as grader_spec
from mint.evals.graders import text as text_graders
from mint.evals.json_schema import validate_json
from tests.conftest import REDOS_PATTERNS

pytestmark = pytest.mark.backend_free


def spec(kind: str, **config: Any) -> GraderSpec:
    return GraderSpec(type=kind, config=config)


def score(kind: str, output: Any, reference: Any, **config: Any) -> float:
    return grade(spec(kind, **config), output, reference).score


# ---- the spec --------------------------------------------------------------------------------


def test_the_registry_is_the_documented_closed_set() -> None:
    assert grader_types() == [
        "composite", "environment", "exact", "json_match", "judge", "normalized", "numeric", "python", "regex",
        "remote", "tool_call",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "param", "says"),
    [
        ({"type": "fuzzy"}, "type", "use one of: composite, environment, exact, json_match"),
        ("exact", None, "grader: Input should be a valid dictionary"),
        ({"type": "exact", "config": []}, "config", "grader config: Input should be a valid dictionary"),
        ({"type": "exact", "options": {}}, "options", "is not an option here; the options are: type, config"),
        ({"type": "regex"}, "config.pattern", "is required"),
        ({"type": "regex", "config": {"pattern": "a", "flags": 2}}, "config.flags", "the options are: pattern, mode"),
        ({"type": "numeric", "config": {"rel_tol": -1}}, "config.rel_tol", "greater than or equal to 0"),
        ({"type": "numeric", "config": {"abs_tol": float("nan")}}, "config.abs_tol", "finite"),
        ({"type": "json_match", "config": {"mode": "schema"}}, "config", "mode 'schema' needs json_schema"),
    ],
)
def test_bad_specs_raise_invalid_request_naming_the_field(data: Any, param: str | None, says: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        GraderSpec.model_validate(data)
    assert raised.value.param == param
    assert says in raised.value.message


def test_spec_round_trips_through_json_and_pickle() -> None:
    original = spec("regex", pattern=r"ANSWER: (\w+)", group=1)
    again = GraderSpec.model_validate(json.loads(original.model_dump_json()))
    assert again == original and grade(again, "ANSWER: x", "x").passed
    unpickled = pickle.loads(pickle.dumps(original))
    assert grade(unpickled, "ANSWER: x", "x").passed


def test_reward_is_the_grade_score() -> None:
    # The RL recipe scores completions through GraderSpec.reward (mint.trainer.recipes.rl.Grader).
    half = spec("json_match")
    reference = {"city": "Paris", "country": "France"}
    assert half.reward('{"city": "Paris", "country": "Spain"}', reference) == 0.5
    assert spec("exact").reward(" 4 ", "4") == 1.0 and spec("exact").reward("5", "4") == 0.0


def test_grade_refuses_nan_and_out_of_range_scores() -> None:
    for bad in (float("nan"), 1.5, -0.1):
        with pytest.raises(ValueError):
            Grade(score=bad, passed=False)


def test_registering_a_builtin_grader_twice_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="registered twice"):
        grader_spec._grader("exact", text_graders.ExactConfig)(lambda *args: Grade(score=1, passed=True))


# ---- exact and normalized --------------------------------------------------------------------


def test_exact() -> None:
    assert score("exact", "  85\n", "85") == 1.0
    assert score("exact", "85.0", "85") == 0.0
    assert score("exact", "Paris", "paris") == 0.0
    assert score("exact", "", "85") == 0.0
    assert score("exact", "", "") == 1.0
    assert score("exact", "b", ["a", "b"]) == 1.0  # any of several acceptable answers
    assert score("exact", "85", 85) == 1.0  # an integer reference compares as its digits


def test_exact_reads_messages_and_trajectories() -> None:
    assert score("exact", {"role": "assistant", "content": "85"}, "85") == 1.0
    assert (
        score(
            "exact",
            {"role": "assistant", "content": [{"type": "text", "text": "8"}, {"type": "text", "text": "5"}]},
            "85",
        )
        == 1.0
    )
    trajectory = [
        {"role": "assistant", "content": "thinking"},
        {"role": "tool", "tool_call_id": "c", "content": "85"},
        {"role": "assistant", "content": "85"},
    ]
    assert score("exact", trajectory, "85") == 1.0
    assert score("exact", {"role": "assistant", "content": None}, "85") == 0.0
    assert score("exact", None, "") == 1.0


def test_text_graders_refuse_a_non_text_reference() -> None:
    for reference in (1.5, None, {"a": 1}, [], True):
        with pytest.raises(InvalidRequest, match="reference"):
            score("exact", "1.5", reference)


def test_normalized() -> None:
    assert score("normalized", "  PARIS!! ", "paris") == 1.0
    assert score("normalized", "New   York,\tcity.", "new york city") == 1.0
    assert score("normalized", "ｐａｒｉｓ", "paris") == 1.0  # full-width letters fold under NFKC
    assert score("normalized", "the Paris", "Paris") == 0.0
    assert score("normalized", "the Paris", "Paris", remove_articles=True) == 1.0
    assert score("normalized", "Lyon", "Paris") == 0.0
    assert score("normalized", "", "Paris") == 0.0


# ---- regex -----------------------------------------------------------------------------------


def test_regex_modes_and_flags() -> None:
    assert score("regex", "ANSWER: Paris", None, pattern=r"ANSWER: \w+") == 1.0
    assert score("regex", "I think ANSWER: Paris", None, pattern=r"ANSWER: \w+") == 0.0  # fullmatch by default
    assert score("regex", "I think ANSWER: Paris", None, pattern=r"ANSWER: \w+", mode="search") == 1.0
    assert score("regex", "answer: paris", None, pattern=r"ANSWER: \w+") == 0.0
    assert score("regex", "answer: paris", None, pattern=r"ANSWER: \w+", ignore_case=True) == 1.0
    assert score("regex", "a\nb", None, pattern="a.b") == 0.0
    assert score("regex", "a\nb", None, pattern="a.b", dotall=True) == 1.0
    assert score("regex", "x\nEND", None, pattern="^END$", mode="search", multiline=True) == 1.0
    assert score("regex", "", None, pattern=r"\w+") == 0.0


def test_regex_group_compared_with_the_reference() -> None:
    answer = {"pattern": r"ANSWER: (?P<word>\w+)", "group": "word"}
    assert score("regex", "ANSWER: Paris", "Paris", **answer) == 1.0
    result = grade(spec("regex", **answer), "ANSWER: Lyon", "Paris")
    assert (result.score, result.passed) == (0.0, False) and "'Lyon', not 'Paris'" in result.detail
    assert score("regex", "ANSWER: Paris", "Paris", pattern=r"ANSWER: (\w+)", group=1) == 1.0


@pytest.mark.parametrize(("pattern", "text"), REDOS_PATTERNS)
@pytest.mark.parametrize("mode", ["fullmatch", "search"])
def test_regex_runs_catastrophic_patterns_in_linear_time(pattern: str, text: str, mode: str) -> None:
    assert len(text) <= 20_000
    assert score("regex", text, None, pattern=pattern, mode=mode) == 0.0


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        (r"(a)\1", "backreferences"),
        ("(?P<x>a)(?P=x)", "backreferences"),
        ("foo(?=bar)", "lookarounds"),
        ("(?<!x)foo", "lookarounds"),
        ("(?>a+)b", "atomic groups"),
        (r"a\Z", "write \\z"),
        ("(unclosed", "not a valid regular expression"),
        ("a" * 600, "at most 512 characters"),
    ],
)
def test_regex_refuses_unsupported_or_broken_patterns(pattern: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match="config") as raised:
        spec("regex", pattern=pattern)
    assert says in raised.value.message


def test_regex_allows_safe_repetition_and_checks_groups() -> None:
    assert score("regex", "aaa-bbb", None, pattern="(?:a{1,3}-)?b+") == 1.0
    assert score("regex", "ab ab ab", None, pattern="(?:ab ?)+") == 1.0
    with pytest.raises(InvalidRequest, match="group 2 does not exist"):
        spec("regex", pattern="(a)", group=2)
    with pytest.raises(InvalidRequest, match="no group named 'x'"):
        spec("regex", pattern="(a)", group="x")


def test_regex_output_length_is_bounded() -> None:
    result = grade(spec("regex", pattern="a*"), "a" * 30_000, None)
    assert not result.passed and "at most" in result.detail


# ---- json_match ------------------------------------------------------------------------------


def test_json_equal() -> None:
    reference = {"city": "Paris", "country": "France"}
    assert score("json_match", '{"country": "France", "city": "Paris"}', reference) == 1.0
    assert score("json_match", ' {"city":"Paris","country":"France"}\n', reference) == 1.0
    assert score("json_match", '{"n": 1.0}', {"n": 1}) == 1.0
    assert score("json_match", '{"n": true}', {"n": 1}) == 0.0  # booleans are not numbers
    assert score("json_match", "[1, 2]", [1, 2]) == 1.0
    assert score("json_match", "[2, 1]", [1, 2]) == 0.0


def test_json_partial_credit_and_failures() -> None:
    reference = {"city": "Paris", "country": "France"}
    half = grade(spec("json_match"), '{"city": "Paris", "country": "Spain"}', reference)
    assert (half.score, half.passed) == (0.5, False) and "country" in half.detail
    extra = grade(spec("json_match"), '{"city": "Paris", "country": "France", "zip": 1}', reference)
    assert not extra.passed and extra.score == pytest.approx(2 / 3)
    for output in ("", "not json", '{"city": "Paris"', "```json\n{}\n```", "NaN", '{"x": Infinity}', "[" * 100_000):
        result = grade(spec("json_match"), output, reference)
        assert (result.score, result.passed) == (0.0, False)
        assert "not JSON" in result.detail
    assert score("json_match", "1" * 5000, 1) == 0.0  # beyond Python's int-parsing limit: not JSON, no crash


def test_json_code_fence_only_when_allowed() -> None:
    fenced = '```json\n{"a": 1}\n```'
    assert score("json_match", fenced, {"a": 1}) == 0.0
    assert score("json_match", fenced, {"a": 1}, allow_code_fence=True) == 1.0


def test_json_subset() -> None:
    reference = {"city": "Paris", "geo": {"country": "France"}}
    output = '{"city": "Paris", "geo": {"country": "France", "lat": 48.9}, "pop": 2}'
    assert score("json_match", output, reference, mode="subset") == 1.0
    assert score("json_match", output, reference) < 1.0
    assert score("json_match", '{"city": "Paris", "geo": {}}', reference, mode="subset") == 0.5


SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "rank": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["big", "old"]}},
        "kind": {"const": "city"},
        "note": {"type": ["string", "null"]},
    },
    "required": ["city", "rank"],
    "additionalProperties": False,
}


def test_json_schema_mode() -> None:
    valid = '{"city": "Paris", "rank": 1.0, "tags": ["old"], "kind": "city", "note": null}'
    assert score("json_match", valid, None, mode="schema", json_schema=SCHEMA) == 1.0
    result = grade(
        spec("json_match", mode="schema", json_schema=SCHEMA),
        '{"city": 3, "tags": ["new"], "kind": "town", "extra": true}',
        None,
    )
    assert not result.passed and result.score == 0.0
    assert "$.city: expected string" in result.detail and "$.rank: is required" in result.detail
    every = validate_json(json.loads('{"rank": true, "tags": ["new"], "kind": "town", "extra": 1}'), SCHEMA)
    assert every == [
        "$.city: is required",
        "$.rank: expected integer, got true",
        '$.tags[0]: must be one of ["big", "old"]',
        '$.kind: must be "city"',
        "$.extra: is not an allowed property",
    ]
    assert score("json_match", "[]", None, mode="schema", json_schema=SCHEMA) == 0.0


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"$ref": "#/x"}, "unsupported keyword(s) $ref"),
        ({"type": "text"}, "'text' is not one of"),
        ({"items": {"type": 5}}, "json_schema.items.type: 5 is not one of"),
        ({"properties": {"a": {"pattern": "x"}}}, "json_schema.properties.a: unsupported keyword(s) pattern"),
        ({"enum": []}, "enum: must be a non-empty list"),
        ({"required": "a"}, "required: must be a list"),
    ],
)
def test_json_schema_outside_the_subset_is_refused(schema: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        spec("json_match", mode="schema", json_schema=schema)
    assert says in raised.value.message


# ---- numeric ---------------------------------------------------------------------------------


def test_numeric_takes_the_last_number() -> None:
    assert score("numeric", "37 + 48 = 85", "85") == 1.0
    assert score("numeric", "85 is not 37 + 48", "85") == 0.0
    assert score("numeric", "The total is 1,234.50 dollars.", 1234.5) == 1.0
    assert score("numeric", "It is -11.", -11) == 1.0
    assert score("numeric", "1.5e3", 1500) == 1.0
    assert score("numeric", ".5", 0.5) == 1.0
    assert score("numeric", "85.0000001", "85") == 1.0  # within abs_tol 1e-6
    assert score("numeric", "85.01", "85") == 0.0


def test_numeric_tolerances() -> None:
    assert score("numeric", "101", 100, rel_tol=0.02) == 1.0
    assert score("numeric", "103", 100, rel_tol=0.02) == 0.0
    assert score("numeric", "0.3", 0.25, abs_tol=0.1) == 1.0
    assert score("numeric", "0.1", 0.1, rel_tol=0.0, abs_tol=0.0) == 1.0  # a float reference means its decimal


def test_numeric_edge_cases() -> None:
    for output in ("", "no digits here", "NaN", "inf"):
        result = grade(spec("numeric"), output, 1)
        assert (result.score, result.passed) == (0.0, False) and "no number" in result.detail
    huge = "9" * 500
    assert score("numeric", huge, huge) == 1.0
    assert score("numeric", huge, "9" * 499 + "8", rel_tol=0.0, abs_tol=0.0) == 0.0
    assert score("numeric", "1e400", "1e400") == 1.0  # beyond float range: compared as decimals
    assert score("numeric", "1e400", "1e399") == 0.0
    assert "too large" in grade(spec("numeric"), "1e99999999999999999999", 1).detail
    assert "too large" in grade(spec("numeric"), "9" * 2000, 1).detail


@pytest.mark.parametrize("reference", [float("nan"), float("inf"), "abc", None, True, "1 2"])
def test_numeric_refuses_a_reference_that_is_not_a_finite_number(reference: Any) -> None:
    with pytest.raises(InvalidRequest, match="finite number"):
        score("numeric", "1", reference)


# ---- tool_call -------------------------------------------------------------------------------

LOOKUP = {"name": "lookup_order", "arguments": {"order_id": "A1"}}
CANCEL = {"name": "cancel_order", "arguments": {"order_id": "A1"}}


def structured(*calls: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
            }
            for n, c in enumerate(calls)
        ],
    }


def test_tool_call_structured_and_text_forms() -> None:
    assert score("tool_call", structured(LOOKUP), LOOKUP) == 1.0
    assert score("tool_call", json.dumps(LOOKUP), LOOKUP) == 1.0
    assert score("tool_call", f"Let me check.\n<tool_call>\n{json.dumps(LOOKUP)}\n</tool_call>", LOOKUP) == 1.0
    string_arguments = {"name": "lookup_order", "arguments": json.dumps({"order_id": "A1"})}
    assert score("tool_call", json.dumps(string_arguments), LOOKUP) == 1.0
    assert score("tool_call", {"role": "assistant", "content": json.dumps(LOOKUP)}, LOOKUP) == 1.0


def test_tool_call_partial_credit() -> None:
    wrong_arguments = {"name": "lookup_order", "arguments": {"order_id": "B2"}}
    result = grade(spec("tool_call"), json.dumps(wrong_arguments), LOOKUP)
    assert (result.score, result.passed) == (0.5, False)
    two = {"name": "convert", "arguments": {"amount": 10, "to": "USD"}}
    half_right = {"name": "convert", "arguments": {"amount": 10.0, "to": "GBP"}}
    assert score("tool_call", json.dumps(half_right), two) == 0.75
    assert score("tool_call", json.dumps(half_right), two, name_weight=0.2) == pytest.approx(0.6)
    assert score("tool_call", json.dumps(CANCEL), LOOKUP) == 0.0
    bad_json = {
        "role": "assistant",
        "tool_calls": [{"id": "c", "function": {"name": "lookup_order", "arguments": "{oops"}}],
    }
    assert score("tool_call", bad_json, LOOKUP) == 0.5


def test_tool_call_extra_arguments() -> None:
    extra = {"name": "lookup_order", "arguments": {"order_id": "A1", "verbose": True}}
    assert score("tool_call", json.dumps(extra), LOOKUP) == 0.75
    assert score("tool_call", json.dumps(extra), LOOKUP, allow_extra_arguments=True) == 1.0


def test_tool_call_sequences() -> None:
    assert score("tool_call", [structured(LOOKUP), structured(CANCEL)], [LOOKUP, CANCEL]) == 1.0
    assert score("tool_call", structured(LOOKUP, CANCEL), [LOOKUP, CANCEL]) == 1.0
    assert score("tool_call", structured(LOOKUP), [LOOKUP, CANCEL]) == 0.5  # a missing step costs
    assert score("tool_call", structured(LOOKUP, CANCEL, CANCEL), [LOOKUP, CANCEL]) == pytest.approx(2 / 3)
    assert score("tool_call", structured(CANCEL, LOOKUP), [LOOKUP, CANCEL]) == 0.0
    assert score("tool_call", structured(CANCEL, LOOKUP), [LOOKUP, CANCEL], ordered=False) == 1.0


def test_tool_call_when_no_call_is_expected_or_made() -> None:
    assert grade(spec("tool_call"), "The order is on its way.", []).passed
    assert score("tool_call", json.dumps(LOOKUP), []) == 0.0
    assert score("tool_call", "", LOOKUP) == 0.0
    assert score("tool_call", "{not json", LOOKUP) == 0.0
    assert score("tool_call", None, LOOKUP) == 0.0


@pytest.mark.parametrize("reference", [None, "lookup_order", {"arguments": {}}, [{"name": "x", "arguments": "[]"}]])
def test_tool_call_refuses_a_malformed_reference(reference: Any) -> None:
    with pytest.raises(InvalidRequest, match="tool_call reference"):
        score("tool_call", "", reference)


# ---- python ----------------------------------------------------------------------------------


@register_python_grader("tests.length_ratio")
def _length_ratio(output: Any, reference: Any, options: Any) -> float:
    return min(len(graders.output_text(output)) / options.get("target", 10), 1.0)


@register_python_grader("tests.contains")
def _contains(output: Any, reference: Any, options: Any) -> Grade:
    found = str(reference) in graders.output_text(output)
    return Grade(score=float(found), passed=found, detail="contains" if found else "missing")


def test_python_grader_registered_in_code() -> None:
    assert score("python", "abcde", None, name="tests.length_ratio") == 0.5
    result = grade(spec("python", name="tests.length_ratio", options={"target": 5}), "abcde", None)
    assert (result.score, result.passed) == (1.0, True)
    assert grade(spec("python", name="tests.contains"), "x Paris y", "Paris").detail == "contains"
    assert "tests.contains" in graders.python_grader_names()


def test_python_grader_names_are_closed_and_unique() -> None:
    with pytest.raises(InvalidRequest, match="never sent with a request") as raised:
        spec("python", name="os.system")
    assert raised.value.param == "config.name"
    with pytest.raises(ConfigurationError, match="already registered"):
        register_python_grader("tests.contains")(_contains)
    with pytest.raises(ConfigurationError, match="must match"):
        register_python_grader("Bad Name!")


# ---- judge -----------------------------------------------------------------------------------

RUBRIC = "Full marks if the answer names the capital of France."


class FakeJudge:
    """Stands in for the deployed judge model: records each prompt and gives a scripted reply."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.prompts: list[str] = []

    def __call__(self, prompt: str, model: str | None) -> str:
        self.prompts.append(prompt)
        return self.reply


def test_judge_builds_the_prompt_and_parses_the_score() -> None:
    judge = FakeJudge("It names Paris. SCORE: 3 is wrong, I mean\nSCORE: 8")
    result = grade(spec("judge", rubric=RUBRIC), "It is Paris.", "Paris", context=GradeContext(judge=judge))
    assert (result.score, result.passed) == (0.8, True)
    (prompt,) = judge.prompts
    assert RUBRIC in prompt and "Paris" in prompt and "<answer>\nIt is Paris.\n</answer>" in prompt
    assert prompt.endswith("SCORE: <integer from 0 to 10>")


def test_judge_thresholds_and_bad_replies() -> None:
    low = grade(spec("judge", rubric=RUBRIC, max_score=5), "x", None, context=GradeContext(judge=FakeJudge("score: 3")))
    assert (low.score, low.passed) == (0.6, False)
    over = grade(spec("judge", rubric=RUBRIC), "x", None, context=GradeContext(judge=FakeJudge("SCORE: 99")))
    assert over.score == 1.0
    garbage = grade(spec("judge", rubric=RUBRIC), "x", None, context=GradeContext(judge=FakeJudge("I refuse.")))
    assert (garbage.score, garbage.passed) == (0.0, False) and "no 'SCORE: <n>'" in garbage.detail


def test_judge_needs_an_injected_model() -> None:
    with pytest.raises(InvalidRequest, match="GradeContext"):
        grade(spec("judge", rubric=RUBRIC, model="judge-deployment"), "x", None)
    with pytest.raises(InvalidRequest, match="config.rubric"):
        spec("judge", rubric="")


# ---- partial credit --------------------------------------------------------------------------


def test_json_partial_credit_is_by_leaf_field() -> None:
    reference = {"name": "Ada", "address": {"city": "London", "zip": "N1", "geo": {"lat": 51.5, "lon": -0.1}}}
    # 5 leaves: name, address.city, address.zip, address.geo.lat, address.geo.lon; 3 right.
    output = {"name": "Ada", "address": {"city": "London", "zip": "E2", "geo": {"lat": 51.5, "lon": 0.0}}}
    result = grade(spec("json_match"), json.dumps(output), reference)
    assert (result.score, result.passed) == (0.6, False)
    assert "3 of 5 fields match" in result.detail and "address.geo.lon, address.zip" in result.detail
    # An extra leaf counts against an equal match (3 of 6), not a subset one (3 of 5).
    extra = {**output, "phone": "1"}
    assert score("json_match", json.dumps(extra), reference) == 0.5
    assert score("json_match", json.dumps(extra), reference, mode="subset") == 0.6
    # A list is one leaf; an object where a leaf was expected misses that leaf.
    assert score("json_match", '{"tags": [1, 2], "n": {"x": 1}}', {"tags": [2, 1], "n": 1}) == 0.0
    assert score("json_match", '{"tags": [1, 2], "n": 2}', {"tags": [1, 2], "n": 1}) == 0.5
    # Off: all or nothing, and passing still means every field.
    assert score("json_match", json.dumps(output), reference, partial_credit=False) == 0.0
    assert grade(spec("json_match"), json.dumps(reference), reference).passed


def test_json_partial_credit_walks_deep_objects() -> None:
    deep: Any = 1
    for _ in range(200):
        deep = {"k": deep}
    assert score("json_match", json.dumps({"a": deep, "b": 2}), {"a": deep, "b": 3}) == 0.5


def test_tool_call_partial_credit_by_name_and_argument_leaves() -> None:
    reference = {"name": "book", "arguments": {"city": "Paris", "dates": {"from": "05-01", "to": "05-04"}, "n": 2}}
    # name right (0.5) + 3 of 4 argument leaves (0.5 * 0.75) = 0.875
    got = {"name": "book", "arguments": {"city": "Paris", "dates": {"from": "05-01", "to": "05-05"}, "n": 2}}
    result = grade(spec("tool_call"), json.dumps(got), reference)
    assert (result.score, result.passed) == (0.875, False)
    # The name is required: the right arguments under another name score nothing.
    assert score("tool_call", json.dumps({**reference, "name": "reserve"}), reference) == 0.0
    assert score("tool_call", json.dumps(got), reference, name_weight=0.0) == 0.75
    assert score("tool_call", json.dumps(got), reference, partial_credit=False) == 0.0
    assert grade(spec("tool_call", partial_credit=False), json.dumps(reference), reference).passed


def test_numeric_partial_band() -> None:
    band = {"abs_tol": 1.0, "partial_band": 5.0}
    inside = grade(spec("numeric", **band), "100.5", 100)
    assert (inside.score, inside.passed) == (1.0, True)
    # 3 away: (5 - 3) / (5 - 1) = 0.5, not passed.
    half = grade(spec("numeric", **band), "The answer is 103", 100)
    assert (half.score, half.passed) == (0.5, False) and "partial band" in half.detail
    assert score("numeric", "96", 100, **band) == 0.25
    assert score("numeric", "105", 100, **band) == 0.0
    assert score("numeric", "1000", 100, **band) == 0.0
    # Relative band: 10% of the reference, tolerance 0 (the defaults are ~0): 80 is 20 off in a band of 100.
    assert score("numeric", "1080", 1000, partial_rel_band=0.1) == pytest.approx(0.2)
    # Without a band the grader is as it always was: 1 or 0.
    assert score("numeric", "101", 100) == 0.0


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"partial_band": 0}, "greater than 0"),
        ({"partial_band": 0.5, "abs_tol": 1.0}, "must be larger than abs_tol"),
        ({"partial_rel_band": 0.01, "rel_tol": 0.05}, "must be larger than rel_tol"),
        ({"partial_band": float("inf")}, "finite"),
        ({"rel_tol": 2}, "less than or equal to 1"),
    ],
)
def test_numeric_band_bounds(config: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        spec("numeric", **config)
    assert says in raised.value.message


# ---- composite -------------------------------------------------------------------------------

FORMAT_AND_ANSWER = {
    "parts": [
        {"weight": 1, "grader": {"type": "regex", "config": {"pattern": r"ANSWER: \d+", "mode": "search"}}},
        {"weight": 3, "grader": {"type": "numeric"}},
    ]
}


def test_composite_is_the_weighted_mean_of_its_parts() -> None:
    both = grade(spec("composite", **FORMAT_AND_ANSWER), "so ANSWER: 42", 42)
    assert (both.score, both.passed) == (1.0, True)
    format_only = grade(spec("composite", **FORMAT_AND_ANSWER), "so ANSWER: 41", 42)
    assert (format_only.score, format_only.passed) == (0.25, False)
    assert [(part.type, part.weight, part.grade.passed) for part in format_only.parts] == [
        ("regex", 0.25, True),
        ("numeric", 0.75, False),
    ]
    assert format_only.detail == "regex 1.00 x 0.25; numeric 0.00 x 0.75"
    answer_only = grade(spec("composite", **FORMAT_AND_ANSWER), "42", 42)
    assert (answer_only.score, answer_only.passed) == (0.75, False)
    # With a threshold, passing is the weighted score reaching it.
    lenient = spec("composite", **FORMAT_AND_ANSWER, pass_threshold=0.7)
    assert grade(lenient, "42", 42).passed and not grade(lenient, "so ANSWER: 41", 42).passed
    # The record a trajectory keeps lists the parts.
    record = format_only.record()
    assert [part["grade"]["score"] for part in record["parts"]] == [1.0, 0.0]


def test_composite_parts_keep_their_partial_credit_and_nest() -> None:
    inner = {"type": "composite", "config": {"parts": [{"weight": 1, "grader": {"type": "json_match"}}]}}
    nested = spec(
        "composite",
        parts=[
            {"weight": 1, "grader": inner},
            {
                "weight": 1,
                "grader": {"type": "json_match", "config": {"mode": "schema", "json_schema": {"type": "object"}}},
            },
        ],
    )
    # json_match: 1 of 2 fields (0.5); schema: valid (1.0); mean 0.75.
    assert grade(nested, '{"a": 1, "b": 3}', {"a": 1, "b": 2}).score == 0.75
    assert nested.kinds() == {"composite", "json_match"}


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"parts": []}, "at least 1 item"),
        ({"parts": [{"weight": 0, "grader": {"type": "exact"}}]}, "greater than 0"),
        ({"parts": [{"weight": 1, "grader": {"type": "regex"}}]}, "parts[0].grader.config.pattern: is required"),
        ({"parts": [{"weight": 1, "grader": {"type": "fuzzy"}}]}, "parts[0].grader: unknown grader type 'fuzzy'"),
        (
            {"parts": [{"weight": 1, "grader": {"type": "exact", "penalties": {"step": 0.1}}}]},
            "penalties belong on the composite itself",
        ),
        ({"parts": [{"weight": 1, "grader": {"type": "exact"}}] * 9}, "at most 8 items"),
    ],
)
def test_composite_bad_configs_name_the_part(config: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        spec("composite", **config)
    assert says in raised.value.message


def test_composite_nesting_is_bounded() -> None:
    config: dict[str, Any] = {"parts": [{"weight": 1, "grader": {"type": "exact"}}]}
    for _ in range(2):
        config = {"parts": [{"weight": 1, "grader": {"type": "composite", "config": config}}]}
    assert grade(spec("composite", **config), "x", "x").passed  # three deep: allowed
    deeper = {"parts": [{"weight": 1, "grader": {"type": "composite", "config": config}}]}
    with pytest.raises(InvalidRequest, match="nest at most 3 deep"):
        spec("composite", **deeper)
    for _ in range(5000):  # refused before it is parsed, so depth is no risk
        deeper = {"parts": [{"weight": 1, "grader": {"type": "composite", "config": deeper}}]}
    with pytest.raises(InvalidRequest, match="nest at most 3 deep"):
        spec("composite", **deeper)


# ---- penalties -------------------------------------------------------------------------------


def test_penalties_shape_the_reward_not_the_grade() -> None:
    costly = GraderSpec(type="exact", penalties={"step": 0.1, "token": 0.001, "free_tokens": 100})
    # 3 steps (2 beyond the free one) and 350 tokens (250 beyond the free 100): 1 - 0.2 - 0.25.
    assert costly.reward("4", "4", steps=3, tokens=350) == pytest.approx(0.55)
    assert costly.reward("4", "4") == 1.0  # one step, no tokens: nothing to pay
    assert grade(costly, "4", "4").score == 1.0  # benchmarks see the grade, never the penalty
    # Floored at 0 by default: a wrong answer is not made worse (or better) by its length.
    assert costly.reward("5", "4", steps=3, tokens=350) == 0.0
    assert costly.reward("4", "4", steps=20, tokens=0) == 0.0
    negative = GraderSpec(type="exact", penalties={"step": 0.1, "allow_negative": True})
    assert negative.reward("5", "4", steps=4) == pytest.approx(-0.3)
    assert negative.reward("4", "4", steps=4) == pytest.approx(0.7)


def test_penalties_are_validated_and_absent_ones_leave_the_spec_as_it_was() -> None:
    for bad, field in (({"step": -1}, "step"), ({"token": 0.5}, "token"), ({"steps": 1}, "steps")):
        with pytest.raises(InvalidRequest) as raised:
            GraderSpec.model_validate({"type": "exact", "penalties": bad})
        assert raised.value.param == f"penalties.{field}"
    # No `penalties` key when unset: stored benchmark content and plans keep their bytes.
    assert spec("exact").model_dump() == {"type": "exact", "config": {}}
    with_penalties = GraderSpec(type="exact", penalties={"token": 0.001})
    assert GraderSpec.model_validate(with_penalties.model_dump()) == with_penalties


def test_rl_rewards_refuse_the_judge_anywhere_in_the_spec() -> None:
    judged = {
        "type": "composite",
        "config": {"parts": [{"weight": 1, "grader": {"type": "judge", "config": {"rubric": "r"}}}]},
    }
    with pytest.raises(InvalidRequest, match="cannot score RL samples"):
        graders.reward_spec(judged)
    assert graders.reward_spec({"type": "composite", "config": FORMAT_AND_ANSWER}).type == "composite"

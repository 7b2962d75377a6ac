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
from mint.evals.json_schema import validate_json
from tests.conftest import REDOS_PATTERNS

pytestmark = pytest.mark.backend_free


def spec(kind: str, **config: Any) -> GraderSpec:
    return GraderSpec(type=kind, config=config)


def score(kind: str, output: Any, reference: Any, **config: Any) -> float:
    return grade(spec(kind, **config), output, reference).score


# ---- the spec --------------------------------------------------------------------------------


def test_the_registry_is_the_documented_closed_set() -> None:
    assert grader_types() == ["exact", "json_match", "judge", "normalized", "numeric", "python", "regex", "tool_call"]


@pytest.mark.parametrize(
    ("data", "param", "says"),
    [
        ({"type": "fuzzy"}, "type", "use one of: exact, json_match"),
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
        graders._grader("exact", graders.ExactConfig)(lambda *args: Grade(score=1, passed=True))


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

    def __call__(self, prompt: str) -> str:
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

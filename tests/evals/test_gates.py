"""Deployment gates: a pure verdict from a spec and two runs' outcomes, kept as a record."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mint.errors import InvalidRequest
from mint.evals.compare import RunOutcomes, TaskOutcome
from mint.evals.gates import GateSpec, GateVerdict, evaluate_gate

pytestmark = pytest.mark.backend_free

BENCHMARK = "support"


def run(run_id: str, passed: list[bool], version: str = "bmv_1") -> RunOutcomes:
    return RunOutcomes(run_id, version, [TaskOutcome(f"t{i}", ok, float(ok)) for i, ok in enumerate(passed)])


PRODUCTION = run("prod", [True] * 40 + [False] * 10)  # 80%


def verdict(spec: GateSpec, candidate: RunOutcomes, production: RunOutcomes | None = PRODUCTION) -> GateVerdict:
    return evaluate_gate(spec, benchmark_name=BENCHMARK, candidate=candidate, production=production)


def test_a_better_candidate_passes_and_the_record_keeps_the_numbers() -> None:
    candidate = run("cand", [True] * 45 + [False] * 5)
    result = verdict(GateSpec(benchmark=BENCHMARK, min_pass_rate=0.85, max_regression=0.0), candidate)
    assert result.passed and result.reason.startswith("every check passed")
    assert result.candidate_pass_rate == 0.9 and result.production_pass_rate == 0.8
    assert result.delta == pytest.approx(0.1) and result.interval_low is not None and result.interval_low > 0
    assert [check.name for check in result.checks] == ["min_pass_rate", "max_regression", "no_significant_regression"]
    record = result.model_dump(mode="json")
    assert GateVerdict.model_validate(record) == result
    assert record["candidate_run_id"] == "cand" and record["production_run_id"] == "prod"


def test_below_the_threshold_fails_with_the_reason() -> None:
    candidate = run("cand", [True] * 38 + [False] * 12)
    result = verdict(GateSpec(benchmark=BENCHMARK, min_pass_rate=0.8), candidate)
    assert not result.passed
    assert result.reason.startswith("pass rate 76.0% < the required 80.0%")


def test_a_small_drop_within_the_allowance_passes_but_a_significant_regression_fails() -> None:
    small = run("small", [True] * 39 + [False] * 11)  # one task broken
    assert verdict(GateSpec(benchmark=BENCHMARK, max_regression=0.05), small).passed
    assert not verdict(GateSpec(benchmark=BENCHMARK, max_regression=0.0), small).passed

    large = run("large", [True] * 20 + [False] * 30)  # 20 tasks broken, none fixed
    result = verdict(GateSpec(benchmark=BENCHMARK, max_regression=0.5), large)
    assert not result.passed
    assert [check.name for check in result.checks if not check.passed] == ["no_significant_regression"]
    assert "entirely below 0" in result.reason and result.interval_high is not None and result.interval_high < 0
    # Without the significance check the allowance alone decides.
    lenient = GateSpec(benchmark=BENCHMARK, max_regression=0.5, require_no_significant_regression=False)
    assert verdict(lenient, large).passed


def test_a_first_deployment_has_only_the_threshold() -> None:
    candidate = run("cand", [True] * 9 + [False])
    result = verdict(GateSpec(benchmark=BENCHMARK, min_pass_rate=0.9), candidate, production=None)
    assert result.passed and result.production_run_id is None and result.delta is None
    assert [check.name for check in result.checks] == ["min_pass_rate"]
    empty = verdict(GateSpec(benchmark=BENCHMARK), candidate, production=None)
    assert empty.passed and "nothing to check" in empty.reason


def test_wrong_benchmark_other_version_and_empty_specs_are_refused() -> None:
    spec = GateSpec(benchmark="other", min_pass_rate=0.5)
    with pytest.raises(InvalidRequest, match="requires benchmark 'other'"):
        verdict(spec, run("cand", [True]))
    with pytest.raises(InvalidRequest, match="different benchmark versions"):
        verdict(GateSpec(benchmark=BENCHMARK), run("cand", [True], version="bmv_2"))
    with pytest.raises(ValidationError, match="checks nothing"):
        GateSpec(benchmark=BENCHMARK, require_no_significant_regression=False)
    with pytest.raises(InvalidRequest, match="no graded tasks"):
        verdict(GateSpec(benchmark=BENCHMARK), run("cand", []))

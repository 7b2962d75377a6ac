"""Deployment gates: may a candidate replace what is in production, by one benchmark?

A gate names a benchmark and up to three checks:

- `min_pass_rate`: the candidate's pass rate on its run is at least this;
- `max_regression`: the candidate's pass rate on the tasks both runs share is at most this
  much below production's (0.02: two points);
- `require_no_significant_regression`: the paired bootstrap interval of (candidate -
  production) does not lie entirely below 0.

`evaluate_gate` is a pure function of the spec and the two runs' outcomes; it returns a
`GateVerdict` whose `model_dump()` is the record a deployment revision keeps. Its caller adds
`warnings` (a judge of the benchmark version the experts disagree with): they never decide. Without a run
in production (a first deployment) only `min_pass_rate` applies.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mint.errors import InvalidRequest
from mint.evals.compare import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Comparison,
    RunOutcomes,
    compare_runs,
)
from mint.schemas.common import MAX_SEED


class GateSpec(BaseModel):
    """What a deployment requires of a candidate on one benchmark."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    benchmark: str = Field(min_length=1, max_length=200, description="The benchmark's name.")
    min_pass_rate: float | None = Field(default=None, ge=0.0, le=1.0, description="Lowest pass rate accepted.")
    max_regression: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Largest drop of pass rate against production accepted (0.02 = 2 points).",
    )
    require_no_significant_regression: bool = Field(
        default=True, description="Refuse when the bootstrap interval of the difference lies below 0."
    )
    confidence: float = Field(default=DEFAULT_CONFIDENCE, gt=0.0, lt=1.0)
    resamples: int = Field(default=DEFAULT_RESAMPLES, ge=100, le=100_000)
    seed: int = Field(default=DEFAULT_SEED, ge=0, le=MAX_SEED)

    @model_validator(mode="after")
    def _has_a_check(self) -> GateSpec:
        if self.min_pass_rate is None and self.max_regression is None and not self.require_no_significant_regression:
            raise ValueError(
                "the gate checks nothing: set min_pass_rate, max_regression or require_no_significant_regression"
            )
        return self


class GateCheck(BaseModel):
    """One check of a gate and its outcome."""

    name: str
    passed: bool
    detail: str


class GateVerdict(BaseModel):
    """The verdict of a gate, with the numbers it was decided on."""

    passed: bool
    reason: str
    benchmark: str
    benchmark_version_id: str
    candidate_run_id: str
    production_run_id: str | None
    candidate_pass_rate: float
    production_pass_rate: float | None = Field(description="Production's pass rate on the shared tasks.")
    delta: float | None = Field(description="Candidate minus production on the shared tasks.")
    interval_low: float | None
    interval_high: float | None
    checks: list[GateCheck]
    warnings: list[str] = Field(
        default_factory=list,
        description="What the verdict should be read with, without changing it: each judge grading this "
        "benchmark version whose agreement with the experts' reviews is below the threshold.",
    )


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def evaluate_gate(
    spec: GateSpec, *, benchmark_name: str, candidate: RunOutcomes, production: RunOutcomes | None
) -> GateVerdict:
    """Decide `spec` for `candidate` against `production` (None when nothing is in production yet).

    Both runs must be of `spec.benchmark` (named `benchmark_name`) and, when there is a
    production run, of the same benchmark version; otherwise InvalidRequest says what to run.
    """
    if benchmark_name != spec.benchmark:
        raise InvalidRequest(
            f"the gate requires benchmark {spec.benchmark!r}, but the runs evaluated {benchmark_name!r}; "
            f"evaluate the candidate on {spec.benchmark!r}",
            param="benchmark",
        )
    if not candidate.outcomes:
        raise InvalidRequest(f"candidate run {candidate.run_id} has no graded tasks", param="candidate")
    pass_rate = sum(o.passed for o in candidate.outcomes) / len(candidate.outcomes)
    checks: list[GateCheck] = []
    if spec.min_pass_rate is not None:
        ok = pass_rate >= spec.min_pass_rate
        checks.append(
            GateCheck(
                name="min_pass_rate",
                passed=ok,
                detail=f"pass rate {_pct(pass_rate)} {'>=' if ok else '<'} the required {_pct(spec.min_pass_rate)}",
            )
        )
    comparison: Comparison | None = None
    if production is not None:
        comparison = compare_runs(
            production, candidate, resamples=spec.resamples, confidence=spec.confidence, seed=spec.seed
        )
        delta = comparison.accuracy_delta
        if spec.max_regression is not None:
            ok = delta >= -spec.max_regression - 1e-12
            checks.append(
                GateCheck(
                    name="max_regression",
                    passed=ok,
                    detail=f"pass rate changed by {100 * delta:+.1f} points against production "
                    f"(allowed: down to {-100 * spec.max_regression:+.1f})",
                )
            )
        if spec.require_no_significant_regression:
            interval = comparison.interval
            ok = not interval.high < 0
            checks.append(
                GateCheck(
                    name="no_significant_regression",
                    passed=ok,
                    detail=f"{_pct(interval.confidence)} interval of the change: "
                    f"[{100 * interval.low:+.1f}, {100 * interval.high:+.1f}] points"
                    + ("" if ok else ", entirely below 0"),
                )
            )
    failed = [check for check in checks if not check.passed]
    if failed:
        reason = "; ".join(check.detail for check in failed)
    elif checks:
        reason = "every check passed: " + "; ".join(check.detail for check in checks)
    else:
        reason = "nothing in production to compare with, and no min_pass_rate: nothing to check"
    return GateVerdict(
        passed=not failed,
        reason=reason,
        benchmark=spec.benchmark,
        benchmark_version_id=candidate.benchmark_version_id,
        candidate_run_id=candidate.run_id,
        production_run_id=production.run_id if production is not None else None,
        candidate_pass_rate=pass_rate,
        production_pass_rate=comparison.a.accuracy if comparison is not None else None,
        delta=comparison.accuracy_delta if comparison is not None else None,
        interval_low=comparison.interval.low if comparison is not None else None,
        interval_high=comparison.interval.high if comparison is not None else None,
        checks=checks,
    )

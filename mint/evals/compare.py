"""Comparing two eval runs of one benchmark version, task by task.

Each task shared by both runs falls in one of four groups: `fixed` (failed in A, passed in B),
`broken` (passed in A, failed in B), `still_passing` and `still_failing`. The accuracy
difference B - A comes with a paired bootstrap confidence interval: resample the shared tasks
with replacement, keeping each task's two outcomes together, and take percentiles of the mean
paired difference over the resamples.

The paired difference of a task is +1 (fixed), -1 (broken) or 0, so a resample's mean depends
only on how many fixed and broken tasks it drew, and those counts are multinomial with the
groups' frequencies. Drawing the counts directly (a binomial for "changed", then a binomial
for "fixed among changed", each by inversion of its exact distribution) gives exactly the
distribution of resampling task indices, at O(1) per resample instead of O(tasks): 10,000
resamples of a 50,000-task benchmark stay cheap in pure Python. `tests/evals/test_compare.py`
checks it against index resampling.

Runs on different benchmark versions are not comparable (their tasks or graders differ):
`compare_runs` refuses them.
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from mint.errors import InvalidRequest

DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95
DEFAULT_SEED = 0
EFFICIENCY_FIELDS = ("steps", "tokens_in", "tokens_out", "latency_ms")


@dataclass(frozen=True)
class TaskOutcome:
    """One task's result in one run."""

    task_id: str
    passed: bool
    score: float = 0.0
    steps: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    latency_ms: float = 0.0


@dataclass(frozen=True)
class RunOutcomes:
    """A run's id, the benchmark version it evaluated, and its tasks' outcomes."""

    run_id: str
    benchmark_version_id: str
    outcomes: Sequence[TaskOutcome]


class RunSide(BaseModel):
    """One run's numbers over the tasks both runs share."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    accuracy: float
    mean_score: float
    mean_steps: float
    mean_tokens_in: float
    mean_tokens_out: float
    mean_latency_ms: float


class Interval(BaseModel):
    """A bootstrap confidence interval of a difference."""

    model_config = ConfigDict(frozen=True)

    low: float
    high: float
    confidence: float
    resamples: int
    seed: int

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


class Comparison(BaseModel):
    """B against A on their shared tasks: per-task groups, accuracy difference with its interval, efficiency."""

    model_config = ConfigDict(frozen=True)

    benchmark_version_id: str
    a: RunSide
    b: RunSide
    tasks: int = Field(description="Tasks both runs have.")
    only_in_a: int = Field(description="Tasks of A that B did not run (another split); not compared.")
    only_in_b: int
    fixed: list[str] = Field(description="Failed in A, passed in B.")
    broken: list[str] = Field(description="Passed in A, failed in B.")
    still_passing: list[str]
    still_failing: list[str]
    accuracy_delta: float = Field(description="B's accuracy minus A's.")
    interval: Interval = Field(description="Paired bootstrap interval of accuracy_delta.")
    significant: bool = Field(description="The interval excludes 0.")
    mean_score_delta: float
    efficiency_delta: dict[str, float] = Field(description="B minus A: mean steps, tokens in/out and latency per task.")


# ---- exact binomial sampling by inversion ----------------------------------------------------


def _binomial_cdf(n: int, p: float) -> tuple[float, ...]:
    """P(X <= k) for k = 0..n, X ~ Binomial(n, p), from the pmf in log space (no overflow)."""
    if p <= 0.0:
        return (1.0,) * (n + 1)
    if p >= 1.0:
        return (0.0,) * n + (1.0,)
    log_p, log_q = math.log(p), math.log1p(-p)
    log_n = math.lgamma(n + 1)
    total, cdf = 0.0, []
    for k in range(n + 1):
        total += math.exp(log_n - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
        cdf.append(total)
    return tuple(value / total for value in cdf)


class _Binomials:
    """Draws from Binomial(n, p) for one p and any n, each n's distribution tabulated once."""

    def __init__(self, p: float) -> None:
        self.p = p
        self._tables: dict[int, tuple[float, ...]] = {}

    def draw(self, rng: random.Random, n: int) -> int:
        if n == 0:
            return 0
        table = self._tables.get(n)
        if table is None:
            table = self._tables[n] = _binomial_cdf(n, self.p)
        return min(bisect.bisect_left(table, rng.random()), n)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def paired_bootstrap(
    fixed: int,
    broken: int,
    unchanged: int,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_SEED,
) -> Interval:
    """Percentile interval of the mean paired pass/fail difference (B - A) over `fixed + broken + unchanged` tasks."""
    n = fixed + broken + unchanged
    if n == 0:
        raise InvalidRequest("no shared tasks to compare", param="b")
    if resamples < 1:
        raise InvalidRequest(f"resamples must be at least 1, got {resamples}", param="resamples")
    if not 0.0 < confidence < 1.0:
        raise InvalidRequest(f"confidence must be between 0 and 1, got {confidence}", param="confidence")
    rng = random.Random(seed)
    changed_draws = _Binomials((fixed + broken) / n)
    fixed_draws = _Binomials(fixed / (fixed + broken) if fixed + broken else 0.0)
    deltas = []
    for _ in range(resamples):
        changed = changed_draws.draw(rng, n)
        drawn_fixed = fixed_draws.draw(rng, changed)
        deltas.append((2 * drawn_fixed - changed) / n)  # (fixed - broken) / n
    deltas.sort()
    tail = (1.0 - confidence) / 2
    return Interval(
        low=_percentile(deltas, tail),
        high=_percentile(deltas, 1.0 - tail),
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )


# ---- comparing -------------------------------------------------------------------------------


def _side(run_id: str, outcomes: Sequence[TaskOutcome]) -> RunSide:
    return RunSide(
        run_id=run_id,
        accuracy=sum(o.passed for o in outcomes) / len(outcomes),
        mean_score=statistics.fmean(o.score for o in outcomes),
        mean_steps=statistics.fmean(o.steps for o in outcomes),
        mean_tokens_in=statistics.fmean(o.tokens_in for o in outcomes),
        mean_tokens_out=statistics.fmean(o.tokens_out for o in outcomes),
        mean_latency_ms=statistics.fmean(o.latency_ms for o in outcomes),
    )


def compare_runs(
    a: RunOutcomes,
    b: RunOutcomes,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_SEED,
) -> Comparison:
    """Compare B with A on the tasks both ran; refuses runs of different benchmark versions."""
    if a.benchmark_version_id != b.benchmark_version_id:
        raise InvalidRequest(
            f"runs {a.run_id} and {b.run_id} evaluated different benchmark versions "
            f"({a.benchmark_version_id} and {b.benchmark_version_id}); a comparison needs the same tasks and "
            "graders: run both models on one version",
            param="b",
        )
    by_task_a = {o.task_id: o for o in a.outcomes}
    by_task_b = {o.task_id: o for o in b.outcomes}
    shared = [task_id for task_id in by_task_a if task_id in by_task_b]
    if not shared:
        raise InvalidRequest(
            f"runs {a.run_id} and {b.run_id} share no task (they ran different splits); compare runs of one split",
            param="b",
        )
    pairs = [(by_task_a[task_id], by_task_b[task_id]) for task_id in shared]
    fixed = [x.task_id for x, y in pairs if not x.passed and y.passed]
    broken = [x.task_id for x, y in pairs if x.passed and not y.passed]
    still_passing = [x.task_id for x, y in pairs if x.passed and y.passed]
    still_failing = [x.task_id for x, y in pairs if not x.passed and not y.passed]
    side_a = _side(a.run_id, [x for x, _ in pairs])
    side_b = _side(b.run_id, [y for _, y in pairs])
    interval = paired_bootstrap(
        len(fixed),
        len(broken),
        len(still_passing) + len(still_failing),
        resamples=resamples,
        confidence=confidence,
        seed=seed,
    )
    return Comparison(
        benchmark_version_id=a.benchmark_version_id,
        a=side_a,
        b=side_b,
        tasks=len(shared),
        only_in_a=len(by_task_a) - len(shared),
        only_in_b=len(by_task_b) - len(shared),
        fixed=fixed,
        broken=broken,
        still_passing=still_passing,
        still_failing=still_failing,
        accuracy_delta=side_b.accuracy - side_a.accuracy,
        interval=interval,
        significant=interval.excludes_zero,
        mean_score_delta=side_b.mean_score - side_a.mean_score,
        efficiency_delta={
            f"mean_{name}": getattr(side_b, f"mean_{name}") - getattr(side_a, f"mean_{name}")
            for name in EFFICIENCY_FIELDS
        },
    )

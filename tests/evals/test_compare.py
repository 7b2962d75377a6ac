"""Per-task comparison of two runs and its paired bootstrap interval."""

from __future__ import annotations

import bisect
import random

import pytest

from mint.errors import InvalidRequest
from mint.evals.compare import RunOutcomes, TaskOutcome, compare_runs, paired_bootstrap

pytestmark = pytest.mark.backend_free

VERSION = "bmv_1"


def run(run_id: str, passed: list[bool], *, version: str = VERSION, steps: int = 1, tokens: int = 10) -> RunOutcomes:
    return RunOutcomes(
        run_id=run_id,
        benchmark_version_id=version,
        outcomes=[
            TaskOutcome(f"t{i}", ok, float(ok), steps=steps, tokens_in=tokens, tokens_out=tokens // 2, latency_ms=5.0)
            for i, ok in enumerate(passed)
        ],
    )


def test_a_clearly_better_run_has_an_interval_above_zero() -> None:
    a = run("a", [False] * 30 + [True] * 10 + [False] * 10, steps=3, tokens=40)
    b = run("b", [True] * 30 + [True] * 10 + [False] * 10, steps=2, tokens=20)
    comparison = compare_runs(a, b)
    assert comparison.tasks == 50 and comparison.only_in_a == comparison.only_in_b == 0
    assert len(comparison.fixed) == 30 and comparison.broken == []
    assert len(comparison.still_passing) == 10 and len(comparison.still_failing) == 10
    assert comparison.a.accuracy == 0.2 and comparison.b.accuracy == 0.8
    assert comparison.accuracy_delta == pytest.approx(0.6)
    assert 0.4 < comparison.interval.low < 0.6 < comparison.interval.high < 0.8
    assert comparison.significant
    assert comparison.interval.resamples == 10_000 and comparison.interval.confidence == 0.95
    assert comparison.efficiency_delta == {
        "mean_steps": -1.0,
        "mean_tokens_in": -20.0,
        "mean_tokens_out": -10.0,
        "mean_latency_ms": 0.0,
    }
    # The same comparison the other way round is the mirror image.
    mirror = compare_runs(b, a)
    assert mirror.fixed == comparison.broken and mirror.broken == comparison.fixed
    assert mirror.interval.high < 0 and mirror.significant


def test_identical_runs_and_balanced_changes_include_zero() -> None:
    same = compare_runs(run("a", [True, False] * 20), run("b", [True, False] * 20))
    assert same.accuracy_delta == 0 and same.interval.low == same.interval.high == 0.0
    assert not same.significant and same.fixed == same.broken == []
    balanced = compare_runs(
        run("a", [True] * 5 + [False] * 5 + [True] * 20), run("b", [False] * 5 + [True] * 5 + [True] * 20)
    )
    assert balanced.accuracy_delta == 0 and balanced.interval.low < 0 < balanced.interval.high
    assert not balanced.significant


def test_runs_on_different_versions_or_splits_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="different benchmark versions") as caught:
        compare_runs(run("a", [True]), run("b", [True], version="bmv_2"))
    assert caught.value.param == "b"
    disjoint = RunOutcomes("b", VERSION, [TaskOutcome("other", True)])
    with pytest.raises(InvalidRequest, match="share no task"):
        compare_runs(run("a", [True]), disjoint)


def test_only_shared_tasks_are_compared() -> None:
    a = run("a", [False, False, True])
    b = RunOutcomes("b", VERSION, [TaskOutcome("t0", True), TaskOutcome("t1", False), TaskOutcome("extra", True)])
    comparison = compare_runs(a, b)
    assert comparison.tasks == 2 and comparison.only_in_a == 1 and comparison.only_in_b == 1
    assert comparison.fixed == ["t0"] and comparison.still_failing == ["t1"]


def test_the_interval_is_seeded() -> None:
    first = paired_bootstrap(7, 3, 40, seed=1)
    assert paired_bootstrap(7, 3, 40, seed=1) == first
    assert paired_bootstrap(7, 3, 40, seed=2) != first or first.low == first.high


def test_counts_drawn_directly_match_resampling_task_indices() -> None:
    """The O(1) draw of (fixed, broken) counts per resample has the distribution of resampling
    the tasks themselves: compare the two bootstrap distributions' CDFs at every atom."""
    fixed, broken, unchanged = 6, 3, 31
    n = fixed + broken + unchanged
    differences = [1] * fixed + [-1] * broken + [0] * unchanged
    rng = random.Random(0)
    resamples = 20_000
    by_index = sorted(sum(rng.choice(differences) for _ in range(n)) / n for _ in range(resamples))

    def cdf(values: list[float], x: float) -> float:
        return bisect.bisect_right(values, x + 1e-12) / len(values)

    # The percentiles of paired_bootstrap come from the same sorted draws; read them back
    # through intervals at many confidence levels.
    for confidence in (0.5, 0.8, 0.9, 0.95, 0.99):
        interval = paired_bootstrap(fixed, broken, unchanged, resamples=resamples, confidence=confidence, seed=3)
        tail = (1 - confidence) / 2
        # Each bound sits where the index-resampling CDF crosses the tail, within sampling noise
        # (the distributions are discrete: one atom is 1/n wide).
        assert cdf(by_index, interval.low - 1 / n) <= tail + 0.01
        assert cdf(by_index, interval.low) >= tail - 0.01
        assert cdf(by_index, interval.high - 1 / n) <= 1 - tail + 0.01
        assert cdf(by_index, interval.high) >= 1 - tail - 0.01


def test_large_benchmarks_stay_cheap() -> None:
    interval = paired_bootstrap(1_200, 800, 8_000, seed=0)
    assert 0.03 < interval.low < 0.04 < interval.high < 0.05


def test_bad_arguments() -> None:
    with pytest.raises(InvalidRequest, match="no shared tasks"):
        paired_bootstrap(0, 0, 0)
    with pytest.raises(InvalidRequest, match="resamples"):
        paired_bootstrap(1, 0, 0, resamples=0)
    with pytest.raises(InvalidRequest, match="confidence"):
        paired_bootstrap(1, 0, 0, confidence=1.0)

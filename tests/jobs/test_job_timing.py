"""Time you can see: a job's elapsed time and time left (`mint.services.jobs.views.job_timing`),
from its estimate until a step finished and from its own measured steps after, and how the
CLI words them and an estimate's range (`mint.cli.jobs`)."""

from __future__ import annotations

from typing import Any

import pytest

from mint.cli.jobs import duration, estimate_row, row_of, time_range
from mint.schemas.fine_tuning import FineTuningJob, JobEstimate
from mint.services.billing.prices import BASIS_MEASURED, BASIS_UNCALIBRATED, basis_of, spread
from mint.services.jobs.views import job_timing

pytestmark = pytest.mark.backend_free

START = 1_000_000.0


def _timing(**given: Any) -> Any:
    fields: dict[str, Any] = {
        "status": "running",
        "now": START + 100,
        "started_at": START,
        "finished_at": None,
        "completed_steps": 0,
        "total_steps": 10,
        "base_load_s": 0.0,
        "estimate_s": 40.0,
        "estimate_basis": BASIS_UNCALIBRATED,
    }
    return job_timing(**(fields | given))


def test_a_queued_job_has_no_time_yet() -> None:
    timing = _timing(status="queued", started_at=None)
    assert (timing.elapsed_s, timing.eta_s, timing.finish_at, timing.eta_basis) == (None, None, None, None)


def test_before_its_first_step_a_job_counts_down_its_estimate() -> None:
    timing = _timing(now=START + 25, base_load_s=10)  # 15 s trained of an estimate of 40
    assert timing.elapsed_s == 25 and timing.eta_s == 25 and timing.finish_at == START + 50
    assert timing.eta_basis == BASIS_UNCALIBRATED


def test_past_its_estimate_with_no_step_measured_it_does_not_claim_zero_left() -> None:
    timing = _timing(now=START + 300)
    assert timing.elapsed_s == 300 and timing.eta_s is None and timing.finish_at is None


def test_once_steps_finished_the_measured_rate_replaces_the_estimate() -> None:
    # 4 of 10 steps in 100 s, of which 20 s loading the base: 20 s a step, 6 steps left
    timing = _timing(completed_steps=4, base_load_s=20)
    assert timing.eta_s == pytest.approx(120) and timing.finish_at == pytest.approx(START + 220)
    assert timing.eta_basis == BASIS_MEASURED
    # the estimate plays no part any more, even a wildly wrong one
    assert _timing(completed_steps=4, base_load_s=20, estimate_s=1.0).eta_s == pytest.approx(120)
    # all steps done: saving its result
    assert _timing(completed_steps=10).eta_s == 0


def test_a_finished_job_shows_how_long_it_ran_and_nothing_left() -> None:
    timing = _timing(status="succeeded", now=START + 5000, finished_at=START + 1620, completed_steps=10)
    assert timing.elapsed_s == 1620 and timing.eta_s is None and timing.finish_at is None


def test_a_calibrated_range_covers_every_job_and_is_never_narrower_than_the_minimum() -> None:
    assert spread([1.0]) == (0.8, 1.25)
    assert spread([0.5, 1.1, 3.0]) == (0.5, 3.0)
    assert spread([1.0], floor=2.0) == (0.5, 2.0)  # little evidence: a wider floor
    assert basis_of(0) == BASIS_UNCALIBRATED
    assert basis_of(3) == "calibrated on 3 finished jobs of this base and method"


def test_durations_in_words() -> None:
    assert [duration(s) for s in (0, 20.4, 250, 3725, 90000)] == ["0s", "20s", "4m 10s", "1h 2m", "1d 1h"]
    assert [duration(s, coarse=True) for s in (20.4, 250, 3725)] == ["20s", "4m", "1h 2m"]
    assert time_range(20, 10, 400) == "about 20s (10s to 7m)"
    assert time_range(20, None, None) == "about 20s"


def _job(**given: Any) -> FineTuningJob:
    body: dict[str, Any] = {
        "id": "ftjob_1",
        "created_at": 1_700_000_000,
        "finished_at": None,
        "started_at": 1_700_000_010,
        "model": "smollm2-135m-instruct",
        "fine_tuned_model": None,
        "organization_id": "org_1",
        "status": "running",
        "training_file": "ds_1",
        "validation_file": None,
        "hyperparameters": {},
        "method": {"type": "supervised"},
        "seed": 0,
        "suffix": None,
        "trained_tokens": None,
        "error": None,
        "lora": {},
        "total_steps": 24,
        "completed_steps": 6,
        "attempts": 1,
        "steps_redone": 0,
        "adapter_version_id": None,
        "elapsed_s": 250.0,
        "eta_s": 720.0,
        "eta_basis": BASIS_MEASURED,
    }
    return FineTuningJob.model_validate(body | given)


def test_jobs_get_shows_elapsed_and_time_left_in_words() -> None:
    row = row_of(_job())
    assert row["elapsed"] == "4m 10s" and row["eta"] == "about 12m left (measured)"
    early = row_of(_job(completed_steps=0, eta_s=15.0, eta_basis=BASIS_UNCALIBRATED))
    assert early["eta"] == "about 15s left (estimated)"
    assert row_of(_job(completed_steps=0, eta_s=None, eta_basis=None))["eta"].startswith("over its estimate")
    done = row_of(_job(status="succeeded", completed_steps=24, elapsed_s=1620.0, eta_s=None))
    assert done["elapsed"] == "27m 0s" and done["eta"] is None


def test_an_estimate_prints_its_range_and_basis() -> None:
    priced = JobEstimate(
        model="smollm2-135m-instruct",
        trained_tokens=1700,
        sampled_tokens=0,
        steps=24,
        seconds=20.0,
        cost_usd=0.00068,
        calibrated_on=0,
        seconds_low=10.0,
        seconds_high=4000.0,
        cost_usd_low=0.00034,
        cost_usd_high=0.00136,
        basis=BASIS_UNCALIBRATED,
        prices={"trained": 0.4, "sampled": 0.2, "served": 0.2, "gpu_hour": 2.5},
        allowed_usd=None,
        limited_by=None,
    )
    row = estimate_row(priced)
    keys = list(row)
    assert keys.index("time") == keys.index("seconds") + 1
    assert row["time"] == "about 20s (10s to 1h 7m)"
    assert keys[keys.index("cost_usd") + 1 : keys.index("cost_usd") + 3] == ["cost_usd_low", "cost_usd_high"]
    assert row["cost_usd_high"] == 0.00136 and row["basis"] == BASIS_UNCALIBRATED
    assert row["trained_usd_per_million"] == 0.4


def test_the_demo_prints_a_plain_progress_line() -> None:
    from mint.cli.demo import progress_line

    body = {"status": "running", "total_steps": 24, "elapsed_s": 250.0, "eta_s": 750.0, "eta_basis": BASIS_MEASURED}
    line = progress_line("fine-tune (SFT, LoRA)", body, 6, 24, 1.23456, 300.0)
    assert (
        line == "fine-tune (SFT, LoRA): running, step 6/24, loss 1.235, 4m 10s elapsed, about 12m 30s left (measured)"
    )
    queued = progress_line("eval m on heldout", {"status": "queued"}, 0, None, None, 31.0)
    assert queued == "eval m on heldout: queued, done 0/?, 31s elapsed"

"""A fine-tuning job's `spec` column as a typed record (`mint.schemas.job_spec.JobSpec`): rows of
every age validate, and what is read back and stored again is the JSON that was there, key for
key and in the same order."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mint.schemas.job_spec import PUBLIC_ESTIMATE, JobSpec

pytestmark = pytest.mark.backend_free

PLAN: dict[str, Any] = {
    "method": "sft",
    "batch_size": 4,
    "n_epochs": 2.0,
    "learning_rate_multiplier": 1.0,
    "learning_rate": 0.0004,
    "steps": 6,
    "checkpoint_interval": 1,
}
ESTIMATE: dict[str, Any] = {
    "trained_tokens": 1200,
    "sampled_tokens": 0,
    "steps": 12,
    "seconds": 15.2,
    "cost_usd": 0.00048,
    "calibrated_on": 0,
    "raw_trained_tokens": 1187.5,
    "raw_sampled_tokens": 0.0,
    "prices": {"trained": 0.4, "sampled": 0.2, "served": 0.2, "gpu_hour": 2.5},
}
# A chained, warm-started job as `create_job` writes it, and as the worker leaves it.
CHAINED: dict[str, Any] = {
    "request": {"model": "base", "training_file": "file_a", "budget_usd": 1.5, "stages": [{}]},
    "request_sha256": "ab" * 32,
    "plan": PLAN,
    "training_type": "lora",
    "lora": {"rank": 8, "alpha": 16.0, "seed": 7},
    "adapter_name": "ft-abc",
    "metadata": {"team": "search"},
    "from_adapter": {"ref": "warm@2", "adapter_version_id": "adv_1"},
    "stages": [
        {"plan": PLAN, "training_file": "file_a", "validation_file": None},
        {"plan": {**PLAN, "method": "dpo", "beta": 0.1}, "training_file": "file_b", "validation_file": "file_c"},
    ],
    "estimate": ESTIMATE,
    "base_load_seconds": 2.125,
}
# A row from before estimates, warm starts, stages and full-parameter jobs: its plan does not
# name its method either.
OLD: dict[str, Any] = {
    "request": {"model": "base", "training_file": "file_a"},
    "request_sha256": "cd" * 32,
    "plan": {key: value for key, value in PLAN.items() if key != "method"},
    "lora": {"rank": 8},
    "adapter_name": "ft-old",
    "metadata": {},
}


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value)  # key order included


@pytest.mark.parametrize("stored", [CHAINED, OLD, {}], ids=["chained", "old", "empty"])
def test_a_stored_spec_is_stored_again_as_it_was(stored: dict[str, Any]) -> None:
    assert _json(JobSpec.model_validate(stored).stored()) == _json(stored)


def test_an_old_row_reads_with_the_defaults_its_readers_assumed() -> None:
    spec = JobSpec.model_validate(OLD)
    assert spec.training_type == "lora" and spec.estimate is None and spec.from_adapter is None
    assert not spec.chained and spec.base_load_seconds == 0.0 and spec.budget_usd is None
    assert spec.plan == OLD["plan"] and spec.adapter_name == "ft-old"


def test_a_chained_spec_reads_as_attributes() -> None:
    spec = JobSpec.model_validate(CHAINED)
    assert (
        spec.chained
        and spec.stages is not None
        and [stage.training_file for stage in spec.stages]
        == [
            "file_a",
            "file_b",
        ]
    )
    assert spec.stages[1].validation_file == "file_c" and spec.stages[1].plan["beta"] == 0.1
    assert spec.from_adapter is not None and spec.from_adapter.ref == "warm@2"
    assert spec.budget_usd == 1.5 and spec.base_load_seconds == 2.125
    # stored before estimates had a range: the range and basis read as null
    assert spec.estimate is not None and spec.estimate.public() == {key: ESTIMATE.get(key) for key in PUBLIC_ESTIMATE}
    assert spec.estimate.public()["basis"] is None


def test_an_estimate_with_its_range_is_stored_and_shown_whole() -> None:
    ranged = {
        **ESTIMATE,
        "seconds_low": 7.6,
        "seconds_high": 304.0,
        "cost_usd_low": 0.00024,
        "cost_usd_high": 0.00096,
        "basis": "uncalibrated: the platform's defaults",
    }
    stored = {**CHAINED, "estimate": ranged}
    spec = JobSpec.model_validate(stored)
    assert _json(spec.stored()) == _json(stored)
    assert spec.estimate is not None and spec.estimate.public() == {key: ranged[key] for key in PUBLIC_ESTIMATE}


def test_keys_it_does_not_know_are_kept() -> None:
    stored = {**OLD, "written_by_a_newer_version": {"x": 1}}
    spec = JobSpec.model_validate(stored)
    spec.base_load_seconds = 1.5
    assert spec.stored() == {**stored, "base_load_seconds": 1.5}

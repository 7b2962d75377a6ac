"""Full-parameter fine-tuning jobs (`training_type: "full"`): every weight of a private copy of the
base trains; the version is the whole model; the job is billed by the seconds it holds its
device; a worker killed mid-job is resumed from the job's checkpoint (weights, Adam moments and
step) with no step lost or doubled; a later job continues training the whole-model version."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from mint.config import Settings
from mint.services.billing.prices import DEFAULT_PRICES
from mint.services.models import adapters
from mint.storage.db import session_scope
from mint.storage.objects import object_store_for
from mint.storage.tables import AdapterVersion, UsageRecord
from tests.conftest import Tenant, Workers, wait_for
from tests.jobs.conftest import BASE, chat_rows, preference_rows, upload
from tests.jobs.resumes import adapter_weights, assert_same_adapter, event_messages, job_of, succeeded

pytestmark = pytest.mark.torch

FULL_SFT = {
    "model": BASE,
    "training_type": "full",
    "seed": 3,
    "steps": 10,
    "checkpoint_interval": 4,
    "learning_rate": 1e-3,
    "method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 4}}},
}


def _create(client: TestClient, tenant: Tenant, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.long_run
def test_a_full_parameter_job_trains_the_whole_model_bills_device_time_and_resumes_after_a_kill(
    client: TestClient, tenant: Tenant, workers: Workers, prepared: Settings
) -> None:
    file = upload(client, tenant, chat_rows(12))
    body = {**FULL_SFT, "training_file": file["id"]}
    victim = workers.start("victim")
    workers.beat()
    resumed = _create(client, tenant, {**body, "suffix": "full-resumed"})
    assert resumed["training_type"] == "full" and resumed["lora"] == {}
    wait_for(lambda: job_of(client, tenant, resumed["id"])["completed_steps"] >= 5, "five steps before the kill")
    victim.kill()
    victim.wait()
    at_kill = job_of(client, tenant, resumed["id"])
    assert at_kill["status"] == "running" and at_kill["completed_steps"] < 10

    workers.start("rescuer")
    job = succeeded(client, tenant, resumed["id"])
    assert job["attempts"] == 2 and job["completed_steps"] == 10
    assert any(
        f"Resuming from checkpoint at step {4 * (at_kill['completed_steps'] // 4)}" in m
        for m in event_messages(client, tenant, job["id"])
    )

    control = succeeded(client, tenant, _create(client, tenant, {**body, "suffix": "full-uninterrupted"})["id"])
    assert control["attempts"] == 1
    resumed_weights, control_weights = adapter_weights(client, tenant, job), adapter_weights(client, tenant, control)
    assert_same_adapter(resumed_weights, control_weights)

    # The version is the whole model: config, safetensors and tokenizer; every weight moved.
    with session_scope(prepared.database) as session:
        version = session.get(AdapterVersion, control["adapter_version_id"])
        assert version is not None
        assert (version.kind, version.rank, version.alpha) == ("full", 0, 0.0)
        archive = object_store_for(prepared).get_bytes(version.object_key)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = set(tar.getnames())
    assert {"config.json", "model.safetensors"} <= names and "adapter_config.json" not in names
    assert any(name.startswith("tokenizer") for name in names)
    metrics = [
        e
        for e in client.get(f"/v1/fine_tuning/jobs/{control['id']}/events?limit=100", headers=tenant.headers()).json()[
            "data"
        ]
        if e["type"] == "metrics"
    ]
    losses = [e["data"]["loss"] for e in sorted(metrics, key=lambda e: e["data"]["step"])]
    assert min(losses[-3:]) < losses[0], losses

    # Billed by device time at the GPU-hour price, not by tokens.
    with session_scope(prepared.database) as session:
        records = session.execute(select(UsageRecord).where(UsageRecord.resource_id == control["id"])).scalars().all()
        assert records and {r.kind for r in records} == {"device_seconds"}
        seconds = sum(r.tokens for r in records)
        assert sum(r.cost_usd for r in records) == pytest.approx(seconds * DEFAULT_PRICES.gpu_hour / 3600)
    assert control["cost_usd"] == pytest.approx(seconds * DEFAULT_PRICES.gpu_hour / 3600, abs=1e-6)
    assert control["estimate"]["cost_usd"] == pytest.approx(  # seconds shown to a tenth
        control["estimate"]["seconds"] * DEFAULT_PRICES.gpu_hour / 3600, abs=4e-5
    )

    # A later full-parameter job continues from the whole-model version.
    warm = _create(
        client,
        tenant,
        {**body, "steps": 2, "suffix": "full-uninterrupted", "from_adapter": control["fine_tuned_model"]},
    )
    warmed = succeeded(client, tenant, warm["id"])
    assert warmed["fine_tuned_model"] == "full-uninterrupted@2"
    with session_scope(prepared.database) as session:
        child = session.get(AdapterVersion, warmed["adapter_version_id"])
        assert child is not None and child.kind == "full"
        assert child.parent_version_id == control["adapter_version_id"]
    continued = adapter_weights(client, tenant, warmed)
    moved = [name for name in continued if not continued[name].equal(control_weights[name])]
    assert moved, "the continued job changed no weight of the version it started from"


def test_a_full_parameter_request_the_trainer_cannot_run_is_refused_at_create(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    chat = upload(client, tenant, chat_rows(8))
    pairs = upload(client, tenant, preference_rows(8))

    def refused(body: dict[str, Any]) -> dict[str, Any]:
        response = client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body)
        assert response.status_code == 400, response.text
        return response.json()["error"]

    dpo = refused({**FULL_SFT, "training_file": pairs["id"], "method": {"type": "dpo"}})
    assert dpo["param"] == "method" and "supervised stages only" in dpo["message"] and "'lora'" in dpo["message"]
    with_lora = refused({**FULL_SFT, "training_file": chat["id"], "lora": {"rank": 8}})
    assert with_lora["param"] == "lora" and "omit `lora`" in with_lora["message"]

    with session_scope(prepared.database) as session:
        lora_version = adapters.register_version(
            session,
            object_store_for(prepared),
            organization_id=tenant.organization_id,
            name="a-lora",
            base_model=BASE,
            archive=b"not read at create",
            lora={"rank": 4, "alpha": 8},
        )
        ref = f"a-lora@{lora_version.version}"
    warm = refused({**FULL_SFT, "training_file": chat["id"], "from_adapter": ref})
    assert warm["param"] == "from_adapter" and "LoRA adapter" in warm["message"]

    # An estimate of a full-parameter job is its expected seconds at the GPU-hour price.
    estimate = client.post(
        "/v1/fine_tuning/jobs/estimate",
        headers=tenant.headers("developer"),
        json={**FULL_SFT, "training_file": chat["id"]},
    ).json()
    # (seconds are shown to a tenth)
    assert estimate["cost_usd"] == pytest.approx(estimate["seconds"] * DEFAULT_PRICES.gpu_hour / 3600, abs=4e-5)

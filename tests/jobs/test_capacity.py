"""Work that finds no capacity waits instead of failing.

A worker's base holds a fixed number of LoRA sessions for every organization together
(`MINT_WORKER_MAX_SESSIONS`, 1 here). When another organization's Tinker model holds the only
one, a fine-tuning job (and an eval run of an adapter on the worker's sampler) is handed back
to the queue, its attempt not counted, with a visible reason; the reconciler leaves the delayed
message alone; and the work runs as soon as the slot frees."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from mint.config import Settings
from mint.storage.tables import TrainingJob
from tests.conftest import Tenant, Workers, reconcile_after, wait_for
from tests.evals.test_evals_api import numeric_benchmark
from tests.jobs.conftest import BASE, chat_rows, upload

pytestmark = pytest.mark.torch

ONE_SLOT = {"MINT_WORKER_MAX_SESSIONS": "1", "MINT_CAPACITY_RETRY_S": "1", "MINT_CAPACITY_RETRY_MAX_S": "2"}


def _tinker(tenant: Tenant) -> dict[str, str]:
    return {"X-API-Key": tenant.keys["developer"]}


def hold_the_slot(client: TestClient, tenant: Tenant) -> str:
    """A Tinker session of `tenant` whose model takes the worker's one LoRA slot; its id."""
    session_id = client.post("/api/v1/create_session", headers=_tinker(tenant), json={"tags": []}).json()["session_id"]
    body = {"session_id": session_id, "model_seq_id": 0, "base_model": BASE, "lora_config": {"rank": 4}}
    created = client.post("/api/v1/create_model", headers=_tinker(tenant), json=body).json()

    def answered() -> dict[str, Any] | None:
        response = client.post(
            "/api/v1/retrieve_future", headers=_tinker(tenant), json={"request_id": created["request_id"]}
        )
        answer = response.json()
        return None if answer.get("type") == "try_again" else answer

    assert wait_for(answered, "the Tinker model to be created") == {
        "model_id": created["model_id"],
        "type": "create_model",
    }
    return str(session_id)


def free_the_slot(client: TestClient, tenant: Tenant, session_id: str) -> None:
    response = client.post(f"/api/v1/sessions/{session_id}/finish", headers=_tinker(tenant), json={})
    assert response.status_code == 200, response.text


def _events(client: TestClient, tenant: Tenant, job_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=tenant.headers("viewer"))
    return list(reversed(response.json()["data"]))


def test_a_job_and_an_eval_run_meeting_a_full_worker_wait_then_run(
    client: TestClient, tenant: Tenant, other_tenant: Tenant, workers: Workers, prepared: Settings
) -> None:
    workers.start("one-slot", env=ONE_SLOT)
    holder = hold_the_slot(client, other_tenant)

    file = upload(client, tenant, chat_rows(8))
    body = {"model": BASE, "training_file": file["id"], "suffix": "patient", "seed": 3, "steps": 2}
    job_id = client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body).json()["id"]

    def waited_twice() -> list[dict[str, Any]] | None:
        waits = [e for e in _events(client, tenant, job_id) if e["message"].startswith("Waiting for capacity")]
        return waits if len(waits) >= 2 else None

    waits = wait_for(waited_twice, "the job to wait for capacity twice")
    assert "already holds 1 sessions" in waits[0]["message"] and waits[0]["level"] == "warning"
    assert [w["data"]["retry_in_s"] for w in waits[:2]] == [1.0, 2.0]  # the wait grows, up to its cap
    job = client.get(f"/v1/fine_tuning/jobs/{job_id}", headers=tenant.headers("viewer")).json()
    assert job["status"] in ("queued", "running") and job["error"] is None and job["attempts"] <= 1

    # The delayed message is not taken for a lost one: the reconciler re-sends nothing of the job.
    report, sent = reconcile_after(prepared, TrainingJob, {}, grace_s=1.0)
    assert job_id not in report.resent_lost_messages and job_id not in report.gave_up

    free_the_slot(client, other_tenant, holder)

    def finished() -> dict[str, Any] | None:
        job = client.get(f"/v1/fine_tuning/jobs/{job_id}", headers=tenant.headers("viewer")).json()
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    job = wait_for(finished, "the job to run once the slot is free")
    assert job["status"] == "succeeded", job
    assert job["attempts"] == 1  # waiting counted no attempt
    assert any(e["message"].startswith("Training started") for e in _events(client, tenant, job_id))

    # An eval run of the new adapter, on the worker's sampler, waits the same way.
    holder = hold_the_slot(client, other_tenant)
    benchmark = numeric_benchmark(client, tenant)
    run_id = client.post(
        "/v1/evals",
        headers=tenant.headers("developer"),
        json={"benchmark_id": benchmark["id"], "model": job["fine_tuned_model"], "max_tokens": 4},
    ).json()["id"]

    def run() -> dict[str, Any]:
        return dict(client.get(f"/v1/evals/{run_id}", headers=tenant.headers("viewer")).json())

    waiting = wait_for(lambda: run() if run()["metrics"].get("capacity_waits") else None, "the run to wait")
    assert "already holds 1 sessions" in waiting["metrics"]["waiting_for_capacity"]
    assert waiting["status"] in ("queued", "running") and waiting["error"] is None

    free_the_slot(client, other_tenant, holder)
    done = wait_for(lambda: run() if run()["status"] in ("succeeded", "failed", "cancelled") else None, "the run")
    assert done["status"] == "succeeded" and done["tasks_done"] == 2, done

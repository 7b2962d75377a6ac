"""Fine-tuning jobs run by real worker processes (`mint worker --base tiny-glm-moe`): SFT, DPO
and RL succeed and register adapter versions; events carry metrics; checkpoints are saved;
usage counts trained tokens; a running job stops within one step of a cancel."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from mint.config import Settings
from mint.storage.db import session_scope
from mint.storage.tables import UsageRecord
from tests.conftest import Tenant, Workers, wait_for
from tests.jobs.conftest import BASE, chat_rows, preference_rows, prompt_rows, upload

pytestmark = pytest.mark.torch


def _job(client: TestClient, tenant: Tenant, job_id: str) -> dict[str, Any]:
    return client.get(f"/v1/fine_tuning/jobs/{job_id}", headers=tenant.headers("viewer")).json()


def _finished(client: TestClient, tenant: Tenant, job_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        job = _job(client, tenant, job_id)
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_for(done, f"job {job_id} to finish")


def _events(client: TestClient, tenant: Tenant, job_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=tenant.headers("viewer"))
    return list(reversed(response.json()["data"]))


def test_sft_job_trains_checkpoints_and_registers_a_version(
    client: TestClient, tenant: Tenant, workers: Workers, prepared: Settings
) -> None:
    workers.start("sft")
    file = upload(client, tenant, chat_rows(12))
    body = {
        "model": BASE,
        "training_file": file["id"],
        "suffix": "ok-bot",
        "seed": 11,
        "steps": 8,
        "checkpoint_interval": 3,
        "learning_rate": 1e-2,
        "method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 4}}},
    }
    created = client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body).json()
    job = _finished(client, tenant, created["id"])
    assert job["status"] == "succeeded", job
    assert job["fine_tuned_model"] == "ok-bot@1" and job["completed_steps"] == 8 and job["attempts"] == 1
    assert job["trained_tokens"] > 0 and job["started_at"] <= job["finished_at"]

    metrics = [e for e in _events(client, tenant, job["id"]) if e["type"] == "metrics"]
    assert [e["data"]["step"] for e in metrics] == list(range(1, 9))
    losses = [e["data"]["loss"] for e in metrics]
    assert min(losses[-3:]) < losses[0], losses
    assert all({"learning_rate", "tokens_per_second", "grad_norm"} <= e["data"].keys() for e in metrics)

    checkpoints = client.get(f"/v1/fine_tuning/jobs/{job['id']}/checkpoints", headers=tenant.headers()).json()
    assert [c["step_number"] for c in checkpoints["data"]] == [6, 3]

    adapters = client.get("/v1/adapters", headers=tenant.headers()).json()["data"]
    adapter = next(a for a in adapters if a["name"] == "ok-bot")
    versions = client.get(f"/v1/adapters/{adapter['id']}/versions", headers=tenant.headers()).json()
    assert [v["model"] for v in versions] == ["ok-bot@1"]
    version = versions[0]
    assert version["training_job_id"] == job["id"] and version["metrics"]["optimizer_steps"] == 8
    assert version["rank"] > 0 and version["alpha"] > 0  # the registry's LoRA defaults, resolved
    download = client.get(f"/v1/adapters/{adapter['id']}/versions/1/download", headers=tenant.headers())
    assert hashlib.sha256(download.content).hexdigest() == version["sha256"] == download.headers["x-mint-sha256"]
    with tarfile.open(fileobj=io.BytesIO(download.content)) as archive:
        assert sorted(archive.getnames()) == ["adapter_config.json", "adapter_model.safetensors"]

    with session_scope(prepared.database) as session:
        query = select(UsageRecord).where(UsageRecord.resource_id == job["id"]).order_by(UsageRecord.created_at)
        usage = session.execute(query).scalars().all()
    # Billed at each checkpoint and at the end, the last record naming the version.
    assert {u.kind for u in usage} == {"trained"} and sum(u.tokens for u in usage) == job["trained_tokens"]
    assert [u.model_ref for u in usage] == ["ok-bot"] * (len(usage) - 1) + ["ok-bot@1"]
    assert job["cost_usd"] == pytest.approx(sum(u.cost_usd for u in usage), abs=1e-6) and job["cost_usd"] > 0
    from tests.test_cli import mint

    summary = json.loads(mint("admin", "usage", "--org", tenant.name, "--json").stdout)
    (line,) = summary
    assert line == {**line, "kind": "trained", "base_model": BASE, "tokens": job["trained_tokens"]}
    assert line["records"] == len(usage) and line["cost_usd"] == pytest.approx(job["cost_usd"], abs=1e-6)


@pytest.mark.long_run
def test_dpo_and_rl_jobs_succeed(client: TestClient, tenant: Tenant, workers: Workers) -> None:
    workers.start("dpo-rl")
    prefs = upload(client, tenant, preference_rows(6))
    prompts = upload(client, tenant, prompt_rows(4))
    dpo = client.post(
        "/v1/fine_tuning/jobs",
        headers=tenant.headers("developer"),
        json={"model": BASE, "training_file": prefs["id"], "steps": 3, "method": {"type": "dpo"}},
    ).json()
    rl = client.post(
        "/v1/fine_tuning/jobs",
        headers=tenant.headers("developer"),
        json={
            "model": BASE,
            "training_file": prompts["id"],
            "steps": 2,
            "method": {
                "type": "reinforcement",
                "reinforcement": {
                    "grader": {"type": "exact"},
                    "hyperparameters": {"batch_size": 2, "group_size": 3, "max_tokens": 4},
                },
            },
        },
    ).json()
    for created, metric in ((dpo, "accuracy"), (rl, "reward")):
        job = _finished(client, tenant, created["id"])
        assert job["status"] == "succeeded", job
        assert job["fine_tuned_model"].endswith("@1")
        steps = [e for e in _events(client, tenant, job["id"]) if e["type"] == "metrics"]
        assert len(steps) == job["total_steps"] and all(metric in e["data"] for e in steps)
    rl_steps = [e["data"] for e in _events(client, tenant, rl["id"]) if e["type"] == "metrics"]
    for data in rl_steps:
        assert {"reward_std", "groups_with_signal", "samples_with_signal", "entropy", "tokens"} <= set(data), data


@pytest.mark.long_run
def test_an_rl_job_without_reward_signal_stops_and_says_what_to_do(
    client: TestClient, tenant: Tenant, workers: Workers
) -> None:
    """The tiny base never writes a prompt's reference exactly: every group's rewards are all 0.
    The job stops after `max_steps_without_signal` such steps instead of succeeding unchanged."""
    workers.start("no-signal")
    prompts = upload(client, tenant, prompt_rows(4))
    created = client.post(
        "/v1/fine_tuning/jobs",
        headers=tenant.headers("developer"),
        json={
            "model": BASE,
            "training_file": prompts["id"],
            "steps": 50,
            "method": {
                "type": "reinforcement",
                "reinforcement": {
                    "grader": {"type": "exact"},
                    "hyperparameters": {
                        "batch_size": 2,
                        "group_size": 2,
                        "max_tokens": 2,
                        "max_steps_without_signal": 2,
                    },
                },
            },
        },
    ).json()
    assert created["method"]["reinforcement"]["hyperparameters"]["max_steps_without_signal"] == 2
    job = _finished(client, tenant, created["id"])
    assert job["status"] == "failed" and job["fine_tuned_model"] is None, job
    assert job["error"]["code"] == "no_reward_signal", job["error"]
    assert job["error"]["message"].startswith("no reward signal for 2 steps in a row"), job["error"]
    steps = [e["data"] for e in _events(client, tenant, job["id"]) if e["type"] == "metrics"]
    assert [data["step"] for data in steps] == [1, 2]
    assert all(data["groups_with_signal"] == 0 and data["reward"] == 0 for data in steps)


@pytest.mark.long_run
def test_an_rl_job_runs_episodes_in_a_python_environment_named_by_the_job(
    client: TestClient, tenant: Tenant, workers: Workers
) -> None:
    """`account_deletion`, registered in Mint's code, named by the job and rewarding on its own
    (no grader): the worker runs each sample as an episode in it and reports turns and tokens.
    The job runs asynchronously (`max_steps_off_policy: 1`)."""
    from mint.evals.agent_environments import account_deletion_rows

    workers.start("agent-rl")
    rows = [{k: v for k, v in row.items() if k != "environment"} for row in account_deletion_rows(4, seed=0)]
    prompts = upload(client, tenant, rows)
    created = client.post(
        "/v1/fine_tuning/jobs",
        headers=tenant.headers("developer"),
        json={
            "model": BASE,
            "training_file": prompts["id"],
            "steps": 2,
            "method": {
                "type": "reinforcement",
                "reinforcement": {
                    "environment": {"name": "account_deletion"},
                    "hyperparameters": {
                        "batch_size": 2,
                        "group_size": 2,
                        "max_tokens": 4,
                        "max_turns": 2,
                        "max_steps_off_policy": 1,
                    },
                },
            },
        },
    ).json()
    assert created["method"]["reinforcement"]["hyperparameters"]["max_steps_off_policy"] == 1
    job = _finished(client, tenant, created["id"])
    assert job["status"] == "succeeded", job
    steps = [e["data"] for e in _events(client, tenant, job["id"]) if e["type"] == "metrics"]
    assert [data["step"] for data in steps] == [1, 2]
    # Step 2 was sampled by a copy of the policy while step 1 trained: at most one update behind.
    assert steps[0]["off_policy_steps"] == 0 and 0 <= steps[1]["off_policy_steps"] <= 1
    for data in steps:
        # The tiny base never calls delete_account: declining earns 1 on unconfirmed rows, 0 on confirmed ones.
        assert data["turns"] >= 1 and data["episode_tokens"] > data["tokens"] > 0, data
        assert 0 <= data["reward"] <= 1, data


def test_cancel_stops_a_running_job_within_one_step(client: TestClient, tenant: Tenant, workers: Workers) -> None:
    workers.start("cancel")
    file = upload(client, tenant, chat_rows(8))
    created = client.post(
        "/v1/fine_tuning/jobs",
        headers=tenant.headers("developer"),
        json={"model": BASE, "training_file": file["id"], "steps": 500, "checkpoint_interval": 1000},
    ).json()
    wait_for(lambda: _job(client, tenant, created["id"])["completed_steps"] >= 2, "two steps")
    requested = client.post(f"/v1/fine_tuning/jobs/{created['id']}/cancel", headers=tenant.headers("developer"))
    assert requested.status_code == 200
    at_request = requested.json()["completed_steps"]
    job = _finished(client, tenant, created["id"])
    assert job["status"] == "cancelled" and job["fine_tuned_model"] is None
    # The step running when the cancel arrived finishes; no further step starts.
    assert at_request <= job["completed_steps"] <= at_request + 1


def test_a_file_the_template_refuses_fails_the_job_naming_the_line(
    client: TestClient, tenant: Tenant, workers: Workers
) -> None:
    workers.start("bad-data")
    rows = chat_rows(3)
    rows[2]["messages"][1]["content"] = "x " * 5000  # longer than the base's context
    file = upload(client, tenant, rows)
    created = client.post(
        "/v1/fine_tuning/jobs",
        headers=tenant.headers("developer"),
        json={"model": BASE, "training_file": file["id"], "steps": 2},
    ).json()
    job = _finished(client, tenant, created["id"])
    assert job["status"] == "failed", job
    assert job["error"]["code"] in ("invalid_training_file", "invalid_request_error")

"""Warm starts and chained stages run by real worker processes on `tiny-glm-moe`: a job
warm-started from a trained version begins where that version ended; a chain of SFT then RL
registers one version per stage, each naming its parent; a failing stage keeps the versions of
the stages before it; a worker killed in stage 2 is resumed in stage 2, never stage 1."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Tenant, Workers, wait_for
from tests.jobs.conftest import BASE, chat_rows, prompt_rows, upload

pytestmark = pytest.mark.torch

SFT = {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 4}}}


def _rl(**hyperparameters: Any) -> dict[str, Any]:
    return {
        "type": "reinforcement",
        "reinforcement": {
            "grader": {"type": "exact"},
            "hyperparameters": {"batch_size": 2, "group_size": 3, "max_tokens": 4, **hyperparameters},
        },
    }


def _create(client: TestClient, tenant: Tenant, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _job(client: TestClient, tenant: Tenant, job_id: str) -> dict[str, Any]:
    return client.get(f"/v1/fine_tuning/jobs/{job_id}", headers=tenant.headers("viewer")).json()


def _finished(client: TestClient, tenant: Tenant, job_id: str) -> dict[str, Any]:
    return wait_for(
        lambda: (job := _job(client, tenant, job_id))["status"] in ("succeeded", "failed", "cancelled") and job,
        f"job {job_id} to finish",
    )


def _events(client: TestClient, tenant: Tenant, job_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=tenant.headers("viewer"))
    return list(reversed(response.json()["data"]))


def _versions(client: TestClient, tenant: Tenant, name: str) -> list[dict[str, Any]]:
    """The adapter's versions, oldest first."""
    adapters = client.get("/v1/adapters?limit=100", headers=tenant.headers()).json()["data"]
    adapter = next(a for a in adapters if a["name"] == name)
    return client.get(f"/v1/adapters/{adapter['id']}/versions", headers=tenant.headers()).json()[::-1]


def _first_loss(client: TestClient, tenant: Tenant, job_id: str) -> float:
    return next(e["data"]["loss"] for e in _events(client, tenant, job_id) if e["type"] == "metrics")


@pytest.mark.long_run
def test_a_warm_start_begins_where_its_parent_ended_and_a_failed_stage_keeps_the_earlier_ones(
    client: TestClient, tenant: Tenant, workers: Workers
) -> None:
    workers.start("warm")
    chat = upload(client, tenant, chat_rows(12))
    common = {"model": BASE, "training_file": chat["id"], "seed": 11, "learning_rate": 1e-2, "method": SFT}
    parent = _finished(client, tenant, _create(client, tenant, {**common, "suffix": "warm-parent", "steps": 8})["id"])
    assert parent["status"] == "succeeded" and parent["fine_tuned_model"] == "warm-parent@1", parent

    # The same job twice, one of them warm-started: the same seed, so the same first batch.
    warm = _create(client, tenant, {**common, "suffix": "warm-child", "steps": 2, "from_adapter": "warm-parent@1"})
    cold = _create(client, tenant, {**common, "suffix": "cold-child", "steps": 2})
    assert warm["from_adapter"] == "warm-parent@1" and cold["from_adapter"] is None
    for created in (warm, cold):
        assert _finished(client, tenant, created["id"])["status"] == "succeeded"
    warm_loss, cold_loss = _first_loss(client, tenant, warm["id"]), _first_loss(client, tenant, cold["id"])
    # The cold start's first loss is the base's (10.87 here); the warm start's is that of its
    # parent's 8 steps of training (4.73): a warm start that loaded nothing would give the same.
    assert warm_loss < 0.7 * cold_loss, (warm_loss, cold_loss)

    (parent_version,) = _versions(client, tenant, "warm-parent")
    (child,) = _versions(client, tenant, "warm-child")
    (cold_version,) = _versions(client, tenant, "cold-child")
    assert child["parent_version_id"] == parent_version["id"] and cold_version["parent_version_id"] is None
    assert (child["rank"], child["alpha"], child["targets"]) == (
        parent_version["rank"],
        parent_version["alpha"],
        parent_version["targets"],
    )
    assert child["metrics"]["method"] == "sft" and child["metrics"]["training_file"] == chat["id"]
    assert child["metrics"]["training_file_sha256"] == chat["sha256"] and child["metrics"]["plan"]["steps"] == 2

    # A chain whose RL stage finds no reward signal fails, and keeps its SFT stage's version.
    prompts = upload(client, tenant, prompt_rows(4))
    doomed = _create(
        client,
        tenant,
        {
            "model": BASE,
            "suffix": "doomed",
            "seed": 3,
            "stages": [
                {"method": SFT, "training_file": chat["id"], "steps": 2},
                {"method": _rl(max_steps_without_signal=1), "training_file": prompts["id"], "steps": 5},
            ],
        },
    )
    job = _finished(client, tenant, doomed["id"])
    assert job["status"] == "failed" and job["error"]["code"] == "no_reward_signal", job
    assert job["fine_tuned_model"] is None and job["completed_steps"] == 3
    assert [(s["status"], s["fine_tuned_model"]) for s in job["stages"]] == [
        ("succeeded", "doomed@1"),
        ("failed", None),
    ]
    assert [v["model"] for v in _versions(client, tenant, "doomed")] == ["doomed@1"]


@pytest.mark.long_run
def test_an_sft_then_rl_chain_registers_a_version_per_stage_and_resumes_in_the_stage_it_was_killed_in(
    client: TestClient, tenant: Tenant, workers: Workers
) -> None:
    chat = upload(client, tenant, chat_rows(12))
    prompts = upload(client, tenant, prompt_rows(4))
    victim = workers.start("chain-victim")
    workers.beat()
    created = _create(
        client,
        tenant,
        {
            "model": BASE,
            "suffix": "sft-then-rl",
            "seed": 5,
            "stages": [
                {
                    "method": SFT,
                    "training_file": chat["id"],
                    "steps": 4,
                    "learning_rate": 1e-2,
                    "checkpoint_interval": 2,
                },
                {
                    # Patience past the stage's length: the tiny base rarely earns a reward here.
                    "method": _rl(max_steps_without_signal=100),
                    "training_file": prompts["id"],
                    "steps": 20,
                    "checkpoint_interval": 4,
                },
            ],
        },
    )
    assert created["total_steps"] == 24
    wait_for(lambda: _job(client, tenant, created["id"])["completed_steps"] >= 10, "six steps into stage 2")
    victim.kill()
    victim.wait()
    at_kill = _job(client, tenant, created["id"])
    assert at_kill["status"] == "running" and 10 <= at_kill["completed_steps"] < 24, at_kill
    assert [s["status"] for s in at_kill["stages"]] == ["succeeded", "running"]

    workers.start("chain-rescuer")
    job = _finished(client, tenant, created["id"])
    assert job["status"] == "succeeded" and job["attempts"] == 2 and job["completed_steps"] == 24, job
    resumed_at = 4 + (at_kill["completed_steps"] - 4) // 4 * 4  # the newest stage-2 checkpoint
    assert job["steps_redone"] == at_kill["completed_steps"] - resumed_at, (job, at_kill)

    first, second = _versions(client, tenant, "sft-then-rl")
    assert (first["model"], second["model"], job["fine_tuned_model"]) == (
        "sft-then-rl@1",
        "sft-then-rl@2",
        "sft-then-rl@2",
    )
    assert first["parent_version_id"] is None and second["parent_version_id"] == first["id"]
    assert (first["metrics"]["stage"], first["metrics"]["method"]) == (1, "sft")
    assert (second["metrics"]["stage"], second["metrics"]["method"]) == (2, "rl")
    assert [(s["status"], s["fine_tuned_model"], s["completed_steps"]) for s in job["stages"]] == [
        ("succeeded", "sft-then-rl@1", 4),
        ("succeeded", "sft-then-rl@2", 20),
    ]

    events = _events(client, tenant, job["id"])
    messages = [e["message"] for e in events]
    assert sum(m.startswith("Stage 1/2 succeeded: sft-then-rl@1") for m in messages) == 1  # stage 1 ran once
    assert f"Resuming from checkpoint at step {resumed_at} (stage 2/2)" in " ".join(messages), messages
    assert any(m.startswith("Stage 2/2 (rl, 20 steps) starts from sft-then-rl@1") for m in messages), messages
    metrics = [e["data"] for e in events if e["type"] == "metrics"]
    stage_one = [(d["stage"], d["stage_step"], d["step"]) for d in metrics if d["stage"] == 1]
    assert stage_one == [(1, n, n) for n in range(1, 5)]
    stage_two = [d for d in metrics if d["stage"] == 2]
    assert {d["step"] for d in stage_two} == set(range(5, 25))
    assert all(d["step"] == 4 + d["stage_step"] and "reward" in d for d in stage_two)
    checkpoints = client.get(f"/v1/fine_tuning/jobs/{job['id']}/checkpoints", headers=tenant.headers()).json()["data"]
    assert sorted((c["step_number"], c["metrics"]["stage"]) for c in checkpoints) == [
        (2, 1),
        (8, 2),
        (12, 2),
        (16, 2),
        (20, 2),
    ]


@pytest.mark.long_run
def test_a_versions_lineage_is_replayed_on_another_base_as_one_job_of_its_recipes(
    client: TestClient, tenant: Tenant, workers: Workers
) -> None:
    workers.start("replay")
    chat = upload(client, tenant, chat_rows(8))
    prompts = upload(client, tenant, prompt_rows(4))
    lineage = _create(
        client,
        tenant,
        {
            "model": BASE,
            "suffix": "lineage",
            "seed": 5,
            "lora": {"rank": 4},
            "stages": [
                {"method": SFT, "training_file": chat["id"], "steps": 2, "learning_rate": 2e-3},
                {"method": _rl(max_steps_without_signal=50), "training_file": prompts["id"], "steps": 1},
            ],
        },
    )
    assert _finished(client, tenant, lineage["id"])["status"] == "succeeded"
    adapter_id = _versions(client, tenant, "lineage")[0]["adapter_id"]

    # Onto a base no worker of this suite runs: the job waits, and its request is the recipe.
    replayed = client.post(
        f"/v1/adapters/{adapter_id}/versions/2/replay",
        headers=tenant.headers("developer"),
        json={"model": "tiny-qwen3-moe"},
    )
    assert replayed.status_code == 200, replayed.text
    job = replayed.json()
    assert (job["model"], job["status"], job["metadata"]) == ("tiny-qwen3-moe", "queued", {"replay_of": "lineage@2"})
    assert job["lora"]["rank"] == 4 and job["total_steps"] == 3
    stages = job["stages"]
    assert [(s["method"]["type"], s["training_file"], s["total_steps"]) for s in stages] == [
        ("supervised", chat["id"], 2),
        ("reinforcement", prompts["id"], 1),
    ]
    assert stages[0]["method"]["supervised"]["hyperparameters"]["batch_size"] == 4
    rl = stages[1]["method"]["reinforcement"]
    assert rl["grader"]["type"] == "exact" and rl["hyperparameters"]["group_size"] == 3
    cancelled = client.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel", headers=tenant.headers("developer"))
    assert cancelled.status_code == 200

    same = client.post(
        f"/v1/adapters/{adapter_id}/versions/1/replay", headers=tenant.headers("developer"), json={"model": BASE}
    )
    assert same.status_code == 400 and "already on tiny-glm-moe" in same.text

"""Warm starts (`from_adapter`) and chained `stages` at create, before any worker runs them:
what is refused and why, and what a job records and shows.

Jobs here are on `tiny-qwen3-moe`, whose queue no worker of this suite consumes, so they stay
queued. Adapter versions to start from are registered through the adapters service, with random
content that no worker reads."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from mint.config import Settings
from mint.storage.db import session_scope
from mint.storage.tables import TrainingJob
from tests.conftest import Tenant, register_versions
from tests.jobs.conftest import chat_rows, preference_rows, prompt_rows, upload

IDLE_BASE = "tiny-qwen3-moe"
RL = {"type": "reinforcement", "reinforcement": {"grader": {"type": "exact"}}}


def _create(client: TestClient, tenant: Tenant, body: dict[str, Any]) -> Any:
    return client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body)


def test_warm_start_refusals_say_what_to_fix(
    client: TestClient, tenant: Tenant, other_tenant: Tenant, prepared: Settings
) -> None:
    ours = register_versions(prepared, tenant, "warm-ours", 1, IDLE_BASE)[0]
    elsewhere = register_versions(prepared, tenant, "warm-glm", 1, "tiny-glm-moe")[0]
    theirs = register_versions(prepared, other_tenant, "warm-theirs", 1, IDLE_BASE)[0]
    chat = upload(client, tenant, chat_rows(4))
    body = {"model": IDLE_BASE, "training_file": chat["id"], "steps": 2}
    cases: list[tuple[dict[str, Any], int, str, str]] = [
        ({"from_adapter": "nobody@1"}, 404, "from_adapter", "no adapter named 'nobody'"),
        ({"from_adapter": theirs}, 404, "from_adapter", "no adapter named 'warm-theirs'"),  # another organization's
        ({"from_adapter": IDLE_BASE}, 404, "from_adapter", f"no adapter named '{IDLE_BASE}'"),  # a base, not a version
        ({"from_adapter": "warm-ours@9"}, 404, "from_adapter", "has no ready version 9"),
        ({"from_adapter": elsewhere}, 409, "from_adapter", "was trained on base 'tiny-glm-moe'"),
        ({"from_adapter": ours, "lora": {"rank": 8}}, 400, "lora", "trains that adapter as it is (rank 2"),
        ({"from_adapter": ours, "lora": {"train_mlp": False}}, 400, "lora", "lora.train_mlp"),
    ]
    for extra, status, param, words in cases:
        response = _create(client, tenant, {**body, **extra})
        assert response.status_code == status, (extra, response.text)
        error = response.json()["error"]
        assert error["param"] == param and words in error["message"], (extra, error)
    malformed = _create(client, tenant, {**body, "from_adapter": "warm-ours@latest"})
    assert malformed.status_code == 422 and "from_adapter" in malformed.text
    with session_scope(prepared.database) as session:
        assert session.query(TrainingJob).filter_by(organization_id=tenant.organization_id).count() == 0


def test_a_warm_started_job_takes_the_adapters_lora_and_shows_where_it_started(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    newest = register_versions(prepared, tenant, "warm-src", 2, IDLE_BASE)[-1]
    chat = upload(client, tenant, chat_rows(4))
    body = {"model": IDLE_BASE, "training_file": chat["id"], "steps": 2, "from_adapter": "warm-src"}
    # The same rank and alpha as the adapter's are not a conflict.
    response = _create(client, tenant, {**body, "lora": {"rank": 2, "alpha": 4.0}})
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["from_adapter"] == newest == "warm-src@2"  # `name` alone: its newest version, recorded
    assert job["lora"]["rank"] == 2 and job["lora"]["alpha"] == 4.0 and job["stages"] is None
    with session_scope(prepared.database) as session:
        row = session.get(TrainingJob, job["id"])
        assert row is not None and row.spec["from_adapter"]["ref"] == "warm-src@2"
    events = client.get(f"/v1/fine_tuning/jobs/{job['id']}/events", headers=tenant.headers()).json()["data"]
    assert "Warm start from warm-src@2" in [event["message"] for event in events]


def test_stage_refusals_name_the_stage(client: TestClient, tenant: Tenant) -> None:
    chat = upload(client, tenant, chat_rows(4))
    prompts = upload(client, tenant, prompt_rows(4))
    prefs = upload(client, tenant, preference_rows(4))
    sft = {"method": {"type": "supervised"}}
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"training_file": chat["id"], "method": {"type": "supervised"}, "stages": [sft]}, 400, "either `method`"),
        ({"stages": [sft]}, 400, "stages[0].training_file is required"),
        ({"training_file": chat["id"], "stages": [sft, {"method": RL}]}, 400, "holds chat rows"),
        ({"stages": [{**sft, "training_file": chat["id"]}, {"method": {"type": "reinforcement"}}]}, 400, "grader"),
        ({"stages": [{**sft, "training_file": prefs["id"]}]}, 400, "holds preference rows"),
        ({"training_file": chat["id"], "stages": [sft] * 5}, 422, "stages"),
        ({"training_file": chat["id"], "stages": []}, 422, "stages"),
        (
            {"training_file": chat["id"], "stages": [{**sft, "learning_rate": 2.0}]},
            422,
            "learning_rate",
        ),
        ({"stages": [{"method": RL, "training_file": chat["id"]}]}, 400, "stages[0].training_file"),
        ({"stages": [{"method": RL, "training_file": prompts["id"]}, sft]}, 400, "stages[1].training_file"),
    ]
    for extra, status, words in cases:
        response = _create(client, tenant, {"model": IDLE_BASE, **extra})
        assert response.status_code == status, (extra, response.text)
        assert words in response.text, (extra, response.text)
    # A plan refused for what a stage's values lead to names the stage.
    many = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 10**6, "batch_size": 1}}}
    refused = _create(
        client, tenant, {"model": IDLE_BASE, "training_file": chat["id"], "stages": [sft, {"method": many}]}
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stages[1].steps", refused.text


def test_a_chained_job_records_each_stage_and_counts_all_their_steps(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    chat = upload(client, tenant, chat_rows(6))
    prompts = upload(client, tenant, prompt_rows(4))
    response = _create(
        client,
        tenant,
        {
            "model": IDLE_BASE,
            "training_file": chat["id"],
            "steps": 3,
            "suffix": "chain",
            "stages": [
                {"method": {"type": "supervised"}},
                {"method": RL, "training_file": prompts["id"], "steps": 5, "learning_rate": 1e-5},
            ],
        },
    )
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["total_steps"] == 8 and job["method"]["type"] == "supervised" and job["training_file"] == chat["id"]
    first, second = job["stages"]
    assert (first["stage"], first["status"], first["total_steps"], first["training_file"]) == (
        1,
        "queued",
        3,
        chat["id"],
    )
    assert (second["stage"], second["status"], second["total_steps"]) == (2, "pending", 5)
    assert second["training_file"] == prompts["id"] and second["method"]["type"] == "reinforcement"
    assert second["method"]["reinforcement"]["grader"]["type"] == "exact"
    assert first["fine_tuned_model"] is None and second["adapter_version_id"] is None
    with session_scope(prepared.database) as session:
        row = session.get(TrainingJob, job["id"])
        assert row is not None
        plans = [stage["plan"] for stage in row.spec["stages"]]
    assert [plan["method"] for plan in plans] == ["sft", "rl"]
    assert plans[1]["learning_rate"] == 1e-5 and plans[1]["steps"] == 5
    messages = [
        event["message"]
        for event in client.get(f"/v1/fine_tuning/jobs/{job['id']}/events", headers=tenant.headers()).json()["data"]
    ]
    assert any(m.startswith("Stage 2/2 (rl): validating training file: " + prompts["id"]) for m in messages)
    assert "Files validated; 8 optimizer steps planned" in messages

    cancelled = client.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel", headers=tenant.headers("developer")).json()
    assert [stage["status"] for stage in cancelled["stages"]] == ["cancelled", "skipped"]

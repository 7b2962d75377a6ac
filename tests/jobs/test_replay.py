"""A lineage carried over to a new base: a version trained on `tiny-glm-moe` is replayed on
`tiny-qwen3-moe` (its recipe, on the same training file), the replayed version is evaluated on
the same benchmark version, and the two are compared task by task.

The rest of the suite keeps `tiny-qwen3-moe` idle on purpose (jobs queued on it must stay
queued), so this test runs on an install of its own (`own_install`): its own database, broker
and object store, an API app over them, and real workers of both bases."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import OwnInstall, Tenant, Workers, make_tenant, wait_for
from tests.jobs.conftest import BASE, chat_rows, upload

pytestmark = pytest.mark.torch

NEW_BASE = "tiny-qwen3-moe"


def _finished(client: TestClient, tenant: Tenant, path: str, what: str) -> dict[str, Any]:
    return wait_for(
        lambda: (
            (body := client.get(path, headers=tenant.headers()).json())["status"]
            in ("succeeded", "failed", "cancelled")
            and body
        ),
        what,
    )


def _evaluate(client: TestClient, tenant: Tenant, benchmark_id: str, model: str) -> dict[str, Any]:
    created = client.post(
        "/v1/evals",
        headers=tenant.headers("developer"),
        json={"benchmark_id": benchmark_id, "model": model, "max_tokens": 6, "temperature": 0.0},
    )
    assert created.status_code == 201, created.text
    run = _finished(client, tenant, f"/v1/evals/{created.json()['id']}", f"the eval of {model}")
    assert run["status"] == "succeeded", run
    return run


@pytest.mark.long_run
def test_a_version_replayed_on_a_new_base_is_measured_against_the_old_lineage(
    own_install: OwnInstall, own_client: TestClient, workers: Workers
) -> None:
    client, tenant = own_client, make_tenant(own_install.settings)
    for base in (BASE, NEW_BASE):
        workers.start(f"replay-{base}", env=own_install.env, base=base)
    rows = chat_rows(12)
    chat = upload(client, tenant, rows)
    tasks = "".join(
        json.dumps({"id": f"ping-{i}", "messages": row["messages"][:1], "reference": row["messages"][1]["content"]})
        + "\n"
        for i, row in enumerate(rows[:6])
    )
    benchmark = client.post(
        "/v1/benchmarks",
        headers=tenant.headers("developer"),
        json={"name": "pings", "format": "jsonl", "content": tasks, "grader": {"type": "normalized"}},
    ).json()

    trained = client.post(
        "/v1/fine_tuning/jobs",
        headers=tenant.headers("developer"),
        json={
            "model": BASE,
            "training_file": chat["id"],
            "suffix": "pinger",
            "seed": 3,
            "steps": 4,
            "learning_rate": 1e-2,
            "lora": {"rank": 4},
            "method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 4}}},
        },
    ).json()
    job = _finished(client, tenant, f"/v1/fine_tuning/jobs/{trained['id']}", "the job on the old base")
    assert job["status"] == "succeeded" and job["fine_tuned_model"] == "pinger@1", job
    old = _evaluate(client, tenant, benchmark["id"], "pinger@1")

    adapter_id = next(
        a["id"] for a in client.get("/v1/adapters", headers=tenant.headers()).json()["data"] if a["name"] == "pinger"
    )
    replayed = client.post(
        f"/v1/adapters/{adapter_id}/versions/1/replay", headers=tenant.headers("developer"), json={"model": NEW_BASE}
    )
    assert replayed.status_code == 200, replayed.text
    assert replayed.json()["metadata"] == {"replay_of": "pinger@1"}
    job = _finished(client, tenant, f"/v1/fine_tuning/jobs/{replayed.json()['id']}", "the replay on the new base")
    assert job["status"] == "succeeded", job
    assert job["model"] == NEW_BASE and job["lora"]["rank"] == 4 and job["total_steps"] == 4
    new_ref = job["fine_tuned_model"]

    # The replayed version is a version of the new base, and the ruler is the same version.
    listed = client.get("/v1/adapters?limit=100", headers=tenant.headers()).json()["data"]
    replayed_version = next(
        v
        for a in listed
        for v in client.get(f"/v1/adapters/{a['id']}/versions", headers=tenant.headers()).json()
        if v["model"] == new_ref
    )
    assert replayed_version["base_model"] == NEW_BASE and replayed_version["rank"] == 4
    new = _evaluate(client, tenant, benchmark["id"], new_ref)
    assert (new["base_model"], new["benchmark_version_id"]) == (NEW_BASE, old["benchmark_version_id"])

    comparison = client.get(f"/v1/evals/compare?a={old['id']}&b={new['id']}", headers=tenant.headers())
    assert comparison.status_code == 200, comparison.text
    report = comparison.json()
    assert (report["a"]["run_id"], report["b"]["run_id"], report["tasks"]) == (old["id"], new["id"], 6)
    outcomes = report["fixed"] + report["broken"] + report["still_passing"] + report["still_failing"]
    assert sorted(outcomes) == sorted(f"ping-{i}" for i in range(6))

"""The whole loop, end to end, on the tiny MoE base with real processes and real HTTP calls:
evaluate the base on a benchmark, mine its failures into an SFT dataset, fine-tune, evaluate
the new adapter version on the same benchmark version, and compare task by task.

The tiny base has random weights, so the benchmark asks for something it can learn in a
few dozen steps: answer every request with the word `OK`. The loop, not the model, is under
test here; `make demo` runs the same loop on SmolLM2 with a built-in benchmark.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Tenant, Workers, wait_for
from tests.jobs.conftest import BASE

pytestmark = [pytest.mark.torch, pytest.mark.integration, pytest.mark.client_surface]

REQUESTS = [
    "Confirm the order.",
    "Is the service up?",
    "Acknowledge this.",
    "Can you hear me?",
    "Ready?",
    "Did it arrive?",
    "Reply please.",
    "Status check.",
    "Are we good?",
    "Ping.",
    "Got the file?",
    "Any news?",
    "Check in.",
    "Still there?",
    "Respond now.",
    "All set?",
]


def _finished(client: TestClient, tenant: Tenant, path: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = client.get(path, headers=tenant.headers("viewer")).json()
        return body if body["status"] in ("succeeded", "failed", "cancelled") else None

    result = wait_for(done, path, timeout=600)
    assert result["status"] == "succeeded", result
    return result


def _evaluate(client: TestClient, tenant: Tenant, benchmark_id: str, model: str) -> dict[str, Any]:
    body = {"benchmark_id": benchmark_id, "model": model, "max_tokens": 4}
    run = client.post("/v1/evals", headers=tenant.headers("developer"), json=body)
    assert run.status_code == 201, run.text
    return _finished(client, tenant, f"/v1/evals/{run.json()['id']}")


def test_eval_mine_train_reevaluate_compare_and_deploy_behind_a_gate(
    client: TestClient, tenant: Tenant, workers: Workers
) -> None:
    workers.start("loop")
    tasks = [
        {"id": f"ok-{index:02d}", "messages": [{"role": "user", "content": text}], "reference": "OK"}
        for index, text in enumerate(REQUESTS)
    ]
    benchmark = client.post(
        "/v1/benchmarks",
        headers=tenant.headers("developer"),
        json={
            "name": "acknowledge",
            "format": "jsonl",
            "content": "".join(json.dumps(task) + "\n" for task in tasks),
            "grader": {"type": "normalized"},
        },
    ).json()

    before = _evaluate(client, tenant, benchmark["id"], BASE)
    mined = client.post(
        "/v1/datasets/from-failures",
        headers=tenant.headers("developer"),
        json={"eval_id": before["id"], "kind": "chat"},
    )
    assert mined.status_code == 201, mined.text
    dataset = mined.json()
    assert dataset["kind"] == "chat" and dataset["row_count"] == dataset["failed_tasks"] > 0

    job = client.post(
        "/v1/fine_tuning/jobs",
        headers=tenant.headers("developer"),
        json={
            "model": BASE,
            "training_file": dataset["id"],
            "suffix": "acknowledger",
            "seed": 1,
            "steps": 24,
            "learning_rate": 3e-3,
            "method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 8}}},
        },
    ).json()
    trained = _finished(client, tenant, f"/v1/fine_tuning/jobs/{job['id']}")
    after = _evaluate(client, tenant, benchmark["id"], trained["fine_tuned_model"])
    assert after["benchmark_version_id"] == before["benchmark_version_id"]

    comparison = client.get(
        "/v1/evals/compare", headers=tenant.headers("viewer"), params={"a": before["id"], "b": after["id"]}
    ).json()
    print(
        f"\nbefore ({BASE}): accuracy {comparison['a']['accuracy']:.2f}; "
        f"after ({trained['fine_tuned_model']}): accuracy {comparison['b']['accuracy']:.2f}; "
        f"delta {comparison['accuracy_delta']:+.2f}, 95% CI [{comparison['interval']['low']:+.2f}, "
        f"{comparison['interval']['high']:+.2f}]; fixed {len(comparison['fixed'])}, "
        f"broken {len(comparison['broken'])}, "
        f"still passing {len(comparison['still_passing'])}, still failing {len(comparison['still_failing'])}"
    )
    assert comparison["accuracy_delta"] > 0 and comparison["interval"]["low"] > 0 and comparison["significant"]
    assert len(comparison["fixed"]) > len(comparison["broken"])

    # Deploy behind a gate: the new version passes it; a barely trained version does not.
    gate = {"benchmark": "acknowledge", "min_pass_rate": 0.9}
    deployed = client.post(
        "/v1/deployments",
        headers=tenant.headers("developer"),
        json={"name": "acknowledge-prod", "model": trained["fine_tuned_model"], "gate": gate},
    )
    assert deployed.status_code == 201, deployed.text
    verdict = deployed.json()["serving"]["gate_verdict"]
    assert verdict["passed"] and verdict["candidate_pass_rate"] == comparison["b"]["accuracy"]

    weak_job = client.post(
        "/v1/fine_tuning/jobs",
        headers=tenant.headers("developer"),
        json={
            "model": BASE,
            "training_file": dataset["id"],
            "suffix": "acknowledger",
            "steps": 1,
            "learning_rate": 1e-6,
        },
    ).json()
    weak = _finished(client, tenant, f"/v1/fine_tuning/jobs/{weak_job['id']}")
    assert weak["fine_tuned_model"] == "acknowledger@2"
    _evaluate(client, tenant, benchmark["id"], weak["fine_tuned_model"])
    refused = client.post(
        "/v1/deployments/acknowledge-prod/promote",
        headers=tenant.headers("developer"),
        json={"model": weak["fine_tuned_model"]},
    )
    assert refused.status_code == 409, refused.text
    numbers = refused.json()["error"]["verdict"]
    assert not numbers["passed"] and numbers["delta"] < 0 and numbers["production_pass_rate"] == 1.0
    serving = client.get("/v1/deployments/acknowledge-prod", headers=tenant.headers("viewer")).json()
    assert serving["serving"]["routing"]["model"] == trained["fine_tuned_model"]

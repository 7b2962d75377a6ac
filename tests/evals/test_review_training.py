"""Expert corrections fix what they correct, on the ruler: the tiny base fails a small benchmark
graded by `exact`, an expert corrects each failure through the review API, the corrections are
mined into an SFT dataset, a short job trains on it over REST, and the new adapter version passes
the very tasks it failed on the same benchmark version.

The tiny base has random weights; what it must learn is three short answers, one per question,
which 100 steps of LoRA at 5e-3 memorise (fewer, or a larger rate, leave it answering one of them
to every question). Real processes and real HTTP calls throughout: a
worker evaluates and trains, the API reviews and mines.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Tenant, Workers
from tests.jobs.conftest import BASE
from tests.test_loop import _evaluate, _finished

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.integration]

ANSWERS = {
    "capital": ("What is the capital of France?", "Paris"),
    "sum": ("What is 2 + 3?", "5"),
    "sky": ("What colour is the sky?", "blue"),
}


def _passed(client: TestClient, tenant: Tenant, run: dict[str, Any]) -> tuple[dict[str, bool], dict[str, str]]:
    """Each task's pass, and what the model answered (for the failure message)."""
    rows = client.get(f"/v1/evals/{run['id']}/trajectories", headers=tenant.headers("viewer"), params={"limit": 100})
    assert rows.status_code == 200, rows.text
    data = rows.json()["data"]
    return {row["task_id"]: row["passed"] for row in data}, {row["task_id"]: row.get("output") for row in data}


@pytest.mark.long_run
def test_a_job_trained_on_expert_corrections_fixes_those_tasks_on_the_ruler(
    client: TestClient, tenant: Tenant, workers: Workers
) -> None:
    workers.start("review-training")
    dev = tenant.headers("developer")
    tasks = [
        {"id": task_id, "messages": [{"role": "user", "content": question}], "reference": answer}
        for task_id, (question, answer) in ANSWERS.items()
    ]
    body = {
        "name": "corrected",
        "format": "jsonl",
        "content": "".join(json.dumps(task) + "\n" for task in tasks),
        "grader": {"type": "exact"},
    }
    benchmark = client.post("/v1/benchmarks", headers=dev, json=body).json()
    before = _evaluate(client, tenant, benchmark["id"], BASE)
    passed, answered = _passed(client, tenant, before)
    assert passed == dict.fromkeys(ANSWERS, False), answered

    queue = client.post(
        "/v1/reviews/queues",
        headers=dev,
        json={"name": "fix them", "eval_id": before["id"], "filters": {"failed": True}},
    )
    assert queue.status_code == 201, queue.text
    items = client.get(f"/v1/reviews/queues/{queue.json()['id']}/items", headers=dev).json()["data"]
    assert sorted(item["task_id"] for item in items) == sorted(ANSWERS)
    for item in items:
        fix = {
            "from_message": item["snapshot"]["prompt_length"],
            "messages": [{"role": "assistant", "content": ANSWERS[item["task_id"]][1]}],
        }
        review = client.post(
            f"/v1/reviews/items/{item['id']}/reviews", headers=dev, json={"passed": False, "correction": fix}
        )
        assert review.status_code == 201, review.text
    mined = client.post(f"/v1/reviews/queues/{queue.json()['id']}/dataset", headers=dev, json={"kind": "chat"})
    assert mined.status_code == 201, mined.text
    assert mined.json()["row_count"] == len(ANSWERS)

    job = client.post(
        "/v1/fine_tuning/jobs",
        headers=dev,
        json={
            "model": BASE,
            "training_file": mined.json()["id"],
            "suffix": "corrected",
            "seed": 1,
            "steps": 100,
            "learning_rate": 5e-3,
            "method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 3}}},
        },
    )
    assert job.status_code in (200, 201), job.text
    trained = _finished(client, tenant, f"/v1/fine_tuning/jobs/{job.json()['id']}")
    after = _evaluate(client, tenant, benchmark["id"], trained["fine_tuned_model"])
    assert after["benchmark_version_id"] == before["benchmark_version_id"]
    passed, answered = _passed(client, tenant, after)
    assert passed == dict.fromkeys(ANSWERS, True), answered  # every corrected task fixed

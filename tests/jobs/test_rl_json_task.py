"""A user's JSON task on the REST path, as a new user runs it: an SFT job on a few solutions of
the built-in `triage` task (SmolLM2 answers `{"team": ..., "priority": ...}`), then an RL job
warm-started from that version with a partial-credit `json_match` grader.

The RL job grades each completion's text without the end-of-turn token that stopped it: its
rewards are above 0 from the first step (when the graded text ended with `<|im_end|>`, every
right answer scored 0 and the job stopped with `no_reward_signal`), and each step's event shows
its samples as graded. The held-out pass rate before and after is measured by
`bench/rl_json_task.py`: a few RL steps at this scale do not raise it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mint.evals.builtin import load_builtin
from tests.conftest import Tenant, Workers, wait_for
from tests.jobs.conftest import upload

# A client of the whole loop (SFT, RL, evals through REST): the embedded pass runs it; the grading it
# proves is backend-free, and each backend's jobs and evals run in the other jobs tests.
pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.client_surface]

BASE = "smollm2-135m-instruct"
TRIAGE_GRADER = {"type": "json_match"}


def _finished(client: TestClient, tenant: Tenant, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Create a job or an eval run at `path` and wait until it finishes."""
    created = client.post(path, headers=tenant.headers("developer"), json=body)
    assert created.status_code in (200, 201), created.text
    url = f"{path}/{created.json()['id']}"
    return wait_for(
        lambda: (
            (row := client.get(url, headers=tenant.headers()).json())["status"] in ("succeeded", "failed", "cancelled")
            and row
        ),
        f"{url} to finish",
        timeout=900,
    )


def _job(client: TestClient, tenant: Tenant, body: dict[str, Any]) -> dict[str, Any]:
    return _finished(client, tenant, "/v1/fine_tuning/jobs", body)


def test_rl_warm_started_from_a_json_writing_version_earns_reward_from_the_first_step(
    client: TestClient, tenant: Tenant, workers: Workers
) -> None:
    workers.start("json-task", base=BASE)
    train = load_builtin("triage", "train", 48, seed=0)
    solutions = upload(client, tenant, [{"messages": [*t.messages, *(t.solution or [])]} for t in train[:16]])
    prompts = upload(
        client, tenant, [{"messages": t.messages, "reference": t.reference} for t in train[16:]], name="prompts.jsonl"
    )
    supervised = {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 8}}}
    sft = _job(
        client,
        tenant,
        {"model": BASE, "training_file": solutions["id"], "suffix": "triage", "steps": 8, "learning_rate": 4e-4}
        | {"method": supervised},
    )
    assert sft["status"] == "succeeded", sft

    reinforcement = {
        "type": "reinforcement",
        "reinforcement": {
            "grader": TRIAGE_GRADER,
            "hyperparameters": {"batch_size": 4, "group_size": 4, "max_tokens": 24, "max_steps_without_signal": 3},
        },
    }
    rl = _job(
        client,
        tenant,
        {"model": BASE, "training_file": prompts["id"], "suffix": "triage", "steps": 3, "learning_rate": 1e-4}
        | {"from_adapter": "triage@1", "method": reinforcement},
    )
    assert rl["status"] == "succeeded", rl
    events = client.get(f"/v1/fine_tuning/jobs/{rl['id']}/events?limit=100", headers=tenant.headers()).json()["data"]
    steps = [event["data"] for event in reversed(events) if event["type"] == "metrics"]
    assert len(steps) == 3 and all(step["reward"] > 0 for step in steps), [step["reward"] for step in steps]
    samples = [sample for step in steps for sample in step["samples"]]
    assert samples and all("<|im_end|>" not in sample["text"] for sample in samples)
    # What the grader read is the JSON the model wrote, and its reward is that text's grade: the
    # share of the fields it has right, where a field the reference lacks counts as wrong (an
    # `equal` match), to the 4 places an event shows.
    assert any(sample["reward"] > 0 for sample in samples), samples
    for sample in samples:
        reference = json.loads(sample["reference"])
        answer = json.loads(sample["text"]) if sample["reward"] > 0 else None
        if answer is not None:
            right = sum(answer.get(key) == value for key, value in reference.items())
            fields = len(reference.keys() | answer.keys())
            assert sample["reward"] == pytest.approx(right / fields, abs=1e-4), sample

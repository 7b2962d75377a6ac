"""verl's own gsm8k reward, unmodified, as the grader of an RL job on Mint, on the path a team takes:

1. register a reward endpoint over REST (Mint answers its signing secret, once);
2. serve verl's `verl/utils/reward_score/gsm8k.py:compute_score` behind it with
   `mint reward-server` (its own process; the file is loaded by path, as `import verl` needs Ray);
3. warm-start SmolLM2 by SFT on TRL prompt-completion rows of worked answers (`... #### N`);
4. upload a parquet file of verl's RL rows as verl's gsm8k preprocessing writes them;
5. start an RL job over REST from that version whose grader is
   `{"type": "remote", "config": {"endpoint": ...}}`, run by a real worker.

Every sample the job reports was graded by the reward server, and its reward is what verl's
function gives for that text and that row's `reward_model.ground_truth` when called directly.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Tenant, Workers, wait_for
from tests.integrations.test_reward_server import VERL_GSM8K, RewardServer, free_port, start_server  # noqa: F401
from tests.jobs.conftest import jsonl
from tests.test_dataset_formats import gsm8k_rows, parquet_of

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.client_surface]

BASE = "smollm2-135m-instruct"


def verl_gsm8k() -> Callable[..., float]:
    """verl's gsm8k `compute_score`, loaded by path as the reward server loads it."""
    spec = importlib.util.spec_from_file_location("verl_gsm8k_reward", VERL_GSM8K)
    assert spec is not None and spec.loader is not None, f"{VERL_GSM8K} is missing: run `make install`"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score  # type: ignore[no-any-return]


def solutions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TRL prompt-completion rows of verl's rows and their worked answers (`extra_info.answer`,
    ending `#### N`): the SFT warm start that teaches a 135M model the line verl's strict match reads."""
    return [
        {"prompt": row["prompt"], "completion": [{"role": "assistant", "content": row["extra_info"]["answer"]}]}
        for row in rows
    ]


def finished(client: TestClient, tenant: Tenant, body: dict[str, Any]) -> dict[str, Any]:
    """Start a fine-tuning job over REST and wait until it ends."""
    created = client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body)
    assert created.status_code in (200, 201), created.text
    url = f"/v1/fine_tuning/jobs/{created.json()['id']}"
    return wait_for(  # type: ignore[no-any-return]
        lambda: (row := client.get(url, headers=tenant.headers()).json())["status"] in ("succeeded", "failed") and row,
        f"{url} to finish",
        timeout=900,
    )


def test_verls_gsm8k_reward_served_by_mint_reward_server_grades_an_rl_job(
    client: TestClient,
    tenant: Tenant,
    workers: Workers,
    start_server: Callable[..., RewardServer],  # noqa: F811
) -> None:
    compute_score = verl_gsm8k()
    port = free_port()
    registered = client.post(
        "/v1/reward_endpoints",
        headers=tenant.headers("developer"),
        json={"name": "verl-gsm8k", "url": f"http://127.0.0.1:{port}/", "description": "verl's gsm8k reward"},
    )
    assert registered.status_code == 201, registered.text
    server = start_server(f"{VERL_GSM8K}:compute_score", secret=registered.json()["secret"], port=port)
    assert any("verl style" in line for line in server.output), server.output

    rows = gsm8k_rows(20, split="train")
    workers.start("verl-reward", base=BASE)
    warm = client.post(
        "/v1/datasets",
        headers=tenant.headers("developer"),
        files={"file": ("gsm8k-sft.jsonl", jsonl(solutions(rows[4:])), "application/jsonl")},
    )
    assert warm.status_code == 201, warm.text
    assert warm.json()["validation_report"]["source_format"] == "trl"
    sft = finished(
        client,
        tenant,
        {"model": BASE, "training_file": warm.json()["id"], "suffix": "gsm8k", "steps": 8, "learning_rate": 1e-3}
        | {"method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 8}}}},
    )
    assert sft["status"] == "succeeded", sft

    uploaded = client.post(
        "/v1/datasets",
        headers=tenant.headers("developer"),
        files={"file": ("gsm8k-train.parquet", parquet_of(rows[:4]), "application/octet-stream")},
    )
    assert uploaded.status_code == 201, uploaded.text
    dataset = uploaded.json()
    assert dataset["kind"] == "prompts" and dataset["row_count"] == 4
    reinforcement = {
        "type": "reinforcement",
        "reinforcement": {
            "grader": {"type": "remote", "config": {"endpoint": "verl-gsm8k", "timeout_s": 60}},
            "hyperparameters": {
                "batch_size": 2,
                "group_size": 4,
                "max_tokens": 12,
                "max_steps_without_signal": 3,
            },
        },
    }
    job = finished(
        client,
        tenant,
        {"model": BASE, "training_file": dataset["id"], "suffix": "gsm8k", "steps": 2, "method": reinforcement}
        | {"from_adapter": sft["fine_tuned_model"]},
    )
    assert job["status"] == "succeeded", job

    url = f"/v1/fine_tuning/jobs/{job['id']}"
    events = client.get(f"{url}/events?limit=100", headers=tenant.headers()).json()["data"]
    steps = [event["data"] for event in events if event["type"] == "metrics"]
    samples = [sample for step in steps for sample in step["samples"]]
    assert len(steps) == 2 and samples
    for sample in samples:
        # Graded by the server (a failed call would be a 0 whose detail names the endpoint's failure).
        assert "gave no reward" not in (sample.get("detail") or ""), sample
        assert sample["reward"] == pytest.approx(compute_score(sample["text"], sample["reference"]), abs=1e-4), sample
    # Some of the 16 samples of each step wrote the line verl's strict match reads.
    assert all(step["reward"] > 0 for step in steps), [(step["reward"], step["samples"]) for step in steps]

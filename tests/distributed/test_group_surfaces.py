"""Tinker models and eval runs, unchanged, on a 2-rank worker group (gloo, FSDP2 over
tiny-glm-moe) whose ranks come from two agents, as on two machines: the official `tinker` SDK
trains a LoRA model on the group and samples it, with logprobs equal to what the group's
`forward` computes for the same tokens; an eval run of the base on a benchmark records every
trajectory."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tinker
from fastapi.testclient import TestClient
from tinker import types

from mint.services.workers import list_workers
from mint.storage.db import session_scope
from tests.conftest import LiveServer, Tenant, Workers, free_port, wait_for
from tests.jobs.conftest import BASE

pytestmark = pytest.mark.torch


@pytest.mark.long_run
def test_tinker_models_and_eval_runs_run_on_a_worker_group(
    client: TestClient, live_server: LiveServer, tenant: Tenant, workers: Workers, prepared: Any
) -> None:
    # Two agents of one rank each, meeting at a rendezvous endpoint: a group spanning two
    # machines, both on this one.
    meeting = (2, f"127.0.0.1:{free_port()}")
    agents = [workers.start("surfaces", nproc=1, machines=meeting, env={"OMP_NUM_THREADS": "1"}) for _ in range(2)]

    def registered() -> bool:
        for agent in agents:
            assert agent.poll() is None, f"an agent of the group exited with {agent.returncode}"
        with session_scope(prepared.database) as session:
            return any(w.id.startswith("surfaces@") for w in list_workers(session))

    wait_for(registered, "the group's rank 0 to register")

    service = tinker.ServiceClient(base_url=live_server.url, api_key=tenant.keys["developer"])
    training = service.create_lora_training_client(base_model=BASE, rank=4, seed=7).result()
    tokenizer = training.get_tokenizer()
    ids = tokenizer.encode("Ping 1 -> OK 1. Ping 2 -> OK 2.")
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
        )
    ]
    losses = []
    for _ in range(4):
        losses.append(training.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
        training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    assert losses[-1] < losses[0], losses

    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = tokenizer.encode("Ping 3 ->")
    response = sampler.sample(
        types.ModelInput.from_ints(prompt), num_samples=2, sampling_params=types.SamplingParams(max_tokens=5, stop=[])
    ).result()
    for sequence in response.sequences:
        assert len(sequence.tokens) == 5 and sequence.logprobs is not None
        full = prompt + list(sequence.tokens)
        scored = types.Datum(
            model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={"target_tokens": full[1:]}
        )
        forward = training.forward([scored], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
        np.testing.assert_allclose(np.asarray(forward.data)[len(prompt) - 1 :], sequence.logprobs, atol=1e-4)
    service.close("success").result()

    dev = tenant.headers("developer")
    benchmark = client.post("/v1/benchmarks", headers=dev, json={"name": "on-a-group", "builtin": "arithmetic", "n": 2})
    assert benchmark.status_code == 201, benchmark.text
    run = client.post(
        "/v1/evals",
        headers=dev,
        json={"benchmark_id": benchmark.json()["id"], "model": BASE, "max_tokens": 4, "max_steps": 1},
    ).json()

    def finished() -> dict[str, Any] | None:
        seen = client.get(f"/v1/evals/{run['id']}", headers=tenant.headers("viewer")).json()
        return seen if seen["status"] in ("succeeded", "failed") else None

    done = wait_for(finished, "the eval run on the group")
    assert done["status"] == "succeeded", done
    trajectories = client.get(f"/v1/evals/{run['id']}/trajectories?limit=100", headers=dev).json()["data"]
    assert len(trajectories) == done["metrics"]["tasks"] >= 2
    assert all(t["tokens_out"] > 0 for t in trajectories)

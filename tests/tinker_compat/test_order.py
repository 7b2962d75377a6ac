"""The protocol underneath the SDK, over plain HTTP: a model's requests apply strictly in
seq_id order whatever order they arrive in, a request sent twice is one request, every
request of a model runs on the one worker process that holds it, and results come back in
the wire formats the SDK reads (protobuf for forward_backward)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from tinker.proto.response_conv import deserialize_forward_backward_output

from mint.config import Settings
from mint.services.tinker import futures
from mint.storage.db import session_scope
from mint.storage.tables import Future, TrainingSession, Worker
from tests.conftest import LiveServer, Tenant
from tests.tinker_compat.conftest import BASE, HANG_S, TinkerWorker, api, post_forward_backward

pytestmark = pytest.mark.torch


def result(http: httpx.Client, request_id: str) -> httpx.Response:
    """Poll retrieve_future as the SDK does, until it answers something other than try_again."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        response = http.post("/api/v1/retrieve_future", json={"request_id": request_id})
        assert response.status_code == 200, response.text
        if response.headers["content-type"].startswith("application/x-protobuf"):
            return response
        if response.json().get("type") != "try_again":
            return response
    raise AssertionError(f"request {request_id} never finished")


def forward_backward(http: httpx.Client, model_id: str, seq_id: int, tokens: list[int]) -> dict[str, Any]:
    response = post_forward_backward(http, model_id, seq_id, tokens)
    assert response.status_code == 200, response.text
    return dict(response.json())


def optim_step(http: httpx.Client, model_id: str, seq_id: int) -> dict[str, Any]:
    body = {"model_id": model_id, "seq_id": seq_id, "adam_params": {"learning_rate": 1e-2}}
    response = http.post("/api/v1/optim_step", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def new_model(http: httpx.Client) -> str:
    session_id = http.post("/api/v1/create_session", json={"tags": ["order"], "sdk_version": "raw"}).json()[
        "session_id"
    ]
    body = {"session_id": session_id, "model_seq_id": 0, "base_model": BASE, "lora_config": {"rank": 4}}
    created = http.post("/api/v1/create_model", json=body).json()
    assert result(http, created["request_id"]).json() == {"model_id": created["model_id"], "type": "create_model"}
    return str(created["model_id"])


def test_requests_apply_in_seq_id_order_on_the_process_that_holds_the_model(
    live_server: LiveServer, alice: Tenant, prepared: Settings, tinker_worker: TinkerWorker
) -> None:
    tokens = list(range(100, 120))
    with api(live_server, alice) as http:
        model_id = new_model(http)
        # Arriving in the order 3, 2, 1: the optimizer steps wait for the gradients before them.
        late_step = optim_step(http, model_id, 3)
        late_grad = forward_backward(http, model_id, 2, tokens)
        first_grad = forward_backward(http, model_id, 1, tokens)
        assert optim_step(http, model_id, 3) == late_step  # sent again: the same request

        first = deserialize_forward_backward_output(result(http, first_grad["request_id"]).content)
        second = deserialize_forward_backward_output(result(http, late_grad["request_id"]).content)
        step = result(http, late_step["request_id"]).json()
        # Two gradients accumulated before one step: the second pass saw the same weights.
        assert first.metrics["loss:sum"] == pytest.approx(second.metrics["loss:sum"], rel=1e-6)
        assert len(first.loss_fn_outputs[0]["logprobs"].data) == len(tokens) - 1
        assert step["metrics"]["grad_norm:mean"] > 0
        after = deserialize_forward_backward_output(
            result(http, forward_backward(http, model_id, 4, tokens)["request_id"]).content
        )
        assert after.metrics["loss:sum"] < first.metrics["loss:sum"]

        used = http.post("/api/v1/optim_step", json={"model_id": model_id, "seq_id": 1, "adam_params": {}})
        assert used.status_code == 200 and used.json()["request_id"] == first_grad["request_id"]

    with session_scope(prepared.database) as session:
        model = session.get(TrainingSession, model_id)
        assert model is not None and model.next_seq_id == 5
        node, _, pid = (model.worker_id or "").rpartition("/")
        worker = session.get(Worker, node)
        assert worker is not None and worker.pid == int(pid) == tinker_worker.process.pid
        assert f"process.{worker.hostname}.{worker.pid}" in worker.queues
        statuses = session.execute(
            select(Future.seq_id, Future.status).where(Future.model_id == model_id).order_by(Future.seq_id)
        ).all()
        assert statuses == [(seq, "succeeded") for seq in range(5)]


def test_a_refused_request_keeps_its_place(live_server: LiveServer, alice: Tenant, tinker_worker: TinkerWorker) -> None:
    with api(live_server, alice) as http:
        model_id = new_model(http)
        refused = http.post("/api/v1/optim_step", json={"model_id": model_id, "seq_id": 1, "optimizer_params": {}})
        assert refused.status_code == 400 and "adam_params" in refused.json()["error"]["message"]
        step = optim_step(http, model_id, 2)  # runs: seq 1 is settled (failed), not missing
        assert "metrics" in result(http, step["request_id"]).json()
        failed = result(http, refused_future(http, model_id)).json()
        assert failed["category"] == "user" and "adam_params" in failed["error"]
        assert http.post("/api/v1/retrieve_future", json={"request_id": "fut_nothing"}).status_code == 404


def refused_future(http: httpx.Client, model_id: str) -> str:
    """The future a refused request left at its seq_id: sending seq 1 again names it."""
    again = http.post("/api/v1/optim_step", json={"model_id": model_id, "seq_id": 1, "adam_params": {}})
    assert again.status_code == 200, again.text
    return str(again.json()["request_id"])


def test_waiting_futures_say_what_they_wait_for(
    monkeypatch: pytest.MonkeyPatch, live_server: LiveServer, alice: Tenant, tinker_worker: TinkerWorker
) -> None:
    # retrieve_future holds a waiting request for 25 s; a shorter hold keeps this test quick.
    monkeypatch.setattr(futures, "LONG_POLL_S", 0.5)
    with api(live_server, alice) as http:
        session_id = http.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
        # No worker of this package holds tiny-qwen3-moe: the client is told how to fix it.
        body = {"session_id": session_id, "model_seq_id": 0, "base_model": "tiny-qwen3-moe"}
        created = http.post("/api/v1/create_model", json=body).json()
        waiting = http.post("/api/v1/retrieve_future", json={"request_id": created["request_id"]}).json()
        assert waiting["type"] == "try_again" and waiting["queue_state"] == "paused_capacity"
        assert "mint worker --base tiny-qwen3-moe" in waiting["queue_state_reason"]

        # A gap in the seq_ids: seq 2 waits for seq 1, and runs once it comes.
        model_id = new_model(http)
        second = optim_step(http, model_id, 2)
        early = http.post("/api/v1/retrieve_future", json={"request_id": second["request_id"]}).json()
        assert early == {"type": "try_again", "request_id": second["request_id"], "queue_state": "active"}
        optim_step(http, model_id, 1)
        assert "metrics" in result(http, second["request_id"]).json()


def test_large_requests_and_results_travel_through_the_object_store(
    live_server: LiveServer, alice: Tenant, prepared: Settings, tinker_worker: TinkerWorker
) -> None:
    length = 2001
    tokens = [100 + (i * 7919) % 40_000 for i in range(length)]
    weights = [((i * 37) % 1000) / 997 for i in range(length - 1)]  # long decimals: a large JSON request
    with api(live_server, alice) as http:
        model_id = new_model(http)
        response = post_forward_backward(http, model_id, 1, tokens, weights=weights, copies=2, forward_only=True)
        assert response.status_code == 200, response.text
        output = deserialize_forward_backward_output(result(http, response.json()["request_id"]).content)
    assert [len(out["logprobs"].data) for out in output.loss_fn_outputs] == [length - 1] * 2
    assert output.metrics["tokens:sum"] == 2 * (length - 1)
    with session_scope(prepared.database) as session:
        future = session.get(Future, response.json()["request_id"])
        assert future is not None and future.request is None and future.result is None
        assert future.request_object_key and future.result_object_key
        assert future.result_object_key.startswith("tinker/results/")

"""Two organizations train on one base at once, on the same worker process, in isolation:
neither's steps move the other's model, and neither can see, load, sample, poll, step or
finish anything of the other (404 through the SDK and over plain HTTP). The routes that
carry a protobuf body or answer protobuf stay out of the OpenAPI document, so the tenancy
walk of tests/test_tenancy.py cannot reach them; they are checked here."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tinker
from sqlalchemy import select
from tinker import types

from mint.config import Settings
from mint.storage.db import session_scope
from mint.storage.tables import Future, TrainingSession
from tests.conftest import LiveServer, Tenant
from tests.tinker_compat.conftest import BASE, TinkerWorker, api, post_forward_backward
from tests.tinker_compat.test_sdk import TEXTS, datum, logprobs_of

pytestmark = pytest.mark.torch


def test_two_organizations_share_a_base_in_isolation(
    connect: Callable[[Tenant], tinker.ServiceClient],
    rest: Callable[[Tenant], tinker.RestClient],
    live_server: LiveServer,
    alice: Tenant,
    bob: Tenant,
    prepared: Settings,
    tinker_worker: TinkerWorker,
) -> None:
    alice_service, bob_service = connect(alice), connect(bob)
    # Both created at once, with the same seed: the same starting adapter.
    creating = [
        service.create_lora_training_client(base_model=BASE, rank=4, seed=5) for service in (alice_service, bob_service)
    ]
    alice_model, bob_model = (future.result() for future in creating)
    data = [datum(alice_model.get_tokenizer(), text) for text in TEXTS]
    bob_before = logprobs_of(bob_model, data)

    # Interleaved: Alice trains while Bob only reads his model.
    for _ in range(3):
        alice_step = alice_model.forward_backward(data, "cross_entropy")
        bob_read = bob_model.forward(data, "cross_entropy")
        alice_model.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        alice_step.result(), bob_read.result()
    for mine, before in zip(logprobs_of(bob_model, data), bob_before, strict=True):
        np.testing.assert_array_equal(mine, before)
    assert not all(
        np.allclose(mine, before) for mine, before in zip(logprobs_of(alice_model, data), bob_before, strict=True)
    )
    state = alice_model.save_state("shared-base").result()
    sampler_weights = alice_model.save_weights_for_sampler("shared-base").result()
    alice_sampler = alice_service.create_sampling_client(model_path=sampler_weights.path).result()
    alice_sampler.sample(
        types.ModelInput.from_ints(data[0].model_input.to_ints()), 1, types.SamplingParams(max_tokens=2)
    ).result()

    with session_scope(prepared.database) as session:
        models = {m.id: m for m in session.execute(select(TrainingSession)).scalars()}
        assert models[alice_model.model_id].worker_id == models[bob_model.model_id].worker_id
        assert models[alice_model.model_id].organization_id == alice.organization_id
        alice_session = models[alice_model.model_id].tinker_session_id
        alice_sampler_id = next(
            m.id for m in models.values() if m.kind == "sampling" and m.model_path == sampler_weights.path
        )
        alice_future = session.execute(
            select(Future.id).where(Future.model_id == alice_model.model_id).limit(1)
        ).scalar_one()

    # Through the SDK: Bob finds nothing of Alice's.
    bob_rest = rest(bob)
    for call in (
        lambda: bob_rest.get_training_run(alice_model.model_id).result(),
        lambda: bob_rest.list_checkpoints(alice_model.model_id).result(),
        lambda: bob_rest.get_weights_info_by_tinker_path(state.path).result(),
        lambda: bob_rest.get_sampler(alice_sampler_id).result(),
        lambda: bob_service.create_training_client_from_state_with_optimizer(state.path).result(),
        lambda: bob_service.create_sampling_client(model_path=sampler_weights.path).result(),
    ):
        with pytest.raises(tinker.NotFoundError):
            call()
    bob_runs = {run.training_run_id for run in bob_rest.list_training_runs(limit=100).result().training_runs}
    assert bob_model.model_id in bob_runs and alice_model.model_id not in bob_runs
    bob_paths = {c.tinker_path for c in bob_rest.list_user_checkpoints().result().checkpoints}
    assert not {state.path, sampler_weights.path} & bob_paths

    # Over plain HTTP, every route that names something of Alice's: 404 for Bob.
    with api(live_server, bob) as http:
        assert post_forward_backward(http, alice_model.model_id, 99, [1, 2, 3]).status_code == 404
        for method, path, body in [
            ("POST", "/api/v1/retrieve_future", {"request_id": alice_future}),
            ("POST", "/api/v1/cancel_future", {"request_id": alice_future}),
            ("POST", "/api/v1/get_info", {"model_id": alice_model.model_id}),
            ("POST", "/api/v1/optim_step", {"model_id": alice_model.model_id, "seq_id": 99, "adam_params": {}}),
            ("POST", "/api/v1/save_weights", {"model_id": alice_model.model_id, "seq_id": 99, "path": "x"}),
            ("POST", "/api/v1/save_weights_for_sampler", {"model_id": alice_model.model_id, "seq_id": 99, "path": "x"}),
            ("POST", "/api/v1/load_weights", {"model_id": bob_model.model_id, "seq_id": 99, "path": state.path}),
            ("POST", "/api/v1/create_model", {"session_id": alice_session, "model_seq_id": 9, "base_model": BASE}),
            (
                "POST",
                "/api/v1/create_sampling_session",
                {"session_id": alice_session, "sampling_session_seq_id": 9, "base_model": BASE},
            ),
            (
                "POST",
                "/api/v1/asample",
                {
                    "sampling_session_id": alice_sampler_id,
                    "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1]}]},
                },
            ),
            ("POST", "/api/v1/session_heartbeat", {"session_id": alice_session}),
            ("POST", "/api/v1/weights_info", {"tinker_path": state.path}),
            ("POST", f"/api/v1/sessions/{alice_session}/finish", {}),
            ("GET", f"/api/v1/sessions/{alice_session}", None),
            ("GET", f"/api/v1/samplers/{alice_sampler_id}", None),
            ("GET", f"/api/v1/training_runs/{alice_model.model_id}", None),
            ("GET", f"/api/v1/training_runs/{alice_model.model_id}/checkpoints", None),
            ("DELETE", f"/api/v1/training_runs/{alice_model.model_id}/checkpoints/weights/shared-base", None),
        ]:
            response = http.request(method, path, json=body)
            assert response.status_code == 404, (path, response.status_code, response.text)
        adapters = http.get("/v1/adapters", params={"limit": 100}).json()["data"]
        assert not [a for a in adapters if alice_model.model_id.replace(":", "-") in a["name"]]

    # Alice's session, model and checkpoints are untouched by all of that.
    alice_model.forward_backward(data, "cross_entropy").result()
    assert {c.tinker_path for c in rest(alice).list_checkpoints(alice_model.model_id).result().checkpoints} == {
        state.path,
        sampler_weights.path,
    }

"""The official `tinker` SDK, unmodified, against Mint: a LoRA training client on the tiny base
trains with its loss falling, runs a custom loss, saves sampler weights (an adapter version
in /v1/adapters) and samples them with logprobs, saves and restores its state, lists its
checkpoints; errors reach the client as the SDK's own exception types."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from tests.conftest import LiveServer, Tenant
from tests.tinker_compat.conftest import BASE, TinkerWorker, api

pytestmark = pytest.mark.torch

TEXTS = ["Ping 1 -> OK 1", "Ping 2 -> OK 2", "Ping 3 -> OK 0"]
ADAM = types.AdamParams(learning_rate=2e-2)


def datum(tokenizer: Any, text: str) -> types.Datum:
    """One sequence, next-token targets, every position weighted."""
    ids = tokenizer.encode(text)
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )


def logprobs_of(training: tinker.TrainingClient, data: list[types.Datum]) -> list[np.ndarray]:
    result = training.forward(data, "cross_entropy").result()
    return [np.asarray(out["logprobs"].data, dtype=np.float32) for out in result.loss_fn_outputs]


def weighted_nll(data: list[types.Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """A custom loss, written as a user would: the weighted NLL, computed with torch on the client."""
    loss = sum(-(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(data, logprobs, strict=True))
    assert isinstance(loss, torch.Tensor)
    return loss, {"custom_nll:sum": float(loss.detach())}


def test_training_client_trains_samples_saves_and_restores(
    connect: Callable[[Tenant], tinker.ServiceClient],
    rest: Callable[[Tenant], tinker.RestClient],
    live_server: LiveServer,
    alice: Tenant,
    tinker_worker: TinkerWorker,
) -> None:
    service = connect(alice)
    capabilities = rest(alice).get_server_capabilities().result()
    assert BASE in {model.model_name for model in capabilities.supported_models}

    training = service.create_lora_training_client(base_model=BASE, rank=4, seed=7).result()
    info = training.get_info()
    assert info.model_id == training.model_id and info.lora_rank == 4 and info.model_data.model_name == BASE
    tokenizer = training.get_tokenizer()  # from the folder get_info names: no hub
    data = [datum(tokenizer, text) for text in TEXTS]

    losses = []
    for _ in range(6):
        step = training.forward_backward(data, "cross_entropy")
        optim = training.optim_step(ADAM)
        losses.append(step.result().metrics["loss:sum"])
        assert optim.result().metrics["grad_norm:mean"] > 0
    assert losses[-1] < losses[0] * 0.8, losses

    # A custom loss through the client's own path (forward, torch on the client, a linear
    # backward) moves the weights exactly as the built-in loss it equals does: a twin model
    # with the same seed, trained once each way, ends with the same logprobs.
    twin = service.create_lora_training_client(base_model=BASE, rank=4, seed=11).result()
    other = service.create_lora_training_client(base_model=BASE, rank=4, seed=11).result()
    before = twin.forward(data, "cross_entropy").result().metrics["loss:sum"]
    custom = twin.forward_backward_custom(data, weighted_nll).result()
    assert custom.metrics["loss:sum"] == pytest.approx(before, rel=1e-5)
    assert custom.metrics["custom_nll:sum"] == pytest.approx(before, rel=1e-5)
    other.forward_backward(data, "cross_entropy").result()
    twin.optim_step(ADAM).result()
    other.optim_step(ADAM).result()
    for mine, theirs in zip(logprobs_of(twin, data), logprobs_of(other, data), strict=True):
        np.testing.assert_allclose(mine, theirs, atol=1e-4)

    # Named sampler weights are an adapter version of Mint, and a sampling client samples them
    # with logprobs equal to what forward computes for the same tokens.
    saved = training.save_weights_for_sampler("six").result()
    assert saved.path == f"tinker://{training.model_id}/sampler_weights/six"
    sampler = service.create_sampling_client(model_path=saved.path).result()
    assert sampler.get_base_model() == BASE
    prompt = tokenizer.encode("Ping 4 ->")
    response = sampler.sample(
        types.ModelInput.from_ints(prompt),
        num_samples=2,
        sampling_params=types.SamplingParams(max_tokens=5, seed=3, stop=[]),
        include_prompt_logprobs=True,
    ).result()
    assert len(response.sequences) == 2
    assert response.prompt_logprobs is not None and response.prompt_logprobs[0] is None
    for sequence in response.sequences:
        assert len(sequence.tokens) == 5 and sequence.stop_reason == "length"
        assert sequence.logprobs is not None and len(sequence.logprobs) == 5
        full = prompt + list(sequence.tokens)
        scored = types.Datum(
            model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={"target_tokens": full[1:]}
        )
        forward = logprobs_of(training, [scored])[0]
        np.testing.assert_allclose(forward[len(prompt) - 1 :], sequence.logprobs, atol=1e-3)
        np.testing.assert_allclose(forward[: len(prompt) - 1], response.prompt_logprobs[1:], atol=1e-3)

    with api(live_server, alice) as client:
        adapters = client.get("/v1/adapters").json()["data"]
        adapter = next(a for a in adapters if a["name"] == f"tinker-{training.model_id.replace(':', '-')}")
        versions = client.get(f"/v1/adapters/{adapter['id']}/versions").json()
    assert [v["metrics"]["tinker_path"] for v in versions] == [saved.path]
    assert adapter["base_model"] == BASE

    # The training state: weights, Adam moments and step. Restored with the optimizer, one
    # more identical step on each leaves the two models equal.
    state = training.save_state("six").result()
    assert state.path == f"tinker://{training.model_id}/weights/six"
    restored = service.create_training_client_from_state_with_optimizer(state.path).result()
    weights_only = service.create_training_client_from_state(state.path).result()
    assert restored.get_info().lora_rank == 4
    expected = logprobs_of(training, data)
    for copy in (restored, weights_only):
        for mine, theirs in zip(logprobs_of(copy, data), expected, strict=True):
            np.testing.assert_allclose(mine, theirs, atol=1e-5)
    for model in (training, restored):
        model.forward_backward(data, "cross_entropy").result()
        model.optim_step(ADAM).result()
    for mine, theirs in zip(logprobs_of(restored, data), logprobs_of(training, data), strict=True):
        np.testing.assert_allclose(mine, theirs, atol=1e-5)

    checkpoints = rest(alice).list_checkpoints(training.model_id).result().checkpoints
    assert {(c.checkpoint_type, c.checkpoint_id, c.tinker_path) for c in checkpoints} == {
        ("sampler", "sampler_weights/six", saved.path),
        ("training", "weights/six", state.path),
    }
    run = rest(alice).get_training_run(training.model_id).result()
    assert run.base_model == BASE and run.lora_rank == 4
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == state.path
    weights = rest(alice).get_weights_info_by_tinker_path(state.path).result()
    assert weights.base_model == BASE and weights.lora_rank == 4
    listed = rest(alice).list_training_runs(limit=50).result()
    assert {training.model_id, restored.model_id, twin.model_id} <= {r.training_run_id for r in listed.training_runs}


def test_save_and_sample_and_a_base_sampler(
    connect: Callable[[Tenant], tinker.ServiceClient], alice: Tenant, tinker_worker: TinkerWorker
) -> None:
    """The RL loop's path: a snapshot sampler from the training client, and the base's own sampler."""
    service = connect(alice)
    training = service.create_lora_training_client(base_model=BASE, rank=4, seed=1).result()
    tokenizer = training.get_tokenizer()
    prompt = types.ModelInput.from_ints(tokenizer.encode("What is 2 + 2?"))
    greedy = types.SamplingParams(max_tokens=4, temperature=0.0, stop=[])

    base = service.create_sampling_client(base_model=BASE).result()
    snapshot = training.save_weights_and_get_sampling_client().result()
    # A fresh adapter starts as the base (LoRA's B is zero): greedy samples agree.
    from_base = base.sample(prompt, 1, greedy).result().sequences[0]
    from_snapshot = snapshot.sample(prompt, 1, greedy).result().sequences[0]
    assert from_base.tokens == from_snapshot.tokens
    logprobs = base.compute_logprobs(prompt).result()
    assert logprobs[0] is None and all(value is not None and value < 0 for value in logprobs[1:])

    data = [datum(tokenizer, text) for text in TEXTS]
    for _ in range(3):
        training.forward_backward(data, "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    trained = training.save_weights_and_get_sampling_client().result()
    later = trained.sample(prompt, 1, greedy).result().sequences[0]
    assert later.logprobs != from_snapshot.logprobs  # the new snapshot holds the new weights
    assert snapshot.sample(prompt, 1, greedy).result().sequences[0].tokens == from_snapshot.tokens


def test_errors_reach_the_client_as_sdk_errors(
    connect: Callable[[Tenant], tinker.ServiceClient],
    live_server: LiveServer,
    alice: Tenant,
    tinker_worker: TinkerWorker,
) -> None:
    service = connect(alice)
    with pytest.raises(tinker.BadRequestError, match="unknown or disabled base model 'no-such-base'"):
        service.create_lora_training_client(base_model="no-such-base", rank=4).result()
    training = service.create_lora_training_client(base_model=BASE, rank=4).result()
    data = [datum(training.get_tokenizer(), TEXTS[0])]

    with pytest.raises(tinker.RequestFailedError, match="unknown loss 'reinforce'; known: cispo, cross_entropy"):
        training.forward_backward(data, "reinforce").result()  # type: ignore[arg-type]
    misaligned = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]), loss_fn_inputs={"target_tokens": [2, 3]}
    )
    with pytest.raises(tinker.BadRequestError, match="target_tokens"):
        training.forward_backward([misaligned], "cross_entropy").result()
    # A refused request keeps its place in the model's order: the next ones still run.
    assert training.forward_backward(data, "cross_entropy").result().metrics["loss:sum"] > 0
    training.optim_step(ADAM).result()

    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        service.create_sampling_client(model_path=f"tinker://{training.model_id}/sampler_weights/never").result()
    with pytest.raises(tinker.BadRequestError, match="is not a checkpoint path"):
        service.create_training_client_from_state("tinker://nowhere").result()
    state = training.save_state("once").result()
    with pytest.raises(tinker.RequestFailedError, match="already has a saved state named 'once'"):
        training.save_state("once").result()
    assert training.save_state("once", overwrite=True).result().path == state.path

    stranger = tinker.ServiceClient(base_url=live_server.url, api_key="tml-" + "0" * 40)
    with pytest.raises(tinker.AuthenticationError):
        stranger.create_lora_training_client(base_model=BASE, rank=4).result()

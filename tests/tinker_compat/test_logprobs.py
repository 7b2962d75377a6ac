"""The official `tinker` SDK asks for more than the sampled tokens' logprobs: top-k lists at prompt
and sampled positions, the logprobs of ids it names at prompt positions (dense or sparse), and
trains on (N, K) cross-entropy targets, as the cookbook's distillation recipes do. Every number
is checked against another route to the same number: the training client's `forward` on the
same weights, which the trainer tests check against a full softmax."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from tests.conftest import Tenant
from tests.tinker_compat.conftest import BASE, TinkerWorker
from tests.tinker_compat.test_sdk import ADAM, TEXTS, datum

pytestmark = pytest.mark.torch

K = 3


def forward_table(training: tinker.TrainingClient, prompt: list[int], targets: torch.Tensor) -> np.ndarray:
    """`forward` with (N, K) targets: the logprob of targets[i][j] at prompt position i + 1."""
    scored = types.Datum(
        model_input=types.ModelInput.from_ints(prompt[:-1]),
        loss_fn_inputs={"target_tokens": types.TensorData.from_torch(targets)},
    )
    output = training.forward([scored], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    assert output.shape == list(targets.shape)
    return output.to_numpy().reshape(targets.shape)


def test_top_k_and_target_logprobs_agree_with_forward(
    connect: Callable[[Tenant], tinker.ServiceClient], alice: Tenant, tinker_worker: TinkerWorker
) -> None:
    service = connect(alice)
    training = service.create_lora_training_client(base_model=BASE, rank=4, seed=3).result()
    tokenizer = training.get_tokenizer()
    training.forward_backward([datum(tokenizer, text) for text in TEXTS], "cross_entropy").result()
    training.optim_step(ADAM).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = tokenizer.encode("Ping 2 -> OK 2. Ping 5 ->")
    positions = len(prompt) - 1

    # Sparse targets: the true next token at every position, and a second id at a few.
    wanted = torch.full((positions, 2), -1, dtype=torch.long)
    wanted[:, 0] = torch.tensor(prompt[1:])
    wanted[::3, 1] = 7
    response = sampler.sample(
        types.ModelInput.from_ints(prompt),
        num_samples=2,
        sampling_params=types.SamplingParams(max_tokens=4, seed=9, stop=[]),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=K,
        topk_sample_logprobs=2,
        target_prompt_logprobs=types.TensorData.from_torch_sparse(wanted, pad_value=-1),
    ).result()

    top = response.topk_prompt_logprobs
    assert top is not None and len(top) == len(prompt) and top[0] is None
    top_ids = torch.tensor([[token for token, _ in entries] for entries in top[1:]])  # type: ignore[union-attr]
    listed = np.array([[value for _, value in entries] for entries in top[1:]])  # type: ignore[union-attr]
    assert top_ids.shape == (positions, K) and (np.diff(listed, axis=1) <= 0).all()
    np.testing.assert_allclose(forward_table(training, prompt, top_ids), listed, atol=1e-4)

    assert response.target_prompt_logprobs is not None
    scored = response.target_prompt_logprobs.to_torch().numpy()
    assert scored.shape == (positions, 2)
    expected = forward_table(training, prompt, wanted.clamp(min=0))
    np.testing.assert_allclose(scored[:, 0], expected[:, 0], atol=1e-4)
    np.testing.assert_allclose(scored[::3, 1], expected[::3, 1], atol=1e-4)
    assert response.prompt_logprobs is not None
    np.testing.assert_allclose(response.prompt_logprobs[1:], expected[:, 0], atol=1e-4)

    for sequence in response.sequences:
        lists = sequence.topk_logprobs
        assert lists is not None and len(lists) == len(sequence.tokens) == 4
        full = prompt + list(sequence.tokens)
        ids = torch.tensor([[token for token, _ in entries] for entries in lists])  # type: ignore[union-attr]
        values = np.array([[value for _, value in entries] for entries in lists])  # type: ignore[union-attr]
        np.testing.assert_allclose(
            forward_table(training, full, torch.cat([torch.zeros((len(prompt) - 1, 2), dtype=torch.long), ids]))[
                len(prompt) - 1 :
            ],
            values,
            atol=1e-4,
        )

    # With prompt_logprobs_last_n, only the last N positions carry a list.
    last = sampler.sample(
        types.ModelInput.from_ints(prompt),
        num_samples=1,
        sampling_params=types.SamplingParams(max_tokens=1, seed=1),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=K,
        prompt_logprobs_last_n=2,
    ).result()
    assert last.topk_prompt_logprobs is not None
    assert [entries is None for entries in last.topk_prompt_logprobs] == [True] * (len(prompt) - 2) + [False] * 2
    np.testing.assert_allclose(
        [[value for _, value in entries] for entries in last.topk_prompt_logprobs[-2:]],  # type: ignore[union-attr]
        listed[-2:],
        atol=1e-5,
    )

    # A request the server cannot answer is refused when it is sent, naming the field.
    with pytest.raises(tinker.BadRequestError, match="needs len\\(prompt\\) - 1"):
        sampler.sample(
            types.ModelInput.from_ints(prompt),
            num_samples=1,
            sampling_params=types.SamplingParams(max_tokens=1),
            target_prompt_logprobs=types.TensorData.from_torch(wanted[:2]),
        ).result()


def test_distillation_targets_train_through_the_sdk(
    connect: Callable[[Tenant], tinker.ServiceClient], alice: Tenant, tinker_worker: TinkerWorker
) -> None:
    """(N, K) targets with (N, K) weights: the loss is minus the weighted sum of the forward's
    (N, K) logprobs, and training on a teacher's distribution moves the student towards it."""
    service = connect(alice)
    student = service.create_lora_training_client(base_model=BASE, rank=4, seed=5).result()
    ids = student.get_tokenizer().encode(TEXTS[1])
    targets = torch.tensor([[ids[i + 1], 11, 12] for i in range(len(ids) - 1)])
    weights = torch.tensor([[0.7, 0.2, 0.1]] * (len(ids) - 1))
    soft = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_torch(targets),
            "weights": types.TensorData.from_torch(weights),
        },
    )
    before = forward_table(student, ids, targets)
    step = student.forward_backward([soft], "cross_entropy").result()
    assert step.metrics["loss:sum"] == pytest.approx(float(-(weights.numpy() * before).sum()), rel=1e-4)
    student.optim_step(ADAM).result()
    for _ in range(3):
        student.forward_backward([soft], "cross_entropy").result()
        student.optim_step(ADAM).result()
    after = forward_table(student, ids, targets)
    assert (weights.numpy() * after).sum() > (weights.numpy() * before).sum()
    # Another loss reads one token per position: refused at the request, naming the loss.
    with pytest.raises(tinker.RequestFailedError, match="takes one per position"):
        student.forward_backward(
            [
                types.Datum(
                    model_input=soft.model_input,
                    loss_fn_inputs={
                        "target_tokens": soft.loss_fn_inputs["target_tokens"],
                        "logprobs": types.TensorData.from_torch(torch.zeros(len(ids) - 1)),
                        "advantages": types.TensorData.from_torch(torch.ones(len(ids) - 1)),
                    },
                )
            ],
            "importance_sampling",
        ).result()

"""`prompt_cache_hit_tokens` through the official `tinker` SDK: a sampler's second request of a
prompt reads the prompt's whole blocks from the worker's prompt cache (16 tokens each; the last
prompt token always runs) and samples what the first did; a snapshot of new weights gets no hit."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import tinker
import torch
from tinker import types

from tests.conftest import Tenant
from tests.tinker_compat.conftest import BASE, TinkerWorker

pytestmark = pytest.mark.torch


def test_a_repeated_prompt_reports_its_cache_hits(
    connect: Callable[[Tenant], tinker.ServiceClient], alice: Tenant, tinker_worker: TinkerWorker
) -> None:
    service = connect(alice)
    ids = torch.randint(100, 40000, (40,), generator=torch.Generator().manual_seed(39)).tolist()
    prompt = types.ModelInput.from_ints(ids)
    greedy = types.SamplingParams(max_tokens=4, temperature=0.0, stop=[])
    base = service.create_sampling_client(base_model=BASE).result()
    first = base.sample(prompt, 2, greedy).result()
    second = base.sample(prompt, 2, greedy).result()
    assert first.prompt_cache_hit_tokens == 0
    assert second.prompt_cache_hit_tokens == 32
    assert [s.tokens for s in second.sequences] == [s.tokens for s in first.sequences]
    for before, after in zip(first.sequences, second.sequences, strict=True):
        assert after.logprobs == pytest.approx(before.logprobs, abs=1e-5)

    training = service.create_lora_training_client(base_model=BASE, rank=4, seed=2).result()
    snapshot = training.save_weights_and_get_sampling_client().result()
    assert snapshot.sample(prompt, 1, greedy).result().prompt_cache_hit_tokens == 0
    assert snapshot.sample(prompt, 1, greedy).result().prompt_cache_hit_tokens == 32
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )
    training.forward_backward([datum], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    trained = training.save_weights_and_get_sampling_client().result()
    assert trained.sample(prompt, 1, greedy).result().prompt_cache_hit_tokens == 0

"""A model lives on one worker process: when that process dies, the model's next request fails
at once with a message that names the checkpoint to restore from (no hang), and the model
restored from it trains on the worker that took over."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import tinker
from tinker import types

from tests.conftest import Tenant
from tests.tinker_compat.conftest import BASE, TinkerWorker
from tests.tinker_compat.test_sdk import ADAM, TEXTS, datum, logprobs_of

pytestmark = pytest.mark.torch


def test_a_model_whose_worker_died_says_how_to_restore_it(
    connect: Callable[[Tenant], tinker.ServiceClient], alice: Tenant, tinker_worker: TinkerWorker
) -> None:
    service = connect(alice)
    training = service.create_lora_training_client(base_model=BASE, rank=4, seed=3).result()
    data = [datum(training.get_tokenizer(), text) for text in TEXTS]
    training.forward_backward(data, "cross_entropy").result()
    training.optim_step(ADAM).result()
    state = training.save_state("before-crash").result()
    saved = logprobs_of(training, data)

    tinker_worker.crash_and_restart()

    with pytest.raises(tinker.RequestFailedError, match=r"stopped.*weights since its last save_state") as lost:
        training.forward_backward(data, "cross_entropy").result()
    assert f"create_training_client_from_state_with_optimizer('{state.path}')" in str(lost.value)

    restored = service.create_training_client_from_state_with_optimizer(state.path).result()
    for mine, before in zip(logprobs_of(restored, data), saved, strict=True):
        assert mine.tolist() == pytest.approx(before.tolist(), abs=1e-5)
    restored.forward_backward(data, "cross_entropy").result()
    assert restored.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics["grad_norm:mean"] > 0

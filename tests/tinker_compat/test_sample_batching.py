"""Concurrent sample requests through the official SDK: the worker that takes the first request
of a sampler adapter decodes the other pending requests of the same adapter with it, in one
batch. Each request gets its own result (what it gets alone), its own usage record, and a
request the base cannot run fails alone; requests of another adapter form their own batch.

The requests are all recorded while no worker of the base runs (the base is one no other
module's worker serves), so the batches do not depend on timing: a worker started afterwards
finds every request pending."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tinker
from sqlalchemy import select
from tinker import types

from mint.config import PROJECT_ROOT, Settings
from mint.schemas.base_models import get_base_model_spec
from mint.services.tinker.future_rows import get_payload
from mint.storage.db import session_scope
from mint.storage.objects import object_store_for
from mint.storage.tables import Future, UsageRecord
from mint.trainer.session import ResidentBase
from mint.trainer.types import Datum, SamplingParams
from tests.conftest import Tenant, make_tenant, wait_for
from tests.tinker_compat.conftest import HANG_S, TinkerWorker

pytestmark = pytest.mark.torch

BATCH_BASE = "tiny-qwen3-moe"
CONTEXT_LENGTH = 2048  # tiny-qwen3-moe's


@pytest.fixture
def quiet_base(prepared: Settings) -> None:
    """The base's queue emptied of messages earlier tests sent where no worker listened."""
    from mint.worker.app import celery_for
    from mint.worker.queues import training_queue

    with celery_for(prepared).connection_for_write() as connection:
        connection.default_channel.queue_purge(training_queue(BATCH_BASE))


@pytest.fixture
def batch_tenant(prepared: Settings) -> Tenant:
    return make_tenant(prepared, "tinker-batching")


@pytest.fixture
def started() -> Iterator[list[TinkerWorker]]:
    """Workers the test starts; every one still running is stopped afterwards."""
    workers: list[TinkerWorker] = []
    yield workers
    for worker in workers:
        worker.stop()


def sdk_params(params: SamplingParams) -> types.SamplingParams:
    return types.SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        seed=params.seed,
        stop=params.stop,
    )


# prompt, parameters, num_samples: prompts of different lengths, each with its own parameters.
ON_BASE = [
    ([17, 932, 4401, 88, 1203], SamplingParams(max_tokens=6, seed=1, stop=[]), 2),
    ([3001, 42, 9, 870, 12, 13, 14, 15, 16], SamplingParams(max_tokens=4, seed=2, temperature=0.7, top_k=10), 1),
]
TOO_LONG = [7] * CONTEXT_LENGTH  # leaves no room to sample: refused, alone
ON_SNAPSHOT = [
    ([640, 23, 23], SamplingParams(max_tokens=5, temperature=0.0, stop=[]), 3),
    ([5, 19000, 23, 23, 640, 11], SamplingParams(max_tokens=3, seed=4, top_p=0.8, stop=[]), 1),
]


@pytest.mark.long_run
def test_concurrent_sample_requests_decode_in_one_batch_per_sampler_adapter(
    connect: Callable[[Tenant], tinker.ServiceClient],
    batch_tenant: Tenant,
    prepared: Settings,
    quiet_base: None,
    started: list[TinkerWorker],
    tmp_path: Path,
) -> None:
    service = connect(batch_tenant)
    started.append(TinkerWorker(prepared, name="batching", base=BATCH_BASE))
    training = service.create_lora_training_client(base_model=BATCH_BASE, rank=4, seed=3).result()
    # A fresh adapter (LoRA's B is zero) samples what the base samples, under another adapter key.
    snapshot = training.save_weights_and_get_sampling_client().result()
    base = service.create_sampling_client(base_model=BATCH_BASE).result()
    started.pop().stop()  # no worker of the base runs while the requests are sent

    def send(sampler: tinker.SamplingClient, prompt: list[int], params: SamplingParams, n: int) -> tinker.APIFuture:
        return sampler.sample(types.ModelInput.from_ints(prompt), n, sdk_params(params), include_prompt_logprobs=True)

    sent = [send(base, *request) for request in ON_BASE]
    refused = send(base, TOO_LONG, SamplingParams(max_tokens=2), 1)
    sent += [send(snapshot, *request) for request in ON_SNAPSHOT]

    def recorded() -> list[Future]:
        with session_scope(prepared.database) as session:
            rows = session.execute(
                select(Future).where(
                    Future.organization_id == batch_tenant.organization_id, Future.operation == "sample"
                )
            ).scalars()
            return list(rows)

    wait_for(lambda: len(recorded()) == 5 and all(f.status == "pending" for f in recorded()), "5 pending samples")
    started.append(TinkerWorker(prepared, name="batching", base=BATCH_BASE))
    responses = [future.result(timeout=HANG_S) for future in sent]
    with pytest.raises(tinker.RequestFailedError, match="leaves no room in the context"):
        refused.result(timeout=HANG_S)

    # Each request got what it gets alone, on the same base built in this process.
    spec = get_base_model_spec(BATCH_BASE, PROJECT_ROOT / "configs" / "models")
    alone = ResidentBase(spec, tmp_path / "bases")
    for (prompt, params, n), response in zip([*ON_BASE, *ON_SNAPSHOT], responses, strict=True):
        expected = alone.sample_with(None, prompt, params, n)
        assert [list(s.tokens) for s in response.sequences] == [s.tokens for s in expected]
        for sequence, single in zip(response.sequences, expected, strict=True):
            assert sequence.logprobs == pytest.approx(single.logprobs, abs=1e-4)
        full = alone.forward([Datum(model_input=prompt[:-1], loss_fn_inputs={"target_tokens": prompt[1:]})])
        assert response.prompt_logprobs[0] is None
        assert response.prompt_logprobs[1:] == pytest.approx(full.logprobs[0], abs=1e-4)

    # One batch per sampler adapter, both on the worker that started after the requests.
    store = object_store_for(prepared)
    futures = {tuple(get_payload(store, f.request, f.request_object_key)["prompt"]): f for f in recorded()}
    assert len({f.worker_id for f in futures.values()}) == 1
    failed = futures[tuple(TOO_LONG)]
    assert failed.status == "failed" and failed.error_category == "user"

    def batch_of(prompt: list[int]) -> dict[str, Any]:
        future = futures[tuple(prompt)]
        assert future.status == "succeeded"
        return dict(get_payload(store, future.result, future.result_object_key)["batch"])

    on_base = [batch_of(prompt) for prompt, _, _ in ON_BASE]
    on_snapshot = [batch_of(prompt) for prompt, _, _ in ON_SNAPSHOT]
    assert on_base[0] == on_base[1] and on_base[0]["requests"] == 3  # the refused request was claimed too
    assert on_snapshot[0] == on_snapshot[1] and on_snapshot[0]["requests"] == 2
    assert on_base[0]["id"] != on_snapshot[0]["id"]

    # Usage per request, as each had run alone: the tokens it sampled.
    with session_scope(prepared.database) as session:
        usage = session.execute(
            select(UsageRecord).where(
                UsageRecord.organization_id == batch_tenant.organization_id, UsageRecord.kind == "sampled"
            )
        ).scalars()
        tokens = sorted(record.tokens for record in usage)
    assert tokens == sorted(sum(len(s.tokens) for s in response.sequences) for response in responses)

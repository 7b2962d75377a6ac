"""Sample batches on a worker: a sample request claimed with the other pending requests of the
same sampler adapter, decoded as one batch on the resident base, and each result recorded.

Samplers run on any worker of their base (`mint.services.tinker.sampling` sends each request to
the base's queue). The worker that takes a request's message also claims up to
SAMPLE_BATCH_CAP - 1 other pending requests of the same adapter on the same base, decodes them
together (`ResidentBase.sample_batch`), and records each request's result, usage or failure on its
own future; a request the base cannot run (a prompt too long) fails alone. A result holds what
the request asked about its prompt (logprobs, top-k, target logprobs), how many of its
prompt's tokens came from the resident base's prompt cache (`prompt_cache_hit_tokens`) and, with
record_stability_info, each token's sampler logprob for `mint.services.tinker.provenance`. The
trainer is imported only through the resident base, so importing this module imports no torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import MintError
from mint.services.billing.usage import record_usage
from mint.services.tinker.future_rows import fail_future, get_payload, set_result
from mint.services.tinker.resident import LoadBase, WorkerIdentity, export_tokenizer, sampler_adapter
from mint.storage.db import session_scope
from mint.storage.objects import ObjectStore, object_store_for
from mint.storage.queries import rowcount
from mint.storage.tables import Future, TrainingSession, new_id
from mint.trainer.prompt_scores import PromptQuery
from mint.trainer.types import SampledSequence, SampleRequest, SamplingParams

if TYPE_CHECKING:
    from mint.trainer.session import ResidentBase

log = logging.getLogger(__name__)

# Sample requests of one sampler adapter a worker decodes as one batch at most: the one its
# message names and the oldest others pending.
SAMPLE_BATCH_CAP = 16


@dataclass(frozen=True)
class _ClaimedSample:
    """A sample request this worker claimed: its future, its owner and what it asks."""

    future_id: str
    organization_id: str
    payload: dict[str, Any]


def run_sample(settings: Settings, future_id: str, me: WorkerIdentity, load_base: LoadBase) -> str:
    """Claim a sample request and, with it, the other pending requests of the same sampler
    adapter on the same base (at most SAMPLE_BATCH_CAP in all), and decode them as one batch
    on this worker's resident base. Each request's result, usage or failure is recorded on its
    own future; the other requests' own messages then find them taken and return at once.
    Returns what happened to `future_id`'s request."""
    store = object_store_for(settings)
    with session_scope(settings.database) as session:
        future = session.get(Future, future_id)
        if future is None or future.status != "pending":
            return "not-pending"
        sampler = session.get(TrainingSession, future.session_id)
        if sampler is None or sampler.status != "active":
            fail_future(future, "user", f"sampler {future.model_id} is closed (its session finished)")
            return "closed"
        if not _claim_future(session, future_id, me.worker_id):
            return "taken"
        base_model, key = sampler.base_model, sampler.adapter_object_key
        payload = get_payload(store, future.request, future.request_object_key)
        claimed = [_ClaimedSample(future_id, sampler.organization_id, payload)]
        for other, its_sampler in _pending_samples_of(session, base_model, key, exclude=future_id):
            if _claim_future(session, other.id, me.worker_id):
                payload = get_payload(store, other.request, other.request_object_key)
                claimed.append(_ClaimedSample(other.id, its_sampler.organization_id, payload))
    try:
        outcomes = _sample_batch(store, load_base(base_model), key, [request.payload for request in claimed])
    except Exception as exc:  # the batch itself failed (loading the base or the adapter, decoding)
        outcomes = [_failure(exc, "sample batch of " + future_id)] * len(claimed)
    batch = {"id": new_id("smpb"), "requests": len(claimed)}
    for request, outcome in zip(claimed, outcomes, strict=True):
        if outcome[0] == "ok":
            outcome = ("ok", {**outcome[1], "batch": batch})
        try:
            _record_sample(settings, store, request, base_model, outcome)
        except Exception as exc:  # the result could not be stored: the client must hear of it all the same
            log.exception("could not record sample request %s", request.future_id)
            _record_sample(settings, store, request, base_model, ("server", f"{exc}"))
    return outcomes[0][0]


def _claim_future(session: Session, future_id: str, worker_id: str) -> bool:
    """Take a pending future for this worker; False if another took it first."""
    claimed: int = rowcount(
        session.execute(
            update(Future)
            .where(Future.id == future_id, Future.status == "pending")
            .values(status="running", worker_id=worker_id)
            .execution_options(synchronize_session=False)
        )
    )
    return bool(claimed)


def _pending_samples_of(
    session: Session, base_model: str, key: str | None, *, exclude: str
) -> list[tuple[Future, TrainingSession]]:
    """The oldest pending sample requests (and their samplers) of active samplers with the same
    adapter (`key`, None: the base itself) on `base_model`, besides `exclude`: what may join its batch."""
    rows = session.execute(
        select(Future, TrainingSession)
        .join(TrainingSession, TrainingSession.id == Future.session_id)
        .where(
            Future.operation == "sample",
            Future.status == "pending",
            Future.id != exclude,
            TrainingSession.kind == "sampling",
            TrainingSession.status == "active",
            TrainingSession.base_model == base_model,
            TrainingSession.adapter_object_key.is_(None) if key is None else TrainingSession.adapter_object_key == key,
        )
        .order_by(Future.created_at)
        .limit(SAMPLE_BATCH_CAP - 1)
    ).all()
    return [(future, sampler) for future, sampler in rows]


def _failure(exc: Exception, what: str) -> tuple[str, Any]:
    """An error as a future records it: the client's own mistake, or the server's."""
    if isinstance(exc, MintError):
        return ("user", exc.message)
    log.error("%s failed", what, exc_info=exc)
    return ("server", f"{type(exc).__name__}: {exc}")


def _record_sample(
    settings: Settings, store: ObjectStore, request: _ClaimedSample, base_model: str, outcome: tuple[str, Any]
) -> None:
    with session_scope(settings.database) as session:
        future = session.get(Future, request.future_id)
        if future is None or future.status != "running":
            return
        kind, value = outcome
        if kind != "ok":
            fail_future(future, kind, value)
            return
        set_result(store, future, value)
        record_usage(
            session,
            organization_id=request.organization_id,
            kind="sampled",
            tokens=sum(len(sequence["tokens"]) for sequence in value["sequences"]),
            base_model=base_model,
            model_ref=future.model_id or base_model,
            resource_type="tinker_sampler",
            resource_id=future.model_id,
        )


def _sample_batch(
    store: ObjectStore, resident: ResidentBase, key: str | None, payloads: list[dict[str, Any]]
) -> list[tuple[str, Any]]:
    """Each request's outcome, in order: its result, or why it failed. Every request is checked
    first, so that one the base cannot run (a prompt too long) fails alone; the others decode
    together in one `sample_batch`."""
    export_tokenizer(store, resident)
    adapter = sampler_adapter(store, resident, key) if key else None
    outcomes: dict[int, tuple[str, Any]] = {}
    runnable: list[tuple[int, SampleRequest]] = []
    for index, payload in enumerate(payloads):
        request = SampleRequest(
            payload["prompt"],
            SamplingParams.model_validate(payload["params"]),
            int(payload["num_samples"]),
            top_logprobs=int(payload.get("topk_sample_logprobs") or 0),
        )
        try:
            resident.check_sample_request(request)
        except MintError as exc:
            outcomes[index] = ("user", exc.message)
            continue
        runnable.append((index, request))
    batch = resident.sample_batch(adapter, [request for _, request in runnable])
    for (index, _), sequences in zip(runnable, batch, strict=True):
        try:
            outcomes[index] = ("ok", _sample_result(resident, adapter, payloads[index], sequences))
        except Exception as exc:  # its prompt logprobs could not be computed: this request fails alone
            outcomes[index] = _failure(exc, "sample request")
    return [outcomes[index] for index in range(len(payloads))]


def _sample_result(
    resident: ResidentBase, adapter: str | None, payload: dict[str, Any], sequences: list[SampledSequence]
) -> dict[str, Any]:
    """A sample request's stored result: its sequences (with their top-k logprobs if it asked),
    and what it asked about its prompt: logprobs, top-k logprobs, target logprobs. Prompt lists
    have one entry per prompt token, None at position 0 (and before the last N with
    `prompt_logprobs_last_n`)."""
    prompt: list[int] = payload["prompt"]
    targets = payload.get("target_prompt_logprobs")
    top_k = int(payload.get("topk_prompt_logprobs") or 0)
    result: dict[str, Any] = {}
    if payload["prompt_logprobs"] or top_k or targets:
        query = PromptQuery(
            prompt, logprobs=bool(payload["prompt_logprobs"]), top_k=top_k, targets=targets and targets["rows"]
        )
        scores = resident.score_prompt(adapter, query)
        last_n = payload.get("prompt_logprobs_last_n")
        skipped = len(prompt) - last_n if last_n else 1  # leading positions with no score

        def per_token(values: list[Any]) -> list[Any]:
            return [None] * skipped + values[skipped - 1 :]

        if scores.logprobs is not None:
            result["prompt_logprobs"] = per_token(scores.logprobs)
        if scores.top is not None:
            result["topk_prompt_logprobs"] = per_token(scores.top)
        if scores.targets is not None and targets is not None:
            result["target_prompt_logprobs"] = {**targets, "rows": scores.targets}
    # With record_stability_info the result keeps each token's logprob under the distribution
    # it was drawn from: the stability info that stable_reinforce reads, by sequence id, from
    # this stored result (mint.services.tinker.provenance). The client never receives it.
    record = {"sampler_logprobs"} if payload.get("record_stability_info") else set()
    if payload.get("topk_sample_logprobs"):
        record.add("top_logprobs")
    return {
        "sequences": [
            sequence.model_dump(mode="json", include={"tokens", "logprobs", "stop_reason", *record})
            for sequence in sequences
        ],
        "prompt_logprobs": result.pop("prompt_logprobs", None),
        # Prompt tokens read from the prompt cache (the same for each of the request's samples).
        "prompt_cache_hit_tokens": sequences[0].prompt_cache_hit_tokens if sequences else 0,
        **result,
    }

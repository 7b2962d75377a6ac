"""Tinker compatibility, the worker half: running a model's requests and sampling, on the
process that keeps the base resident.

A model (`mint.services.tinker.sessions`) lives in ONE worker process's memory: that process claims it
when it runs its creation, keeps its LoRA session (weights and optimizer state) in
`_resident`, and runs its requests strictly in `seq_id` order (`run_model_requests`), each
through the closed registry `_OPERATIONS` of the Tinker primitives. Samplers run on any
worker of their base (`run_sample`), which decodes a request together with the other pending
requests of the same sampler adapter in one batch; each worker keeps a few sampler adapters
loaded (least recently used out), fetched from the object store by hash. Models whose session
finished or expired (`mint.services.tinker.sessions.expire_idle_sessions`, a periodic sweep) are
released by a message to their process, and again by the process itself before it takes a
new LoRA session (`release_idle_models`), in case that message was lost.

The trainer is imported only through `ResidentBase` and inside functions, so importing this
module imports no torch; only worker processes import it (`mint.worker.tinker_tasks`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import Conflict, InvalidRequest, MintError
from mint.schemas import tinker as wire
from mint.services.billing.usage import record_usage
from mint.services.models import adapters
from mint.services.tinker.sessions import (
    adapter_name_of,
    expire_session,
    fail_future,
    fail_waiting,
    future_at,
    get_payload,
    sampler_id_of,
    set_result,
)
from mint.storage.archives import pack_folder, unpack_folder
from mint.storage.db import session_scope
from mint.storage.keys import EXTERNAL_FILES, PEFT_FILES, external_file_key, external_prefix, tokenizer_key
from mint.storage.objects import ObjectStore, object_store_for
from mint.storage.queries import rowcount
from mint.storage.tables import Future, TinkerCheckpoint, TinkerSession, TrainingSession, as_utc, new_id, utcnow
from mint.trainer.prompt_scores import PromptQuery
from mint.trainer.types import AdamParams, Datum, LoraOptions, SampledSequence, SampleRequest, SamplingParams

if TYPE_CHECKING:
    from mint.trainer.session import ResidentBase
    from mint.trainer.training_session import TrainingSession as LoraSession

log = logging.getLogger(__name__)

# After running a model's requests, its worker watches for the next one this long: a client
# usually sends it within a fraction of a second of reading a result, and taking it from the
# database saves a trip through the broker (up to a second on the embedded broker, which polls).
LINGER_S = 0.5
LINGER_POLL_S = 0.02
# Sampler adapters each worker keeps loaded, per base.
SAMPLER_CACHE_SIZE = 8
# Sample requests of one sampler adapter a worker decodes as one batch at most: the one its
# message names and the oldest others pending.
SAMPLE_BATCH_CAP = 16

LoadBase = Callable[[str], "ResidentBase"]


@dataclass(frozen=True)
class WorkerIdentity:
    """The process running a task: its id (`<node>/<pid>`) and whether it consumes its own
    queue (only then can it hold models)."""

    worker_id: str
    reachable: bool


class _Resident:
    """What this worker process holds for Tinker: models by id, sampler adapters by archive."""

    def __init__(self) -> None:
        self.models: dict[str, LoraSession] = {}
        self.samplers: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.tokenizers: set[str] = set()


_resident = _Resident()


def _peft_name(prefix: str, key: str) -> str:
    # peft adapter names become parameter-name segments: letters and digits only, never "lora".
    return prefix + hashlib.sha256(key.encode()).hexdigest()[:24]


def release_model(model_id: str) -> bool:
    """Free a model's adapter and optimizer state in this process; False if it held none."""
    training = _resident.models.pop(model_id, None)
    if training is None:
        return False
    if not training.closed:
        training.base.close(training.session_id)
    return True


def _export_tokenizer(store: ObjectStore, resident: ResidentBase) -> None:
    name = resident.spec.name
    if name in _resident.tokenizers:
        return
    if not store.exists(tokenizer_key(name)):
        with tempfile.TemporaryDirectory(prefix="mint-tokenizer-") as scratch:
            resident.tokenizer.save_pretrained(scratch)
            store.put_bytes(tokenizer_key(name), pack_folder(Path(scratch)))
    _resident.tokenizers.add(name)


def release_idle_models(settings: Settings) -> int:
    """Free this process's models whose session finished, expired, or went silent for
    `tinker_session_idle_s` (expiring it here if the periodic sweep has not yet); returns how
    many. Every process runs it before it takes a new LoRA session (a Tinker model, a job, an
    eval adapter), so a release message that never arrived cannot keep a slot taken."""
    if not _resident.models:
        return 0
    cutoff = utcnow() - timedelta(seconds=settings.tinker_session_idle_s)
    released = 0
    with session_scope(settings.database) as session:
        rows = session.execute(
            select(TrainingSession, TinkerSession)
            .join(TinkerSession, TinkerSession.id == TrainingSession.tinker_session_id)
            .where(TrainingSession.id.in_(list(_resident.models)))
        ).all()
        found = {row.id for row, _ in rows}
        for row, owner in rows:
            silent = owner.last_heartbeat_at is None or as_utc(owner.last_heartbeat_at) < cutoff
            if owner.status == "active" and silent:
                expire_session(session, owner, settings.tinker_session_idle_s)
            if row.status != "active" or owner.status != "active":
                row.status = "closed"
                fail_waiting(session, row.id, f"model {row.id} was released: its session ended or expired")
                released += release_model(row.id)
        for model_id in set(_resident.models) - found:
            released += release_model(model_id)
    return released


def release(settings: Settings, model_id: str) -> int:
    """A release message: free `model_id` here, and with it any other model of this process
    whose session ended (so one message that arrives makes up for one that was lost)."""
    return release_model(model_id) + release_idle_models(settings)


@dataclass
class _Step:
    """One claimed request of a model."""

    future_id: str
    operation: str
    seq_id: int
    payload: dict[str, Any]


@dataclass
class _ModelContext:
    """What an operation on a model knows: where it runs, whose model it is, and its seq_id."""

    settings: Settings
    store: ObjectStore
    load_base: LoadBase
    model_id: str
    organization_id: str
    base_model: str
    tinker_session_id: str | None
    seq_id: int

    def training(self) -> LoraSession:
        training = _resident.models.get(self.model_id)
        if training is None or training.closed:
            raise InvalidRequest(
                f"model {self.model_id} is not resident on this worker any more (released when its session "
                "ended or went silent); create it again from a checkpoint",
                param="model_id",
            )
        return training


def run_model_requests(settings: Settings, model_id: str, me: WorkerIdentity, load_base: LoadBase) -> str:
    """Run a model's waiting requests in seq_id order, claiming the model if nobody holds it;
    stops at the first missing seq_id. Returns what happened (for logs and tests)."""
    with session_scope(settings.database) as session:
        row = session.get(TrainingSession, model_id)
        if row is None or row.kind != "training":
            return "missing"
        if row.status != "active":
            fail_waiting(session, model_id, f"model {model_id} is closed")
            release_model(model_id)
            return "closed"
        if row.worker_id is None:
            if not me.reachable:
                fail_waiting(
                    session,
                    model_id,
                    f"worker {me.worker_id} does not consume a queue of its own, so it cannot hold Tinker models; "
                    "start training workers with `mint worker --base NAME` (not `--queues`)",
                    category="server",
                )
                return "unreachable"
            claimed = rowcount(
                session.execute(
                    update(TrainingSession)
                    .where(TrainingSession.id == model_id, TrainingSession.worker_id.is_(None))
                    .values(worker_id=me.worker_id)
                    .execution_options(synchronize_session=False)
                )
            )
            if not claimed:
                return "taken"
        elif row.worker_id != me.worker_id:
            return "not-mine"
        organization_id, base_model, tinker_session_id = row.organization_id, row.base_model, row.tinker_session_id
    store = object_store_for(settings)
    ran, linger_until = 0, 0.0
    while True:
        step = _next_step(settings, store, model_id, me.worker_id)
        if step is None:
            if time.monotonic() >= linger_until:
                break
            time.sleep(LINGER_POLL_S)
            continue
        ctx = _ModelContext(
            settings, store, load_base, model_id, organization_id, base_model, tinker_session_id, seq_id=step.seq_id
        )
        try:
            result = _OPERATIONS[step.operation](ctx, step.payload)
            outcome: tuple[str, Any] = ("ok", result)
        except MintError as exc:
            outcome = ("user", exc.message)
        except Exception as exc:
            log.exception("request %s (%s) of model %s failed", step.future_id, step.operation, model_id)
            outcome = ("server", f"{type(exc).__name__}: {exc}")
        _record_or_fail(settings, store, model_id, step, outcome)
        ran += 1
        linger_until = time.monotonic() + LINGER_S
    return f"ran {ran}"


def _next_step(settings: Settings, store: ObjectStore, model_id: str, worker_id: str) -> _Step | None:
    """Claim the model's request at its next seq_id, skipping ones already settled."""
    with session_scope(settings.database) as session:
        row = session.get(TrainingSession, model_id)
        if row is None or row.status != "active":
            if row is not None:
                fail_waiting(session, model_id, f"model {model_id} is closed")
            release_model(model_id)
            return None
        while True:
            future = future_at(session, model_id, row.next_seq_id)
            if future is None:
                return None
            if future.status == "pending":
                break
            if future.status == "running":  # an earlier attempt in this process stopped half way
                fail_future(future, "server", "the request was interrupted; send it again")
            row.next_seq_id += 1
        future.status, future.worker_id = "running", worker_id
        payload = get_payload(store, future.request, future.request_object_key)
        return _Step(future.id, future.operation, int(future.seq_id or 0), payload)


def _record_or_fail(
    settings: Settings, store: ObjectStore, model_id: str, step: _Step, outcome: tuple[str, Any]
) -> None:
    try:
        _record(settings, store, model_id, step, outcome)
    except Exception as exc:  # the result could not be stored: the client must hear of it all the same
        log.exception("could not record request %s of model %s", step.future_id, model_id)
        _record(settings, store, model_id, step, ("server", f"its result could not be stored: {exc}"))


def _record(settings: Settings, store: ObjectStore, model_id: str, step: _Step, outcome: tuple[str, Any]) -> None:
    with session_scope(settings.database) as session:
        future = session.get(Future, step.future_id)
        row = session.get(TrainingSession, model_id)
        assert future is not None and row is not None
        if future.status == "running":
            kind, value = outcome
            if kind == "ok":
                set_result(store, future, value)
            else:
                fail_future(future, kind, value)
        row.next_seq_id = max(row.next_seq_id, step.seq_id + 1)


# ---- the operations, by name (a closed registry) ---------------------------------------------


def _create_model(ctx: _ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
    release_idle_models(ctx.settings)
    resident = ctx.load_base(ctx.base_model)
    _export_tokenizer(ctx.store, resident)
    release_model(ctx.model_id)  # left by an attempt that failed half way in this process
    options = LoraOptions.model_validate(payload["lora"])
    _resident.models[ctx.model_id] = resident.create_session(options, session_id=_peft_name("m", ctx.model_id))
    return {"model_id": ctx.model_id, "type": "create_model"}


def _fetch_checkpoint(ctx: _ModelContext, load: dict[str, Any], scratch: Path) -> Path:
    data = ctx.store.get_bytes(load["object_key"])
    if load["kind"] == "sampler":
        return adapters.extract_adapter(data, scratch)
    return unpack_folder(data, scratch)


def _load_into(training: LoraSession, folder: Path, load: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    from mint.trainer import checkpoint

    if load["kind"] == "sampler":
        training.load_adapter_weights(load_file(folder / checkpoint.SAMPLER_FILES[1]), source=load["path"])
    elif load["optimizer"]:
        training.load_state(folder)
    else:
        training.load_adapter_weights(checkpoint.read_state(folder).adapter, source=load["path"])


def _load_weights(ctx: _ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Into this model (a later request), or as the model's creation (seq_id 0)."""
    load = payload.get("load", payload)
    with tempfile.TemporaryDirectory(prefix="mint-tinker-load-") as scratch:
        folder = _fetch_checkpoint(ctx, load, Path(scratch))
        if ctx.seq_id == 0:
            _create_model(ctx, payload)
        _load_into(ctx.training(), folder, load)
    return {"path": load["path"], "model_id": ctx.model_id, "type": "load_weights"}


def _forward_backward(ctx: _ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
    training = ctx.training()
    data = [Datum.model_validate(item) for item in payload["data"]]
    loss_fn, config = payload["loss_fn"], payload["loss_fn_config"] or None
    if payload["forward_only"]:
        output = training.forward(data, loss_fn, config)
    else:
        output = training.forward_backward(data, loss_fn, config)
        with session_scope(ctx.settings.database) as session:
            record_usage(
                session,
                organization_id=ctx.organization_id,
                kind="trained",
                tokens=sum(datum.length for datum in data),
                base_model=ctx.base_model,
                model_ref=ctx.model_id,
                resource_type="tinker_model",
                resource_id=ctx.model_id,
            )
    return {"logprobs": output.logprobs, "metrics": output.metrics}


def _optim_step(ctx: _ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
    metrics = ctx.training().optim_step(AdamParams.model_validate(payload["adam"]))
    return {"metrics": metrics}


def _expires(ttl_seconds: int | None) -> datetime | None:
    return utcnow() + timedelta(seconds=ttl_seconds) if ttl_seconds else None


def _save_weights(ctx: _ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
    training = ctx.training()
    name = payload["name"] or f"{ctx.seq_id:06d}"
    with session_scope(ctx.settings.database) as session:
        existing = _checkpoint_named(session, ctx.model_id, "training", name)
        if existing is not None and not payload["overwrite"]:
            raise Conflict(
                f"model {ctx.model_id} already has a saved state named {name!r}; pass overwrite=True or another name",
                param="path",
            )
        checkpoint_id = existing.id if existing is not None else new_id("tkc")
    with tempfile.TemporaryDirectory(prefix="mint-tinker-state-") as scratch:
        training.save_state(Path(scratch))
        data = pack_folder(Path(scratch))
    key = f"tinker/checkpoints/{checkpoint_id}.tar"
    info = ctx.store.put_bytes(key, data)
    with session_scope(ctx.settings.database) as session:
        _upsert_checkpoint(
            session, ctx, checkpoint_id, "training", name, key, info.sha256, info.size_bytes, None, payload
        )
    return {"path": str(wire.TinkerPath(ctx.model_id, "training", name)), "type": "save_weights"}


def _checkpoint_named(session: Session, model_id: str, kind: str, name: str) -> TinkerCheckpoint | None:
    return session.execute(
        select(TinkerCheckpoint).where(
            TinkerCheckpoint.model_id == model_id, TinkerCheckpoint.kind == kind, TinkerCheckpoint.name == name
        )
    ).scalar_one_or_none()


def _upsert_checkpoint(
    session: Session,
    ctx: _ModelContext,
    checkpoint_id: str,
    kind: str,
    name: str,
    key: str,
    sha256: str,
    size_bytes: int,
    adapter_version_id: str | None,
    payload: dict[str, Any],
) -> None:
    row = session.get(TinkerCheckpoint, checkpoint_id) or _checkpoint_named(session, ctx.model_id, kind, name)
    if row is None:
        row = TinkerCheckpoint(id=checkpoint_id, organization_id=ctx.organization_id, model_id=ctx.model_id)
        session.add(row)
    row.kind, row.name, row.object_key, row.sha256, row.size_bytes = kind, name, key, sha256, size_bytes
    row.adapter_version_id = adapter_version_id
    row.user_metadata = payload.get("user_metadata") or {}
    row.expires_at = _expires(payload.get("ttl_seconds"))
    row.created_at = utcnow()


def _save_weights_for_sampler(ctx: _ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
    training = ctx.training()
    with tempfile.TemporaryDirectory(prefix="mint-tinker-sampler-") as scratch:
        folder = Path(scratch)
        training.save_weights_for_sampler(folder)
        archive = adapters.archive_adapter(folder)
        if payload["name"] is None:
            return _snapshot(ctx, training, folder, archive, int(payload["sampling_session_seq_id"]))
        config = json.loads((folder / PEFT_FILES[0]).read_text(encoding="utf-8"))
    name = payload["name"]
    path = wire.TinkerPath(ctx.model_id, "sampler", name)
    with session_scope(ctx.settings.database) as session:
        version = adapters.register_version(
            session,
            ctx.store,
            organization_id=ctx.organization_id,
            name=adapter_name_of(ctx.model_id),
            base_model=ctx.base_model,
            archive=archive,
            lora={
                "rank": config["r"],
                "alpha": config["lora_alpha"],
                "targets": [*(config.get("target_modules") or []), *(config.get("target_parameters") or [])],
            },
            metrics={"tinker_path": str(path), "optimizer_steps": training.step},
        )
        existing = _checkpoint_named(session, ctx.model_id, "sampler", name)
        _upsert_checkpoint(
            session,
            ctx,
            existing.id if existing else new_id("tkc"),
            "sampler",
            name,
            version.object_key,
            version.sha256,
            version.size_bytes,
            version.id,
            payload,
        )
    return {"path": str(path), "type": "save_weights_for_sampler"}


def _save_weights_external(ctx: _ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
    """The LoRA weights as PEFT files, one object each, for signed download; a same-named export is replaced."""
    training = ctx.training()
    name = payload["name"]
    with session_scope(ctx.settings.database) as session:
        existing = _checkpoint_named(session, ctx.model_id, "external", name)
        checkpoint_id = existing.id if existing is not None else new_id("tkc")
    prefix = external_prefix(checkpoint_id)
    with tempfile.TemporaryDirectory(prefix="mint-tinker-external-") as scratch:
        folder = Path(scratch)
        training.save_weights_for_sampler(folder)
        infos = [
            ctx.store.put_bytes(external_file_key(prefix, file), (folder / file).read_bytes())
            for file in EXTERNAL_FILES
        ]
    size_bytes = sum(info.size_bytes for info in infos)
    with session_scope(ctx.settings.database) as session:
        # The row's digest is the weights file's: what a downloader can check its copy against.
        _upsert_checkpoint(
            session, ctx, checkpoint_id, "external", name, prefix, infos[-1].sha256, size_bytes, None, payload
        )
    path = wire.TinkerPath(ctx.model_id, "external", name)
    return {"path": str(path), "size_bytes": size_bytes, "type": "save_weights_external"}


def _snapshot(ctx: _ModelContext, training: LoraSession, folder: Path, archive: bytes, seq: int) -> dict[str, Any]:
    """Save-and-sample: the weights as they are now, for a new sampler of the same session."""
    if ctx.tinker_session_id is None:
        raise InvalidRequest("this model belongs to no Tinker session, so it cannot make samplers", param="model_id")
    key = f"tinker/snapshots/{hashlib.sha256(archive).hexdigest()}.tar"
    if not ctx.store.exists(key):
        ctx.store.put_bytes(key, archive)
    # This worker will likely serve the sampler: load it now, from the folder at hand.
    _sampler_adapter(ctx.store, training.base, key, folder)
    sampler_id = sampler_id_of(ctx.tinker_session_id, seq)
    with session_scope(ctx.settings.database) as session:
        if session.get(TrainingSession, sampler_id) is None:
            session.add(
                TrainingSession(
                    id=sampler_id,
                    organization_id=ctx.organization_id,
                    base_model=ctx.base_model,
                    kind="sampling",
                    lora={},
                    tags={},
                    tinker_session_id=ctx.tinker_session_id,
                    adapter_object_key=key,
                )
            )
    return {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}


_OPERATIONS: dict[str, Callable[[_ModelContext, dict[str, Any]], dict[str, Any]]] = {
    "create_model": _create_model,
    "load_weights": _load_weights,
    "forward_backward": _forward_backward,
    "optim_step": _optim_step,
    "save_weights": _save_weights,
    "save_weights_for_sampler": _save_weights_for_sampler,
    "save_weights_external": _save_weights_external,
}


# ---- sampling on the worker ------------------------------------------------------------------


def _sampler_adapter(store: ObjectStore, resident: ResidentBase, key: str, folder: Path | None = None) -> str:
    """The session name of the sampler adapter stored at `key`, loaded if needed (from
    `folder` when given, else from the object store); the least recently used goes first."""
    cache_key = (resident.spec.name, key)
    name = _resident.samplers.get(cache_key)
    if name is not None and name in {s.session_id for s in resident.sessions}:
        _resident.samplers.move_to_end(cache_key)
        return name
    name = _peft_name("s", key)
    if folder is not None:
        resident.create_session_from_adapter(folder, session_id=name)
    else:
        with tempfile.TemporaryDirectory(prefix="mint-tinker-sampler-") as scratch:
            adapters.extract_adapter(store.get_bytes(key), Path(scratch))
            resident.create_session_from_adapter(Path(scratch), session_id=name)
    _resident.samplers[cache_key] = name
    while sum(1 for base, _ in _resident.samplers if base == resident.spec.name) > SAMPLER_CACHE_SIZE:
        oldest = next(k for k in _resident.samplers if k[0] == resident.spec.name)
        resident.close(_resident.samplers.pop(oldest))
    return name


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
    _export_tokenizer(store, resident)
    adapter = _sampler_adapter(store, resident, key) if key else None
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
        **result,
    }

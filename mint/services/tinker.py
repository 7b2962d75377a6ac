"""Tinker compatibility: the use cases behind `/api/v1/...`, and their execution on the worker.

The official `tinker` SDK speaks of sessions, models, samplers and futures. In Mint:

- A **Tinker session** (`create_session`, one per `ServiceClient`) is a `tinker_sessions` row:
  its organization, heartbeat and finish reason.
- A **model** (a `TrainingClient`, id `<session>:train:<n>`) and a **sampler** (a
  `SamplingClient`, id `<session>:sample:<n>`) are `training_sessions` rows. A model is a
  LoRA session (`mint.trainer.session.TrainingSession`) on the resident base of ONE worker
  process: the first worker of the base's queue (`train.<base>`) to run its creation claims
  it (`worker_id`), and every later request goes to that process's own queue. If that
  process dies, the model is lost: its pending futures fail and say which checkpoint to
  restore from.
- Every long call is a **future** (`futures` row), answered at once with its id; the worker
  moves it `pending -> running -> succeeded | failed`, and `retrieve_future` long-polls the
  row. A model's requests carry `seq_id`s (creation is 0, then 1, 2, ...); the worker applies
  them strictly in that order (`training_sessions.next_seq_id`), so requests that arrive
  early wait for the missing one. The queue message only says "run model X's next
  requests"; the rows say which.
- **Checkpoints**: `save_state` stores the training state in the object store as a
  `tinker_checkpoints` row (`tinker://<model>/weights/<name>`); `save_weights_for_sampler`
  with a name also registers an adapter version (adapter `tinker-<model>`), so the weights
  appear in `/v1/adapters` and can be evaluated and deployed. Save-and-sample snapshots are
  stored by content hash and loaded by samplers, not registered.
- **Samplers** run on any worker of their base (`train.<base>`): each worker keeps a few
  sampler adapters loaded (least recently used out), fetched from the object store by hash.
- **Tokenizers** travel with no hub: the first worker of a base to serve a Tinker model saves
  the base's tokenizer (`save_pretrained`) as `tokenizers/<base>.tar` in the object store; the
  API unpacks it under `MINT_HOME/tokenizers/<base>/` and answers that folder as the model's
  `tokenizer_id`, which the client's `AutoTokenizer.from_pretrained` loads offline. A client
  on another machine downloads the archive from `GET /api/v1/tokenizers/<base>` and unpacks it
  into a folder named after the base in its working directory, where loading the tokenizer by
  the base's name (tinker-cookbook, `SamplingClient.get_tokenizer`) finds it.

The API half never imports torch; the worker half imports the trainer inside functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import secrets
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pydantic import ValidationError
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import Conflict, InvalidRequest, MintError, NotFound
from mint.schemas import tinker as wire
from mint.services import adapters
from mint.services.usage import record_usage
from mint.services.workers import STALE_AFTER_S
from mint.storage.archives import pack_folder, unpack_folder
from mint.storage.db import session_scope
from mint.storage.objects import ObjectStore, object_store_for
from mint.storage.queries import get_owned
from mint.storage.tables import (
    BaseModelRow,
    Future,
    TinkerCheckpoint,
    TinkerSession,
    TrainingSession,
    Worker,
    as_utc,
    new_id,
    utcnow,
)
from mint.trainer.types import AdamParams, Datum, LoraOptions, SamplingParams

if TYPE_CHECKING:
    from mint.trainer.session import ResidentBase
    from mint.trainer.session import TrainingSession as LoraSession

log = logging.getLogger(__name__)

RUN_MODEL_TASK = "mint.tinker.run_model"
SAMPLE_TASK = "mint.tinker.sample"
RELEASE_TASK = "mint.tinker.release"

# retrieve_future holds a pending request this long (the SDK gives up at 45 s).
LONG_POLL_S = 25.0
# While it waits, it looks at the model's worker this often, and sends the model's message
# again when a future has waited this long (a message lost with a broker restart).
INSPECT_EVERY_S = 10.0
RESEND_AFTER_S = 30.0
# Requests and results up to this size live in the row; larger ones in the object store.
INLINE_PAYLOAD_BYTES = 64 * 1024
# A Tinker session that has not sent a heartbeat (the SDK sends one every 10 s) for this long
# is over: its models are released from their worker when that worker next creates a model.
SESSION_IDLE_S = 600.0
# After running a model's requests, its worker watches for the next one this long: a client
# usually sends it within a fraction of a second of reading a result, and taking it from the
# database saves a trip through the broker (up to a second on the embedded broker, which polls).
LINGER_S = 0.5
LINGER_POLL_S = 0.02
# Sampler adapters each worker keeps loaded, per base.
SAMPLER_CACHE_SIZE = 8
MAX_SAMPLES = 256
TERMINAL = ("succeeded", "failed", "cancelled")
WAITING = ("pending", "running")
PROTOBUF_OPERATIONS = frozenset({"forward_backward", "sample"})

LoadBase = Callable[[str], "ResidentBase"]


class WorkerRef(NamedTuple):
    """Where a live worker process is: its host and pid name its own queue."""

    hostname: str
    pid: int


class Dispatch(Protocol):
    """Publishes a task with string arguments: to the workers of `base_model`, or to one `worker`."""

    def __call__(
        self, task: str, *, args: list[str], base_model: str | None = None, worker: WorkerRef | None = None
    ) -> None: ...


def model_id_of(session_id: str, seq: int) -> str:
    return f"{session_id}:train:{seq}"


def sampler_id_of(session_id: str, seq: int) -> str:
    return f"{session_id}:sample:{seq}"


def adapter_name_of(model_id: str) -> str:
    """The adapter whose versions are a model's named sampler saves."""
    return "tinker-" + model_id.replace(":", "-")


def tokenizer_key(base_model: str) -> str:
    return f"tokenizers/{base_model}.tar"


def _str_dict(values: dict[str, Any] | None) -> dict[str, str]:
    """User metadata as Tinker keeps it: strings to strings (NUL removed; PostgreSQL refuses it)."""
    return {str(key).replace("\x00", ""): str(value).replace("\x00", "") for key, value in (values or {}).items()}


# ---- payloads: small in the row, large in the object store --------------------------------


def _put_payload(store: ObjectStore, key: str, payload: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    encoded = json.dumps(payload, separators=(",", ":"), allow_nan=True)
    # NaN and infinities (a diverged loss) are not JSON to PostgreSQL: those go to the store too.
    if len(encoded) <= INLINE_PAYLOAD_BYTES and "NaN" not in encoded and "Infinity" not in encoded:
        return payload, None
    store.put_bytes(key, encoded.encode())
    return None, key


def _get_payload(store: ObjectStore, inline: dict[str, Any] | None, key: str | None) -> dict[str, Any]:
    if key is not None:
        loaded: dict[str, Any] = json.loads(store.get_bytes(key))
        return loaded
    return dict(inline or {})


def _set_request(store: ObjectStore, future: Future, payload: dict[str, Any]) -> None:
    future.request, future.request_object_key = _put_payload(store, f"tinker/requests/{future.id}.json", payload)


def _set_result(store: ObjectStore, future: Future, result: dict[str, Any]) -> None:
    future.result, future.result_object_key = _put_payload(store, f"tinker/results/{future.id}.json", result)
    future.status, future.finished_at = "succeeded", utcnow()


def _fail(future: Future, category: str, message: str) -> None:
    future.status, future.error, future.error_category, future.finished_at = "failed", message, category, utcnow()


def _fail_waiting(session: Session, model_id: str, message: str, category: str = "user") -> int:
    """Fail every pending or running future of a model or sampler."""
    futures = session.execute(select(Future).where(Future.model_id == model_id, Future.status.in_(WAITING))).scalars()
    count = 0
    for future in futures:
        _fail(future, category, message)
        count += 1
    return count


# ---- sessions -------------------------------------------------------------------------------


def create_session(session: Session, organization_id: str, body: wire.CreateSessionRequest) -> TinkerSession:
    row = TinkerSession(
        id=f"tks_{secrets.token_hex(8)}",
        organization_id=organization_id,
        tags=sorted(set(body.tags)),
        user_metadata=_str_dict(body.user_metadata),
        display_name=body.display_name,
        sdk_version=body.sdk_version,
        last_heartbeat_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row


def get_tinker_session(session: Session, organization_id: str, session_id: str) -> TinkerSession:
    return get_owned(session, TinkerSession, session_id, organization_id=organization_id, noun="session")


def _active_session(session: Session, organization_id: str, session_id: str) -> TinkerSession:
    row = get_tinker_session(session, organization_id, session_id)
    if row.status != "active":
        raise InvalidRequest(
            f"session {session_id} is finished; create a new ServiceClient to start another", param="session_id"
        )
    return row


def heartbeat(session: Session, organization_id: str, session_id: str) -> bool:
    """Record a heartbeat; False once the session is finished (the SDK then stops sending them)."""
    row = get_tinker_session(session, organization_id, session_id)
    if row.status != "active":
        return False
    row.last_heartbeat_at = utcnow()
    return True


def finish_session(
    session: Session, organization_id: str, session_id: str, body: wire.FinishSessionRequest, send: Dispatch
) -> None:
    """Mark the session finished (the first reason wins), close its models and samplers, and
    ask their workers to free the models' memory."""
    row = get_tinker_session(session, organization_id, session_id)
    if row.status != "active":
        return
    row.status, row.finished_at = "finished", utcnow()
    row.finish_reason, row.finish_detail = body.reason.type, body.detail
    members = session.execute(
        select(TrainingSession).where(TrainingSession.tinker_session_id == row.id, TrainingSession.status == "active")
    ).scalars()
    holders: list[tuple[str, str]] = []
    for member in members:
        member.status = "closed"
        _fail_waiting(session, member.id, f"session {row.id} was finished before this request ran")
        if member.kind == "training" and member.worker_id:
            holders.append((member.id, member.worker_id))
    session.commit()
    for model_id, worker_id in holders:
        ref = live_worker(session, worker_id)
        if ref is not None:
            _send_quietly(send, RELEASE_TASK, [model_id], worker=ref)


def session_view(session: Session, organization_id: str, session_id: str) -> wire.GetSessionResponse:
    row = get_tinker_session(session, organization_id, session_id)
    members = list(
        session.execute(
            select(TrainingSession.id, TrainingSession.kind)
            .where(TrainingSession.tinker_session_id == row.id)
            .order_by(TrainingSession.created_at)
        )
    )
    return wire.GetSessionResponse(
        training_run_ids=[ident for ident, kind in members if kind == "training"],
        sampler_ids=[ident for ident, kind in members if kind == "sampling"],
        user_metadata=_str_dict(row.user_metadata) or None,
        display_name=row.display_name,
    )


def list_sessions(session: Session, organization_id: str, *, limit: int, offset: int) -> list[str]:
    query = (
        select(TinkerSession.id)
        .where(TinkerSession.organization_id == organization_id)
        .order_by(TinkerSession.created_at.desc(), TinkerSession.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return list(session.execute(query).scalars())


def server_capabilities(session: Session) -> wire.GetServerCapabilitiesResponse:
    rows = session.execute(select(BaseModelRow).where(BaseModelRow.enabled.is_(True)).order_by(BaseModelRow.name))
    return wire.GetServerCapabilitiesResponse(
        supported_models=[
            wire.SupportedModel(model_name=row.name, max_context_length=row.spec.get("context_length"))
            for row in rows.scalars()
        ]
    )


def _enabled_base(session: Session, name: str) -> BaseModelRow:
    row = session.get(BaseModelRow, name)
    if row is None or not row.enabled:
        known = session.execute(select(BaseModelRow.name).where(BaseModelRow.enabled.is_(True))).scalars()
        raise InvalidRequest(
            f"unknown or disabled base model {name!r}; this server trains: {', '.join(sorted(known))}",
            param="base_model",
        )
    return row


# ---- workers --------------------------------------------------------------------------------


def _live_workers(session: Session) -> list[Worker]:
    cutoff = utcnow() - timedelta(seconds=STALE_AFTER_S)
    return [w for w in session.execute(select(Worker)).scalars() if as_utc(w.last_seen_at) >= cutoff]


def live_worker(session: Session, worker_id: str) -> WorkerRef | None:
    """The live process `worker_id` names (`<node>/<pid>`), or None if it stopped or went silent."""
    node, _, pid = worker_id.rpartition("/")
    row = session.get(Worker, node)
    if row is None or str(row.pid) != pid:
        return None
    if as_utc(row.last_seen_at) < utcnow() - timedelta(seconds=STALE_AFTER_S):
        return None
    return WorkerRef(hostname=row.hostname, pid=row.pid)


def _base_is_served(session: Session, base_model: str) -> bool:
    queue = f"train.{base_model}"
    return any(queue in (w.queues or []) for w in _live_workers(session))


def _send_quietly(send: Dispatch, task: str, args: list[str], **where: Any) -> None:
    try:
        send(task, args=args, **where)
    except Exception:  # noqa: BLE001 - the row is committed; a waiting retrieve_future sends it again
        log.warning("could not send %s%s now; it is sent again while its future waits", task, args, exc_info=True)


def _dispatch_model(session: Session, row: TrainingSession, send: Dispatch) -> None:
    """Wake the worker that holds a model (or, before one claims it, the workers of its base)."""
    if row.worker_id is None:
        _send_quietly(send, RUN_MODEL_TASK, [row.id], base_model=row.base_model)
        return
    ref = live_worker(session, row.worker_id)
    if ref is None:
        _lose_model(session, row)
        session.commit()
        return
    _send_quietly(send, RUN_MODEL_TASK, [row.id], worker=ref)


def _lose_model(session: Session, row: TrainingSession) -> None:
    """The model's worker process is gone, and its weights with it: close it and say how to go on."""
    row.status = "closed"
    newest = session.execute(
        select(TinkerCheckpoint)
        .where(TinkerCheckpoint.model_id == row.id, TinkerCheckpoint.kind == "training")
        .order_by(TinkerCheckpoint.created_at.desc())
        .limit(1)
    ).scalar_one_or_none()
    hint = (
        f"restore it with ServiceClient.create_training_client_from_state_with_optimizer("
        f"'{wire.TinkerPath(row.id, 'training', newest.name)}')"
        if newest is not None
        else "it had no saved state (save_state), so start a new model"
    )
    _fail_waiting(
        session,
        row.id,
        f"the worker process that held model {row.id} ({row.worker_id}) stopped, and the model's weights "
        f"since its last save_state with it; {hint}",
        category="server",
    )


# ---- models: creation and requests ----------------------------------------------------------


def _lora_options(config: wire.LoraConfig) -> LoraOptions:
    try:
        return LoraOptions(
            rank=config.rank,
            seed=config.seed,
            train_attn=config.train_attn,
            train_mlp=config.train_mlp,
            # Tinker's train_mlp covers MoE layers too: Mint's routed experts follow it.
            train_experts=config.train_mlp,
            train_unembed=config.train_unembed,
        )
    except ValidationError as exc:
        raise InvalidRequest(f"lora_config: {exc.errors()[0]['msg']}", param="lora_config") from None


def _owned_model(session: Session, organization_id: str, model_id: str) -> TrainingSession:
    row = get_owned(session, TrainingSession, model_id, organization_id=organization_id, noun="model")
    if row.kind != "training":
        raise NotFound(f"No model with id {model_id!r} in this organization (it names a sampler).", param="model_id")
    return row


def _future_at(session: Session, model_id: str, seq_id: int) -> Future | None:
    return session.execute(
        select(Future).where(Future.model_id == model_id, Future.seq_id == seq_id)
    ).scalar_one_or_none()


def _new_future(row: TrainingSession, operation: str, seq_id: int | None) -> Future:
    return Future(
        id=new_id("fut"),
        organization_id=row.organization_id,
        session_id=row.id,
        model_id=row.id,
        seq_id=seq_id,
        operation=operation,
        status="pending",
    )


def _new_model(
    session: Session,
    settings: Settings,
    send: Dispatch,
    *,
    tinker_session: TinkerSession,
    model_seq_id: int,
    base_model: str,
    lora: dict[str, Any],
    user_metadata: dict[str, Any] | None,
    operation: str,
    request: dict[str, Any],
) -> Future:
    model_id = model_id_of(tinker_session.id, model_seq_id)
    existing = session.get(TrainingSession, model_id)
    if existing is not None:  # the same creation sent again: answer with the first one's future
        first = _future_at(session, model_id, 0)
        if first is None:
            raise InvalidRequest(f"model {model_id} exists; use another model_seq_id", param="model_seq_id")
        return first
    row = TrainingSession(
        id=model_id,
        organization_id=tinker_session.organization_id,
        base_model=base_model,
        kind="training",
        lora=lora,
        tags=_str_dict(user_metadata),
        next_seq_id=0,
        tinker_session_id=tinker_session.id,
    )
    future = _new_future(row, operation, 0)
    _set_request(object_store_for(settings), future, request)
    first = _commit_once(session, model_id, 0, row, future)
    if first is not None:
        return first
    _dispatch_model(session, row, send)
    return future


def _commit_once(session: Session, model_id: str, seq_id: int, *rows: Any) -> Future | None:
    """Add `rows` (in order: a future after its model) and commit; if the same request was
    recorded meanwhile (a concurrent retry), drop ours and return that one. The model's primary
    key and the unique (model_id, seq_id) index decide."""
    try:
        for row in rows:
            session.add(row)
            session.flush()
        session.commit()
    except IntegrityError:
        session.rollback()
        first = _future_at(session, model_id, seq_id)
        if first is None:
            raise
        return first
    return None


def create_model(
    session: Session, settings: Settings, organization_id: str, body: wire.CreateModelRequest, send: Dispatch
) -> Future:
    """A new LoRA model on a base: recorded now, created by the first worker of the base to take it."""
    tinker_session = _active_session(session, organization_id, body.session_id)
    base = _enabled_base(session, body.base_model)
    if body.optimizer_config.type != "adamw":
        raise InvalidRequest(
            f"optimizer {body.optimizer_config.type!r} is not available: Mint trains with AdamW", param="optimizer"
        )
    options = _lora_options(body.lora_config or wire.LoraConfig())
    lora = options.model_dump(mode="json")
    return _new_model(
        session,
        settings,
        send,
        tinker_session=tinker_session,
        model_seq_id=body.model_seq_id,
        base_model=base.name,
        lora=lora,
        user_metadata=body.user_metadata,
        operation="create_model",
        request={"lora": lora},
    )


def _submit(
    session: Session,
    settings: Settings,
    organization_id: str,
    model_id: str,
    seq_id: int,
    operation: str,
    build: Callable[[TrainingSession], dict[str, Any]],
    send: Dispatch,
) -> Future:
    """Record a model's request at `seq_id` and wake its worker.

    A request the server refuses still takes its place in the order, as a failed future: the
    client has moved past that seq_id, and the requests after it must not wait for it.
    """
    row = _owned_model(session, organization_id, model_id)
    existing = _future_at(session, row.id, seq_id)
    if existing is not None:  # sent again after a lost answer: the same future
        return existing
    if seq_id < row.next_seq_id:
        raise InvalidRequest(
            f"seq_id {seq_id} of model {model_id} was already used; the next one is {row.next_seq_id}", param="seq_id"
        )
    future = _new_future(row, operation, seq_id)
    session.add(future)
    if row.status != "active":
        _fail(future, "user", f"model {model_id} is closed (its session finished, or its worker stopped)")
        return future
    try:
        payload = build(row)
    except InvalidRequest as exc:
        _fail(future, "user", exc.message)
        if _commit_once(session, row.id, seq_id) is None:
            _dispatch_model(session, row, send)
        raise
    _set_request(object_store_for(settings), future, payload)
    first = _commit_once(session, row.id, seq_id)
    if first is not None:
        return first
    _dispatch_model(session, row, send)
    return future


def _datum(index: int, datum: wire.WireDatum) -> dict[str, Any]:
    inputs: dict[str, list[Any]] = {}
    for name, tensor in datum.loss_fn_inputs.items():
        if len(tensor.shape) != 1:
            raise InvalidRequest(
                f"data[{index}].loss_fn_inputs[{name!r}] has shape {list(tensor.shape)}; Mint's losses take one "
                "value per position (1-D)",
                param="data",
            )
        if not all(math.isfinite(value) for value in tensor.values):
            raise InvalidRequest(f"data[{index}].loss_fn_inputs[{name!r}] holds NaN or infinite values", param="data")
        inputs[name] = list(tensor.values)
    try:
        return Datum(model_input=datum.tokens, loss_fn_inputs=inputs).model_dump(mode="json")
    except ValidationError as exc:
        raise InvalidRequest(f"data[{index}]: {exc.errors()[0]['msg']}", param="data") from None


def submit_forward_backward(
    session: Session, settings: Settings, organization_id: str, request: wire.ForwardBackwardProto, send: Dispatch
) -> Future:
    def build(row: TrainingSession) -> dict[str, Any]:
        if not request.data:
            raise InvalidRequest("data is empty; send at least one datum", param="data")
        if request.loss_fn == "custom":
            raise InvalidRequest(
                "server-side custom losses are not available; forward_backward_custom runs them client-side",
                param="loss_fn",
            )
        for key, value in request.loss_fn_config.items():
            if not isinstance(value, float) or not math.isfinite(value):
                raise InvalidRequest(f"loss_fn_config[{key!r}] must be a finite number", param="loss_fn_config")
        return {
            "data": [_datum(index, datum) for index, datum in enumerate(request.data)],
            "loss_fn": request.loss_fn,
            "loss_fn_config": request.loss_fn_config,
            "forward_only": request.forward_only,
        }

    return _submit(
        session, settings, organization_id, request.model_id, request.seq_id, "forward_backward", build, send
    )


def submit_optim_step(
    session: Session, settings: Settings, organization_id: str, body: wire.OptimStepRequest, send: Dispatch
) -> Future:
    def build(row: TrainingSession) -> dict[str, Any]:
        if body.adam_params is None:
            raise InvalidRequest("only AdamW steps are available: send adam_params", param="optim_params")
        return {"adam": AdamParams(**body.adam_params.model_dump()).model_dump(mode="json")}

    return _submit(session, settings, organization_id, body.model_id, body.seq_id, "optim_step", build, send)


def _checkpoint_name(name: str | None, param: str = "path") -> str | None:
    if name is not None and not wire.CHECKPOINT_NAME.match(name):
        raise InvalidRequest(
            f"checkpoint name {name!r} must be 1-200 characters, without '/' or control characters", param=param
        )
    return name


def submit_save_weights(
    session: Session, settings: Settings, organization_id: str, body: wire.SaveWeightsRequest, send: Dispatch
) -> Future:
    def build(row: TrainingSession) -> dict[str, Any]:
        return {
            "name": _checkpoint_name(body.path),
            "overwrite": body.overwrite,
            "ttl_seconds": body.ttl_seconds,
            "user_metadata": _str_dict(body.user_metadata),
        }

    return _submit(session, settings, organization_id, body.model_id, body.seq_id, "save_weights", build, send)


def submit_save_weights_for_sampler(
    session: Session,
    settings: Settings,
    organization_id: str,
    body: wire.SaveWeightsForSamplerRequest,
    send: Dispatch,
) -> Future:
    def build(row: TrainingSession) -> dict[str, Any]:
        if body.path is None and body.sampling_session_seq_id is None:
            raise InvalidRequest("send a path (a named save) or a sampling_session_seq_id", param="path")
        return {
            "name": _checkpoint_name(body.path),
            "sampling_session_seq_id": body.sampling_session_seq_id,
            "ttl_seconds": body.ttl_seconds,
            "user_metadata": _str_dict(body.user_metadata),
        }

    return _submit(
        session, settings, organization_id, body.model_id, body.seq_id, "save_weights_for_sampler", build, send
    )


def _owned_checkpoint(session: Session, organization_id: str, path: wire.TinkerPath) -> TinkerCheckpoint:
    row = session.execute(
        select(TinkerCheckpoint).where(
            TinkerCheckpoint.model_id == path.model_id,
            TinkerCheckpoint.kind == path.kind,
            TinkerCheckpoint.name == path.name,
            TinkerCheckpoint.organization_id == organization_id,
        )
    ).scalar_one_or_none()
    if row is None:
        raise NotFound(f"no checkpoint {path} in this organization", param="path")
    return row


def submit_load_weights(
    session: Session, settings: Settings, organization_id: str, body: wire.LoadWeightsRequest, send: Dispatch
) -> Future:
    """Load a checkpoint into a model (`model_id` + `seq_id`), or create a model from it
    (`session_id` + `model_seq_id`: LoRA options come from the checkpoint's model)."""
    path = wire.TinkerPath.parse(body.path)
    checkpoint = _owned_checkpoint(session, organization_id, path)
    if path.kind == "sampler" and body.optimizer:
        raise InvalidRequest(
            f"{path} holds sampler weights, without optimizer state; load a tinker://.../weights/... path "
            "(save_state) to restore the optimizer",
            param="path",
        )
    load = {"path": str(path), "object_key": checkpoint.object_key, "kind": path.kind, "optimizer": body.optimizer}
    if body.model_id is not None and body.seq_id is not None:
        return _submit(
            session, settings, organization_id, body.model_id, body.seq_id, "load_weights", lambda row: load, send
        )
    if body.session_id is None or body.model_seq_id is None:
        raise InvalidRequest(
            "send model_id and seq_id (load into a model), or session_id and model_seq_id (a new model)",
            param="model_id",
        )
    source = session.get(TrainingSession, checkpoint.model_id)
    assert source is not None  # a checkpoint's model is never deleted
    if body.base_model is not None and body.base_model != source.base_model:
        raise InvalidRequest(
            f"{path} was trained on base {source.base_model!r}, not {body.base_model!r}", param="base_model"
        )
    return _new_model(
        session,
        settings,
        send,
        tinker_session=_active_session(session, organization_id, body.session_id),
        model_seq_id=body.model_seq_id,
        base_model=source.base_model,
        lora=dict(source.lora),
        user_metadata=body.user_metadata,
        operation="load_weights",
        request={"lora": dict(source.lora), "load": load},
    )


def get_info(session: Session, settings: Settings, organization_id: str, model_id: str) -> wire.GetInfoResponse:
    row = _owned_model(session, organization_id, model_id)
    base = session.get(BaseModelRow, row.base_model)
    folder = local_tokenizer_folder(settings, row.base_model)
    return wire.GetInfoResponse(
        model_id=row.id,
        model_data=wire.ModelData(
            arch=base.architecture if base is not None else None,
            model_name=row.base_model,
            tokenizer_id=str(folder) if folder is not None else None,
        ),
        lora_rank=row.lora.get("rank"),
        model_name=row.base_model,
    )


# ---- samplers ---------------------------------------------------------------------------------


def create_sampling_session(
    session: Session, organization_id: str, body: wire.CreateSamplingSessionRequest
) -> TrainingSession:
    """A sampler of a base, or of sampler weights (`tinker://<model>/sampler_weights/<name>`)."""
    tinker_session = _active_session(session, organization_id, body.session_id)
    sampler_id = sampler_id_of(tinker_session.id, body.sampling_session_seq_id)
    existing = session.get(TrainingSession, sampler_id)
    if existing is not None:
        return existing
    key: str | None = None
    model_path: str | None = None
    if body.model_path is not None:
        path = wire.TinkerPath.parse(body.model_path)
        if path.kind != "sampler":
            raise InvalidRequest(
                f"{path} is a training state; sample from sampler weights (save_weights_for_sampler), "
                "or from a training client with save_weights_and_get_sampling_client",
                param="model_path",
            )
        checkpoint = _owned_checkpoint(session, organization_id, path)
        source = session.get(TrainingSession, checkpoint.model_id)
        assert source is not None
        base_model, key, model_path = source.base_model, checkpoint.object_key, str(path)
        if body.base_model is not None and body.base_model != base_model:
            raise InvalidRequest(
                f"{path} was trained on base {base_model!r}, not {body.base_model!r}", param="base_model"
            )
    elif body.base_model is not None:
        base_model = _enabled_base(session, body.base_model).name
    else:
        raise InvalidRequest("send a base_model or a model_path to sample from", param="base_model")
    row = TrainingSession(
        id=sampler_id,
        organization_id=organization_id,
        base_model=base_model,
        kind="sampling",
        lora={},
        tags={},
        tinker_session_id=tinker_session.id,
        model_path=model_path,
        adapter_object_key=key,
    )
    session.add(row)
    session.flush()
    return row


def get_sampler(session: Session, organization_id: str, sampler_id: str) -> wire.GetSamplerResponse:
    row = get_owned(session, TrainingSession, sampler_id, organization_id=organization_id, noun="sampler")
    if row.kind != "sampling":
        raise NotFound(f"No sampler with id {sampler_id!r} in this organization.", param="sampler_id")
    return wire.GetSamplerResponse(sampler_id=row.id, base_model=row.base_model, model_path=row.model_path)


def submit_sample(
    session: Session, settings: Settings, organization_id: str, body: wire.SampleRequest, send: Dispatch
) -> tuple[Future, list[str]]:
    """Record a sample request and send it to the base's workers; returns its future and the
    ids of the sequences it will hold."""
    if body.sampling_session_id is None:
        raise InvalidRequest("send a sampling_session_id (create_sampling_session)", param="sampling_session_id")
    sampler = get_owned(
        session, TrainingSession, body.sampling_session_id, organization_id=organization_id, noun="sampler"
    )
    if sampler.kind != "sampling":
        raise NotFound(
            f"No sampler with id {body.sampling_session_id!r} in this organization.", param="sampling_session_id"
        )
    if sampler.status != "active":
        raise InvalidRequest(f"sampler {sampler.id} is closed (its session finished)", param="sampling_session_id")
    unsupported = {
        "topk_prompt_logprobs": body.topk_prompt_logprobs,
        "topk_sample_logprobs": body.topk_sample_logprobs,
        "target_prompt_logprobs": body.target_prompt_logprobs,
        "prompt_alt_tokens_k": body.prompt_alt_tokens_k,
        "record_stability_info": body.record_stability_info,
    }
    for name, value in unsupported.items():
        if value:
            raise InvalidRequest(f"{name} is not available on this server; leave it unset", param=name)
    if not 1 <= body.num_samples <= MAX_SAMPLES:
        raise InvalidRequest(f"num_samples must be 1 to {MAX_SAMPLES}", param="num_samples")
    prompt = body.prompt.tokens()
    if not prompt:
        raise InvalidRequest("the prompt is empty", param="prompt")
    last_n = body.prompt_logprobs_last_n
    if last_n is not None and not 1 <= last_n <= len(prompt) - 1:
        raise InvalidRequest(
            f"prompt_logprobs_last_n must be 1 to len(prompt) - 1 = {len(prompt) - 1}", param="prompt_logprobs_last_n"
        )
    sp = body.sampling_params
    try:
        params = SamplingParams(
            max_tokens=sp.max_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k,
            stop=sp.stop,
            seed=sp.seed,
        )
    except ValidationError as exc:
        raise InvalidRequest(f"sampling_params: {exc.errors()[0]['msg']}", param="sampling_params") from None
    future = _new_future(sampler, "sample", None)
    _set_request(
        object_store_for(settings),
        future,
        {
            "prompt": prompt,
            "params": params.model_dump(mode="json"),
            "num_samples": body.num_samples,
            "prompt_logprobs": bool(body.prompt_logprobs),
            "prompt_logprobs_last_n": last_n,
        },
    )
    session.add(future)
    session.commit()
    _send_quietly(send, SAMPLE_TASK, [future.id], base_model=sampler.base_model)
    return future, [f"{future.id}:{index}" for index in range(body.num_samples)]


# ---- futures --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FutureState:
    """What `retrieve_future` answers: a result, an error, or 'try again' with the queue's state."""

    request_id: str
    operation: str
    status: str
    result: dict[str, Any] | None = None
    error: str | None = None
    category: str | None = None
    # Set (when the worker was inspected) if no worker can run the request now, saying why.
    queue_state_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


def poll_future(
    settings: Settings, organization_id: str, request_id: str, send: Dispatch, *, inspect: bool
) -> FutureState:
    """The future's state now. With `inspect`, a waiting future's worker is checked (a dead one
    fails the future, saying why) and its message is sent again if it has waited long."""
    with session_scope(settings.database) as session:
        future = get_owned(session, Future, request_id, organization_id=organization_id, noun="future")
        reason = _inspect_waiting(session, future, send) if future.status in WAITING and inspect else None
        if future.status == "succeeded":
            result = _get_payload(object_store_for(settings), future.result, future.result_object_key)
            return FutureState(future.id, future.operation, future.status, result=result)
        if future.status in ("failed", "cancelled"):
            error = future.error or f"request {future.id} was cancelled"
            return FutureState(
                future.id, future.operation, future.status, error=error, category=future.error_category or "user"
            )
        return FutureState(future.id, future.operation, future.status, queue_state_reason=reason)


def _inspect_waiting(session: Session, future: Future, send: Dispatch) -> str | None:
    """Fail a future whose model is gone; resend a long-waiting one's message. Returns why the
    queue is paused, if it is (no worker holds the base)."""
    row = session.get(TrainingSession, future.session_id)
    if row is None or row.status != "active":
        _fail(future, "user", f"{future.model_id} is closed (its session finished, or its worker stopped)")
        return None
    waited = (utcnow() - as_utc(future.created_at)).total_seconds()
    if row.kind == "training" and row.worker_id is not None:
        ref = live_worker(session, row.worker_id)
        if ref is None:
            _lose_model(session, row)
        elif future.status == "pending" and waited > RESEND_AFTER_S:
            _send_quietly(send, RUN_MODEL_TASK, [row.id], worker=ref)
        return None
    if future.status == "running" and future.worker_id and live_worker(session, future.worker_id) is None:
        _fail(future, "server", f"the worker running request {future.id} ({future.worker_id}) stopped; send it again")
        return None
    if not _base_is_served(session, row.base_model):
        return f"no worker holds base {row.base_model} now; start one with `mint worker --base {row.base_model}`"
    if future.status == "pending" and waited > RESEND_AFTER_S:
        task, args = (RUN_MODEL_TASK, [row.id]) if row.kind == "training" else (SAMPLE_TASK, [future.id])
        _send_quietly(send, task, args, base_model=row.base_model)
    return None


def cancel_future(session: Session, organization_id: str, request_id: str) -> str:
    """Cancel a future that has not started (one running or done is left as it is); its status."""
    future = get_owned(session, Future, request_id, organization_id=organization_id, noun="future")
    if future.status == "pending":
        future.status, future.error, future.error_category = "cancelled", "cancelled by the client", "user"
        future.finished_at = utcnow()
    return future.status


# ---- training runs and checkpoints ------------------------------------------------------------


def checkpoint_view(row: TinkerCheckpoint) -> wire.Checkpoint:
    path = wire.TinkerPath(row.model_id, "training" if row.kind == "training" else "sampler", row.name)
    return wire.Checkpoint(
        checkpoint_id=path.checkpoint_id,
        checkpoint_type="training" if row.kind == "training" else "sampler",
        time=as_utc(row.created_at),
        tinker_path=str(path),
        size_bytes=row.size_bytes,
        user_metadata=_str_dict(row.user_metadata) or None,
        expires_at=as_utc(row.expires_at) if row.expires_at else None,
    )


def _newest_checkpoint(session: Session, model_id: str, kind: str) -> TinkerCheckpoint | None:
    return session.execute(
        select(TinkerCheckpoint)
        .where(TinkerCheckpoint.model_id == model_id, TinkerCheckpoint.kind == kind)
        .order_by(TinkerCheckpoint.created_at.desc())
        .limit(1)
    ).scalar_one_or_none()


def training_run_view(session: Session, row: TrainingSession) -> wire.TrainingRun:
    last_request = session.execute(select(func.max(Future.created_at)).where(Future.model_id == row.id)).scalar_one()
    last_state = _newest_checkpoint(session, row.id, "training")
    last_sampler = _newest_checkpoint(session, row.id, "sampler")
    return wire.TrainingRun(
        training_run_id=row.id,
        base_model=row.base_model,
        model_owner=row.organization_id,
        lora_rank=row.lora.get("rank"),
        last_request_time=as_utc(last_request or row.created_at),
        last_checkpoint=checkpoint_view(last_state) if last_state else None,
        last_sampler_checkpoint=checkpoint_view(last_sampler) if last_sampler else None,
        user_metadata=_str_dict(row.tags) or None,
    )


def get_training_run(session: Session, organization_id: str, model_id: str) -> wire.TrainingRun:
    return training_run_view(session, _owned_model(session, organization_id, model_id))


def list_training_runs(session: Session, organization_id: str, *, limit: int, offset: int) -> wire.TrainingRunsResponse:
    where = (TrainingSession.organization_id == organization_id, TrainingSession.kind == "training")
    total = session.execute(select(func.count()).select_from(TrainingSession).where(*where)).scalar_one()
    rows = session.execute(
        select(TrainingSession)
        .where(*where)
        .order_by(TrainingSession.created_at.desc(), TrainingSession.id.desc())
        .limit(limit)
        .offset(offset)
    ).scalars()
    return wire.TrainingRunsResponse(
        training_runs=[training_run_view(session, row) for row in rows],
        cursor=wire.Cursor(offset=offset, limit=limit, total_count=total),
    )


def list_checkpoints(session: Session, organization_id: str, model_id: str) -> wire.CheckpointsListResponse:
    row = _owned_model(session, organization_id, model_id)
    rows = session.execute(
        select(TinkerCheckpoint).where(TinkerCheckpoint.model_id == row.id).order_by(TinkerCheckpoint.created_at)
    ).scalars()
    return wire.CheckpointsListResponse(checkpoints=[checkpoint_view(c) for c in rows])


def list_user_checkpoints(
    session: Session, organization_id: str, *, limit: int, offset: int
) -> wire.CheckpointsListResponse:
    where = TinkerCheckpoint.organization_id == organization_id
    total = session.execute(select(func.count()).select_from(TinkerCheckpoint).where(where)).scalar_one()
    rows = session.execute(
        select(TinkerCheckpoint)
        .where(where)
        .order_by(TinkerCheckpoint.created_at.desc(), TinkerCheckpoint.id.desc())
        .limit(limit)
        .offset(offset)
    ).scalars()
    return wire.CheckpointsListResponse(
        checkpoints=[checkpoint_view(c) for c in rows],
        cursor=wire.Cursor(offset=offset, limit=limit, total_count=total),
    )


def delete_checkpoint(
    session: Session, store: ObjectStore, organization_id: str, model_id: str, checkpoint_id: str
) -> wire.TinkerPath:
    """Forget a checkpoint. A training state's object goes with it; sampler weights stay an
    adapter version (retire that through /v1/adapters)."""
    _owned_model(session, organization_id, model_id)
    segment, _, name = checkpoint_id.partition("/")
    path = wire.TinkerPath.parse(f"{wire.TINKER_SCHEME}{model_id}/{segment}/{name}")
    row = _owned_checkpoint(session, organization_id, path)
    if row.kind == "training":
        store.delete(row.object_key)
    session.delete(row)
    return path


def weights_info(session: Session, organization_id: str, tinker_path: str) -> wire.WeightsInfoResponse:
    path = wire.TinkerPath.parse(tinker_path)
    checkpoint = _owned_checkpoint(session, organization_id, path)
    model = session.get(TrainingSession, checkpoint.model_id)
    assert model is not None
    return wire.WeightsInfoResponse(
        base_model=model.base_model,
        lora_rank=model.lora.get("rank"),
        train_attn=model.lora.get("train_attn"),
        train_mlp=model.lora.get("train_mlp"),
        train_unembed=model.lora.get("train_unembed"),
    )


# ---- tokenizers -----------------------------------------------------------------------------


def tokenizer_archive(settings: Settings, base_model: str) -> bytes:
    """The base's tokenizer files as a tar, for clients on other machines."""
    store = object_store_for(settings)
    key = tokenizer_key(base_model)
    if not store.exists(key):
        raise NotFound(
            f"no tokenizer of base {base_model!r} yet: a worker of the base saves it when it first creates a model",
            param="base_model",
        )
    return store.get_bytes(key)


def local_tokenizer_folder(settings: Settings, base_model: str) -> Path | None:
    """`MINT_HOME/tokenizers/<base>/`, unpacked from the object store on first use; None
    while no worker of the base has saved it."""
    folder = settings.home / "tokenizers" / base_model
    if (folder / "tokenizer_config.json").is_file():
        return folder
    store = object_store_for(settings)
    if not store.exists(tokenizer_key(base_model)):
        return None
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{base_model}.", dir=folder.parent))
    unpack_folder(store.get_bytes(tokenizer_key(base_model)), staging)
    try:
        os.replace(staging, folder)
    except OSError:  # unpacked concurrently by another request: keep theirs
        for path in staging.iterdir():
            path.unlink()
        staging.rmdir()
    return folder


# ---- the worker side ------------------------------------------------------------------------


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


def _sweep_idle(settings: Settings) -> None:
    """Release this process's models whose session finished or went silent."""
    if not _resident.models:
        return
    cutoff = utcnow() - timedelta(seconds=SESSION_IDLE_S)
    with session_scope(settings.database) as session:
        rows = session.execute(
            select(TrainingSession, TinkerSession)
            .join(TinkerSession, TinkerSession.id == TrainingSession.tinker_session_id)
            .where(TrainingSession.id.in_(list(_resident.models)))
        ).all()
        found = {row.id for row, _ in rows}
        for row, owner in rows:
            silent = owner.last_heartbeat_at is None or as_utc(owner.last_heartbeat_at) < cutoff
            if row.status != "active" or owner.status != "active" or silent:
                row.status = "closed"
                _fail_waiting(session, row.id, f"model {row.id} was released: its session ended or went silent")
                release_model(row.id)
        for model_id in set(_resident.models) - found:
            release_model(model_id)


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
            _fail_waiting(session, model_id, f"model {model_id} is closed")
            release_model(model_id)
            return "closed"
        if row.worker_id is None:
            if not me.reachable:
                _fail_waiting(
                    session,
                    model_id,
                    f"worker {me.worker_id} does not consume a queue of its own, so it cannot hold Tinker models; "
                    "start training workers with `mint worker --base NAME` (not `--queues`)",
                    category="server",
                )
                return "unreachable"
            claimed = session.execute(
                update(TrainingSession)
                .where(TrainingSession.id == model_id, TrainingSession.worker_id.is_(None))
                .values(worker_id=me.worker_id)
                .execution_options(synchronize_session=False)
            ).rowcount
            if not claimed:
                return "taken"
        elif row.worker_id != me.worker_id:
            return "not-mine"
        context = dict(
            organization_id=row.organization_id, base_model=row.base_model, tinker_session_id=row.tinker_session_id
        )
    store = object_store_for(settings)
    ran, linger_until = 0, 0.0
    while True:
        step = _next_step(settings, store, model_id, me.worker_id)
        if step is None:
            if time.monotonic() >= linger_until:
                break
            time.sleep(LINGER_POLL_S)
            continue
        ctx = _ModelContext(settings, store, load_base, model_id, seq_id=step.seq_id, **context)
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
                _fail_waiting(session, model_id, f"model {model_id} is closed")
            release_model(model_id)
            return None
        while True:
            future = _future_at(session, model_id, row.next_seq_id)
            if future is None:
                return None
            if future.status == "pending":
                break
            if future.status == "running":  # an earlier attempt in this process stopped half way
                _fail(future, "server", "the request was interrupted; send it again")
            row.next_seq_id += 1
        future.status, future.worker_id = "running", worker_id
        payload = _get_payload(store, future.request, future.request_object_key)
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
                _set_result(store, future, value)
            else:
                _fail(future, kind, value)
        row.next_seq_id = max(row.next_seq_id, step.seq_id + 1)


# ---- the operations, by name (a closed registry) ---------------------------------------------


def _create_model(ctx: _ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
    _sweep_idle(ctx.settings)
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
        config = json.loads((folder / adapters.PEFT_FILES[0]).read_text(encoding="utf-8"))
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


def run_sample(settings: Settings, future_id: str, me: WorkerIdentity, load_base: LoadBase) -> str:
    """Claim and run one sample request on this worker's resident base."""
    store = object_store_for(settings)
    with session_scope(settings.database) as session:
        future = session.get(Future, future_id)
        if future is None or future.status != "pending":
            return "not-pending"
        sampler = session.get(TrainingSession, future.session_id)
        if sampler is None or sampler.status != "active":
            _fail(future, "user", f"sampler {future.model_id} is closed (its session finished)")
            return "closed"
        claimed = session.execute(
            update(Future)
            .where(Future.id == future_id, Future.status == "pending")
            .values(status="running", worker_id=me.worker_id)
            .execution_options(synchronize_session=False)
        ).rowcount
        if not claimed:
            return "taken"
        payload = _get_payload(store, future.request, future.request_object_key)
        base_model, key, organization_id = sampler.base_model, sampler.adapter_object_key, sampler.organization_id
    try:
        outcome: tuple[str, Any] = ("ok", _sample(store, load_base(base_model), key, payload))
    except MintError as exc:
        outcome = ("user", exc.message)
    except Exception as exc:
        log.exception("sample request %s failed", future_id)
        outcome = ("server", f"{type(exc).__name__}: {exc}")
    try:
        _record_sample(settings, store, future_id, organization_id, base_model, outcome)
    except Exception as exc:  # the result could not be stored: the client must hear of it all the same
        log.exception("could not record sample request %s", future_id)
        _record_sample(settings, store, future_id, organization_id, base_model, ("server", f"{exc}"))
    return outcome[0]


def _record_sample(
    settings: Settings,
    store: ObjectStore,
    future_id: str,
    organization_id: str,
    base_model: str,
    outcome: tuple[str, Any],
) -> None:
    with session_scope(settings.database) as session:
        future = session.get(Future, future_id)
        if future is None or future.status != "running":
            return
        kind, value = outcome
        if kind != "ok":
            _fail(future, kind, value)
            return
        _set_result(store, future, value)
        record_usage(
            session,
            organization_id=organization_id,
            kind="sampled",
            tokens=sum(len(sequence["tokens"]) for sequence in value["sequences"]),
            base_model=base_model,
            model_ref=future.model_id or base_model,
            resource_type="tinker_sampler",
            resource_id=future.model_id,
        )


def _sample(store: ObjectStore, resident: ResidentBase, key: str | None, payload: dict[str, Any]) -> dict[str, Any]:
    _export_tokenizer(store, resident)
    adapter = _sampler_adapter(store, resident, key) if key else None
    prompt: list[int] = payload["prompt"]
    sequences = resident.sample_with(
        adapter, prompt, SamplingParams.model_validate(payload["params"]), int(payload["num_samples"])
    )
    prompt_logprobs: list[float | None] | None = None
    if payload["prompt_logprobs"]:
        prompt_logprobs = [None]
        if len(prompt) > 1:
            datum = Datum(model_input=prompt[:-1], loss_fn_inputs={"target_tokens": prompt[1:]})
            prompt_logprobs += resident.evaluate(adapter, [datum], None, None, backward=False).logprobs[0]
        last_n = payload.get("prompt_logprobs_last_n")
        if last_n:
            prompt_logprobs = [None] * (len(prompt) - last_n) + prompt_logprobs[-last_n:]
    return {
        "sequences": [sequence.model_dump(mode="json") for sequence in sequences],
        "prompt_logprobs": prompt_logprobs,
    }


def encode_result(state: FutureState) -> bytes:
    """A finished forward, forward_backward or sample result in the protobuf the SDK reads."""
    assert state.result is not None
    if state.operation == "sample":
        return wire.encode_sample_response(state.result["sequences"], state.result.get("prompt_logprobs"))
    return wire.encode_forward_backward_output(state.result["logprobs"], state.result["metrics"])

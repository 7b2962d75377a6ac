"""Tinker compatibility, the API half: the use cases behind `/api/v1/...` that record work and send it.

The official `tinker` SDK speaks of sessions, models, samplers and futures. In Mint:

- A **Tinker session** (`create_session`, one per `ServiceClient`) is a `tinker_sessions` row:
  its organization, heartbeat and finish reason.
- A **model** (a `TrainingClient`, id `<session>:train:<n>`) and a **sampler** (a
  `SamplingClient`, id `<session>:sample:<n>`) are `training_sessions` rows. A model is a
  LoRA session (`mint.trainer.training_session.TrainingSession`) on the resident base of ONE worker
  process: the first worker of the base's queue (`train.<base>`) to run its creation claims
  it (`worker_id`), and every later request goes to that process's own queue. If that
  process dies, the model is lost: its pending futures fail and say which checkpoint to
  restore from.
- Every long call is a **future** (`futures` row), answered at once with its id; the worker
  moves it `pending -> running -> succeeded | failed`, and `retrieve_future` long-polls the
  row (`mint.services.tinker.futures`). A model's requests carry `seq_id`s (creation is 0,
  then 1, 2, ...); the worker applies them strictly in that order
  (`training_sessions.next_seq_id`), so requests that arrive early wait for the missing one.
  The queue message only says "run model X's next requests"; the rows say which.
- **Samplers** run on any worker of their base (`train.<base>`); a sample request is a
  future sent to the base's queue.

This module records sessions, models and their requests, and the futures' rows and payloads
they share. Sample requests are checked and recorded by `mint.services.tinker.sampling`, and a
future is read back, watched and cancelled by `mint.services.tinker.futures`; both build on
this module. The worker half (running the requests, sampling, checkpoints written) is
`mint.services.tinker.runner`; the training runs, checkpoints and tokenizers as clients read
them are `mint.services.tinker.checkpoints`. This module never imports torch.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import and_, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import Gone, InvalidRequest
from mint.schemas import tinker as wire
from mint.schemas import tinker_proto as proto
from mint.schemas.losses import NEEDS_PROVENANCE
from mint.services.billing import spend
from mint.services.billing.quotas import QuotaDefaults, hold, hold_base_slot
from mint.services.catalog import readable_checkpoint
from mint.services.dispatch import Dispatch
from mint.services.tinker.checkpoints import newest_checkpoint, owned_model, str_dict
from mint.services.tinker.provenance import attach_stability_info
from mint.services.workers import live_worker
from mint.storage.objects import ObjectStore, object_store_for
from mint.storage.queries import get_owned
from mint.storage.tables import BaseModelRow, Future, TinkerSession, TrainingSession, new_id, utcnow
from mint.trainer.types import TWO_D_INPUTS, AdamParams, Datum, LoraOptions

log = logging.getLogger(__name__)

RUN_MODEL_TASK = "mint.tinker.run_model"
SAMPLE_TASK = "mint.tinker.sample"
RELEASE_TASK = "mint.tinker.release"
EXPIRE_TASK = "mint.tinker.expire_idle_sessions"
# The finish reason of a session that the sweep ended because its heartbeats stopped.
EXPIRED = "expired"

# Requests and results up to this size live in the row; larger ones in the object store.
INLINE_PAYLOAD_BYTES = 64 * 1024
WAITING = ("pending", "running")


def model_id_of(session_id: str, seq: int) -> str:
    return f"{session_id}:train:{seq}"


def sampler_id_of(session_id: str, seq: int) -> str:
    return f"{session_id}:sample:{seq}"


def adapter_name_of(model_id: str) -> str:
    """The adapter whose versions are a model's named sampler saves."""
    return "tinker-" + model_id.replace(":", "-")


# ---- payloads: small in the row, large in the object store --------------------------------


def _put_payload(store: ObjectStore, key: str, payload: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    encoded = json.dumps(payload, separators=(",", ":"), allow_nan=True)
    # NaN and infinities (a diverged loss) are not JSON to PostgreSQL: those go to the store too.
    if len(encoded) <= INLINE_PAYLOAD_BYTES and "NaN" not in encoded and "Infinity" not in encoded:
        return payload, None
    store.put_bytes(key, encoded.encode())
    return None, key


def get_payload(store: ObjectStore, inline: dict[str, Any] | None, key: str | None) -> dict[str, Any]:
    if key is not None:
        loaded: dict[str, Any] = json.loads(store.get_bytes(key))
        return loaded
    return dict(inline or {})


def set_request(store: ObjectStore, future: Future, payload: dict[str, Any]) -> None:
    future.request, future.request_object_key = _put_payload(store, f"tinker/requests/{future.id}.json", payload)


def set_result(store: ObjectStore, future: Future, result: dict[str, Any]) -> None:
    future.result, future.result_object_key = _put_payload(store, f"tinker/results/{future.id}.json", result)
    future.status, future.finished_at = "succeeded", utcnow()


def fail_future(future: Future, category: str, message: str) -> None:
    future.status, future.error, future.error_category, future.finished_at = "failed", message, category, utcnow()


def fail_waiting(session: Session, model_id: str, message: str, category: str = "user") -> int:
    """Fail every pending or running future of a model or sampler."""
    futures = session.execute(select(Future).where(Future.model_id == model_id, Future.status.in_(WAITING))).scalars()
    count = 0
    for future in futures:
        fail_future(future, category, message)
        count += 1
    return count


# ---- sessions -------------------------------------------------------------------------------


def create_session(
    session: Session, organization_id: str, body: wire.CreateSessionRequest, *, quotas: QuotaDefaults
) -> TinkerSession:
    """Record a live session; an organization at its tinker_sessions quota is refused (QuotaExceeded)."""
    organization = hold(session, organization_id, "tinker_sessions", quotas)
    spend.check_month_open(session, organization, "Tinker session")
    row = TinkerSession(
        id=f"tks_{secrets.token_hex(8)}",
        organization_id=organization_id,
        tags=sorted(set(body.tags)),
        user_metadata=str_dict(body.user_metadata),
        display_name=body.display_name,
        project=body.project_id,
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
        raise_if_expired(row)
        raise InvalidRequest(
            f"session {session_id} is finished; create a new ServiceClient to start another", param="session_id"
        )
    return row


def raise_if_expired(row: TinkerSession | None) -> None:
    """`Gone` (410) if the session expired for want of heartbeats: nothing of it can be used again."""
    if row is not None and row.status != "active" and row.finish_reason == EXPIRED:
        raise Gone(row.finish_detail or f"session {row.id} expired; create a new session", param="session_id")


def heartbeat(session: Session, organization_id: str, session_id: str) -> bool:
    """Record a heartbeat; False once the session is finished (the SDK then stops sending them),
    `Gone` if it expired."""
    row = get_tinker_session(session, organization_id, session_id)
    if row.status != "active":
        raise_if_expired(row)
        return False
    row.last_heartbeat_at = utcnow()
    return True


def _end_session(
    session: Session, row: TinkerSession, reason: str, detail: str | None, why: str
) -> list[tuple[str, str]]:
    """Mark the session finished, close its models and samplers and fail their waiting requests
    (saying `why`); returns the (model, worker) pairs whose worker holds the model's weights.
    The caller commits, then releases them (`_release_models`)."""
    row.status, row.finished_at = "finished", utcnow()
    row.finish_reason, row.finish_detail = reason, detail
    members = session.execute(
        select(TrainingSession).where(TrainingSession.tinker_session_id == row.id, TrainingSession.status == "active")
    ).scalars()
    holders: list[tuple[str, str]] = []
    for member in members:
        member.status = "closed"
        fail_waiting(session, member.id, why)
        if member.kind == "training" and member.worker_id:
            holders.append((member.id, member.worker_id))
    return holders


def _release_models(session: Session, holders: list[tuple[str, str]], send: Dispatch) -> None:
    """Ask each live worker process that holds one of these models to free its memory (a dead
    one freed it with itself; a message lost here is made up by the worker's own sweep)."""
    for model_id, worker_id in holders:
        ref = live_worker(session, worker_id)
        if ref is not None:
            send_quietly(send, RELEASE_TASK, [model_id], worker=ref)


def finish_session(
    session: Session, organization_id: str, session_id: str, body: wire.FinishSessionRequest, send: Dispatch
) -> None:
    """Mark the session finished (the first reason wins), close its models and samplers, and
    ask their workers to free the models' memory."""
    row = get_tinker_session(session, organization_id, session_id)
    if row.status != "active":
        return
    why = f"session {row.id} was finished before this request ran"
    holders = _end_session(session, row, body.reason.type, body.detail, why)
    session.commit()
    _release_models(session, holders, send)


def expired_message(session_id: str, idle_s: float) -> str:
    return (
        f"session {session_id} expired after {idle_s:g} s without a heartbeat (MINT_TINKER_SESSION_IDLE_S); "
        "its models and samplers were released: create a new session (a new ServiceClient) and restore "
        "from a saved state"
    )


def expire_session(session: Session, row: TinkerSession, idle_s: float) -> list[tuple[str, str]]:
    """End a silent session as expired (see `_end_session`); the caller commits and releases."""
    message = expired_message(row.id, idle_s)
    return _end_session(session, row, EXPIRED, message, message)


def expire_idle_sessions(session: Session, *, idle_s: float, send: Dispatch) -> list[str]:
    """The periodic sweep: expire every active session whose last heartbeat is older than
    `idle_s`, fail its waiting requests, and tell the worker processes holding its models to free
    them, so that their LoRA slots serve other sessions and jobs. Returns the expired ids."""
    cutoff = utcnow() - timedelta(seconds=idle_s)
    silent = session.execute(
        select(TinkerSession)
        .where(
            TinkerSession.status == "active",
            or_(
                TinkerSession.last_heartbeat_at < cutoff,
                and_(TinkerSession.last_heartbeat_at.is_(None), TinkerSession.created_at < cutoff),
            ),
        )
        .with_for_update(skip_locked=True)
    ).scalars()
    expired: list[str] = []
    holders: list[tuple[str, str]] = []
    for row in silent:
        holders += expire_session(session, row, idle_s)
        expired.append(row.id)
    session.commit()
    if expired:
        log.info("expired %d silent Tinker sessions: %s", len(expired), ", ".join(expired))
    _release_models(session, holders, send)
    return expired


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
        user_metadata=str_dict(row.user_metadata) or None,
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


# ---- sending to workers --------------------------------------------------------------------------------


def send_quietly(send: Dispatch, task: str, args: list[str], **where: Any) -> None:
    try:
        send(task, args=args, **where)
    except Exception:  # noqa: BLE001 - the row is committed; a waiting retrieve_future sends it again
        log.warning("could not send %s%s now; it is sent again while its future waits", task, args, exc_info=True)


def _dispatch_model(session: Session, row: TrainingSession, send: Dispatch) -> None:
    """Wake the worker that holds a model (or, before one claims it, the workers of its base)."""
    if row.worker_id is None:
        send_quietly(send, RUN_MODEL_TASK, [row.id], base_model=row.base_model)
        return
    ref = live_worker(session, row.worker_id)
    if ref is None:
        lose_model(session, row)
        session.commit()
        return
    send_quietly(send, RUN_MODEL_TASK, [row.id], worker=ref)


def lose_model(session: Session, row: TrainingSession) -> None:
    """The model's worker process is gone, and its weights with it: close it and say how to go on."""
    row.status = "closed"
    newest = newest_checkpoint(session, row.id, "training")
    hint = (
        f"restore it with ServiceClient.create_training_client_from_state_with_optimizer("
        f"'{wire.TinkerPath(row.id, 'training', newest.name)}')"
        if newest is not None
        else "it had no saved state (save_state), so start a new model"
    )
    fail_waiting(
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


def future_at(session: Session, model_id: str, seq_id: int) -> Future | None:
    return session.execute(
        select(Future).where(Future.model_id == model_id, Future.seq_id == seq_id)
    ).scalar_one_or_none()


def new_future(row: TrainingSession, operation: str, seq_id: int | None) -> Future:
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
        first = future_at(session, model_id, 0)
        if first is None:
            raise InvalidRequest(f"model {model_id} exists; use another model_seq_id", param="model_seq_id")
        return first
    # A model holds a LoRA slot on a worker of its base: counted against the organization's
    # quota, and never one of the slots the base keeps for others.
    quotas = QuotaDefaults.of(settings)
    hold_base_slot(session, hold(session, tinker_session.organization_id, "tinker_models", quotas), base_model, quotas)
    row = TrainingSession(
        id=model_id,
        organization_id=tinker_session.organization_id,
        base_model=base_model,
        kind="training",
        lora=lora,
        tags=str_dict(user_metadata),
        next_seq_id=0,
        tinker_session_id=tinker_session.id,
    )
    future = new_future(row, operation, 0)
    set_request(object_store_for(settings), future, request)
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
        first = future_at(session, model_id, seq_id)
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
    row = owned_model(session, organization_id, model_id)
    existing = future_at(session, row.id, seq_id)
    if existing is not None:  # sent again after a lost answer: the same future
        return existing
    if seq_id < row.next_seq_id:
        raise InvalidRequest(
            f"seq_id {seq_id} of model {model_id} was already used; the next one is {row.next_seq_id}", param="seq_id"
        )
    if row.status != "active":
        raise_if_expired(session.get(TinkerSession, row.tinker_session_id) if row.tinker_session_id else None)
    future = new_future(row, operation, seq_id)
    session.add(future)
    if row.status != "active":
        fail_future(future, "user", f"model {model_id} is closed (its session finished, or its worker stopped)")
        return future
    try:
        payload = build(row)
    except InvalidRequest as exc:
        fail_future(future, "user", exc.message)
        if _commit_once(session, row.id, seq_id) is None:
            _dispatch_model(session, row, send)
        raise
    set_request(object_store_for(settings), future, payload)
    first = _commit_once(session, row.id, seq_id)
    if first is not None:
        return first
    _dispatch_model(session, row, send)
    return future


def _datum(index: int, datum: proto.WireDatum) -> dict[str, Any]:
    inputs: dict[str, list[Any]] = {}
    for name, tensor in datum.loss_fn_inputs.items():
        if name == "sampler_logprobs":
            raise InvalidRequest(
                f"data[{index}].loss_fn_inputs['sampler_logprobs'] is the server's to fill, from what the sampler "
                "recorded (record_stability_info); name the sampled sequences with Datum.with_provenance instead",
                param="data",
            )
        if not 1 <= len(tensor.shape) <= 2 or (len(tensor.shape) == 2 and name not in TWO_D_INPUTS):
            raise InvalidRequest(
                f"data[{index}].loss_fn_inputs[{name!r}] has shape {list(tensor.shape)}; Mint's losses take one "
                f"value per position (N,), and {' and '.join(sorted(TWO_D_INPUTS))} may also be (N, K) "
                "(K targets per position, for cross_entropy)",
                param="data",
            )
        if not all(math.isfinite(value) for value in tensor.values):
            raise InvalidRequest(f"data[{index}].loss_fn_inputs[{name!r}] holds NaN or infinite values", param="data")
        values = list(tensor.values)
        if len(tensor.shape) == 2:
            width = tensor.shape[1]
            inputs[name] = [values[row * width : (row + 1) * width] for row in range(tensor.shape[0])]
        else:
            inputs[name] = values
    try:
        return Datum(model_input=datum.tokens, loss_fn_inputs=inputs).model_dump(mode="json")
    except ValidationError as exc:
        raise InvalidRequest(f"data[{index}]: {exc.errors()[0]['msg']}", param="data") from None


def submit_forward_backward(
    session: Session, settings: Settings, organization_id: str, request: proto.ForwardBackwardProto, send: Dispatch
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
        data = [_datum(index, datum) for index, datum in enumerate(request.data)]
        if request.loss_fn in NEEDS_PROVENANCE:
            store = object_store_for(settings)
            data = attach_stability_info(
                session, lambda inline, key: get_payload(store, inline, key), row, request.data, data
            )
        return {
            "data": data,
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
            "user_metadata": str_dict(body.user_metadata),
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
            "user_metadata": str_dict(body.user_metadata),
        }

    return _submit(
        session, settings, organization_id, body.model_id, body.seq_id, "save_weights_for_sampler", build, send
    )


def submit_save_weights_external(
    session: Session, settings: Settings, organization_id: str, body: wire.SaveWeightsExternalRequest, send: Dispatch
) -> Future:
    """Export the LoRA weights as PEFT files (`tinker://<model>/external_weights/<name>`), which
    `external_weights_urls` signs for download. An export of the same name is replaced."""
    if body.age_encryption_recipients:
        raise InvalidRequest(
            "Mint does not encrypt exported weights (age_encryption_recipients); omit the recipients, and "
            "the files are served only through short-lived signed URLs",
            param="age_encryption_recipients",
        )

    def build(row: TrainingSession) -> dict[str, Any]:
        return {
            "name": _checkpoint_name(body.path),
            "ttl_seconds": body.ttl_seconds,
            "user_metadata": str_dict(body.user_metadata),
        }

    return _submit(session, settings, organization_id, body.model_id, body.seq_id, "save_weights_external", build, send)


def submit_load_weights(
    session: Session, settings: Settings, organization_id: str, body: wire.LoadWeightsRequest, send: Dispatch
) -> Future:
    """Load a checkpoint into a model (`model_id` + `seq_id`), or create a model from it
    (`session_id` + `model_seq_id`: LoRA options come from the checkpoint's model)."""
    path = wire.TinkerPath.parse(body.path)
    if path.kind == "external":
        raise InvalidRequest(
            f"{path} is exported weights, for download; load the training state (tinker://.../weights/...) "
            "or the sampler weights (tinker://.../sampler_weights/...) it was made from",
            param="path",
        )
    checkpoint = readable_checkpoint(session, organization_id, path)
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
                f"{path} is not sampler weights; sample from sampler weights (save_weights_for_sampler), "
                "or from a training client with save_weights_and_get_sampling_client",
                param="model_path",
            )
        checkpoint = readable_checkpoint(session, organization_id, path)
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

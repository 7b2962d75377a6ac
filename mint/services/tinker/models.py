"""Tinker models, the API half: training models (`TrainingClient`s) created and their requests recorded.

A model (id `<session>:train:<n>`) is a `training_sessions` row of its Tinker session
(`mint.services.tinker.sessions`): a LoRA session (`mint.trainer.training_session.TrainingSession`)
on the resident base of ONE worker process. The first worker of the base's queue (`train.<base>`)
to run its creation claims it (`worker_id`), and every later request goes to that process's own
queue. If that process dies, the model is lost (`lose_model`): its pending futures fail and say
which checkpoint to restore from.

A model's requests (forward_backward, optim_step, save and load weights) are futures
(`mint.services.tinker.future_rows`) that carry `seq_id`s (creation is 0, then 1, 2, ...); the
worker applies them strictly in that order (`training_sessions.next_seq_id`), so requests that
arrive early wait for the missing one. Each is checked here, before it is recorded; the queue
message (RUN_MODEL_TASK) only says "run model X's next requests", and the rows say which. The
worker half is `mint.services.tinker.runner`. This module never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import InvalidRequest
from mint.schemas import tinker as wire
from mint.schemas import tinker_proto as proto
from mint.schemas.losses import NEEDS_PROVENANCE
from mint.services.billing.quotas import QuotaDefaults, hold, hold_base_slot
from mint.services.catalog import readable_checkpoint
from mint.services.dispatch import Dispatch
from mint.services.tinker.checkpoints import newest_checkpoint, owned_model, str_dict
from mint.services.tinker.future_rows import (
    fail_future,
    fail_waiting,
    future_at,
    get_payload,
    new_future,
    send_quietly,
    set_request,
)
from mint.services.tinker.provenance import attach_stability_info
from mint.services.tinker.sessions import active_session, enabled_base, raise_if_expired
from mint.services.workers import live_worker
from mint.storage.objects import object_store_for
from mint.storage.tables import Future, TinkerSession, TrainingSession
from mint.trainer.types import TWO_D_INPUTS, AdamParams, Datum, LoraOptions

RUN_MODEL_TASK = "mint.tinker.run_model"


def model_id_of(session_id: str, seq: int) -> str:
    return f"{session_id}:train:{seq}"


def adapter_name_of(model_id: str) -> str:
    """The adapter whose versions are a model's named sampler saves."""
    return "tinker-" + model_id.replace(":", "-")


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
    tinker_session = active_session(session, organization_id, body.session_id)
    base = enabled_base(session, body.base_model)
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
        tinker_session=active_session(session, organization_id, body.session_id),
        model_seq_id=body.model_seq_id,
        base_model=source.base_model,
        lora=dict(source.lora),
        user_metadata=body.user_metadata,
        operation="load_weights",
        request={"lora": dict(source.lora), "load": load},
    )

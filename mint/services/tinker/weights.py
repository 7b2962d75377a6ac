"""A model's weights on its worker: saved states, sampler weights and PEFT exports written, and
checkpoints loaded back.

`save_weights` writes the training state (adapter and optimizer) as a `tinker://<model>/weights/<name>`
checkpoint; `save_weights_for_sampler` registers the adapter as a version of the model's adapter
(`tinker://<model>/sampler_weights/<name>`), or, unnamed, snapshots it for a new sampler of the
same session (save-and-sample); `save_weights_external` exports PEFT files for signed download.
Each is a `tinker_checkpoints` row, replaced when one of the same name is saved again.
`load_weights` loads a checkpoint into a model, or creates the model from it (its seq_id 0).
These are operations of `mint.services.tinker.runner`'s registry. The trainer is imported only
inside functions, so importing this module imports no torch.
"""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest
from mint.schemas import tinker as wire
from mint.services.models import adapters
from mint.services.tinker.model_steps import ModelContext
from mint.services.tinker.models import adapter_name_of
from mint.services.tinker.resident import sampler_adapter
from mint.services.tinker.sampling import sampler_id_of
from mint.services.tinker.training import create_model
from mint.storage.archives import pack_folder, unpack_folder
from mint.storage.db import session_scope
from mint.storage.keys import (
    EXTERNAL_FILES,
    PEFT_FILES,
    external_file_key,
    external_prefix,
    tinker_snapshot_key,
    tinker_state_key,
)
from mint.storage.tables import TinkerCheckpoint, TrainingSession, new_id, utcnow

if TYPE_CHECKING:
    from mint.trainer.training_session import TrainingSession as LoraSession


def _fetch_checkpoint(ctx: ModelContext, load: dict[str, Any], scratch: Path) -> Path:
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


def load_weights(ctx: ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Into this model (a later request), or as the model's creation (seq_id 0)."""
    load = payload.get("load", payload)
    with tempfile.TemporaryDirectory(prefix="mint-tinker-load-") as scratch:
        folder = _fetch_checkpoint(ctx, load, Path(scratch))
        if ctx.seq_id == 0:
            create_model(ctx, payload)
        _load_into(ctx.training(), folder, load)
    return {"path": load["path"], "model_id": ctx.model_id, "type": "load_weights"}


def _expires(ttl_seconds: int | None) -> datetime | None:
    return utcnow() + timedelta(seconds=ttl_seconds) if ttl_seconds else None


def save_weights(ctx: ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
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
    key = tinker_state_key(checkpoint_id)
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
    ctx: ModelContext,
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


def save_weights_for_sampler(ctx: ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
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


def save_weights_external(ctx: ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
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


def _snapshot(ctx: ModelContext, training: LoraSession, folder: Path, archive: bytes, seq: int) -> dict[str, Any]:
    """Save-and-sample: the weights as they are now, for a new sampler of the same session."""
    if ctx.tinker_session_id is None:
        raise InvalidRequest("this model belongs to no Tinker session, so it cannot make samplers", param="model_id")
    key = ctx.store.put_content(archive, tinker_snapshot_key).key
    # This worker will likely serve the sampler: load it now, from the folder at hand.
    sampler_adapter(ctx.store, training.base, key, folder)
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

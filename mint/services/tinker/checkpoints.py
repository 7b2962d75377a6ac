"""Tinker compatibility: training runs, checkpoints and tokenizers as clients read them.

- **Checkpoints**: `save_state` stores the training state in the object store as a
  `tinker_checkpoints` row (`tinker://<model>/weights/<name>`); `save_weights_for_sampler`
  with a name also registers an adapter version (adapter `tinker-<model>`), so the weights
  appear in `/v1/adapters` and can be evaluated and deployed. Save-and-sample snapshots are
  stored by content hash and loaded by samplers, not registered. `save_weights_external`
  writes the PEFT files one object each (`tinker://<model>/external_weights/<name>`), for
  `external_weights_urls` to sign for download. The worker writes checkpoints
  (`mint.services.tinker.runner`); this module lists, describes, signs, publishes, sets the
  lifetime of and deletes them.
- **Publishing**: a published checkpoint can be read by every organization (loaded, sampled,
  described, downloaded) and changed only by its own; publishing and unpublishing are audited.
  A publication is lent, not given: a `copy_weights` copy another organization takes of it
  records it as its origin (`origin_checkpoint_id`, kept through copies of the copy), stands
  only while the publication does, and cannot be published by its holder (403): only the
  weights' own organization decides who reads them. Unpublishing or deleting the checkpoint
  deletes those copies (`end_foreign_copies`); a copy whose origin went another way (retention)
  can no longer be read (`catalog.readable_checkpoint`). The organization's own copies of its own
  weights are ordinary checkpoints. Download URLs of a checkpoint read through a publication
  are tied to it (`signed_urls.Grant`): they stop working when it is unpublished.
- **Tokenizers** travel with no hub: the first worker of a base to serve a Tinker model saves
  the base's tokenizer (`save_pretrained`) as `tokenizers/<base>.tar` in the object store; the
  API unpacks it under `MINT_HOME/tokenizers/<base>/` and answers that folder as the model's
  `tokenizer_id`, which the client's `AutoTokenizer.from_pretrained` loads offline. A client
  on another machine downloads the archive from `GET /api/v1/tokenizers/<base>` and unpacks it
  into a folder named after the base in its working directory, where loading the tokenizer by
  the base's name (tinker-cookbook, `SamplingClient.get_tokenizer`) finds it.

The row readers shared with the API half (`mint.services.tinker.models`) and the worker half
(`mint.services.tinker.weights`) live here (`owned_model`, `owned_checkpoint`,
`newest_checkpoint`), below both; which
checkpoints an organization may read is the catalog's (`mint.services.catalog`), since serving
and evals read them too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import InvalidRequest, NotFound, PermissionDenied
from mint.schemas import tinker as wire
from mint.services import catalog
from mint.services.audit import record_audit
from mint.services.models.object_gc import is_referenced
from mint.services.principal import Principal
from mint.services.tinker import signed_urls
from mint.storage.archives import unpack_folder
from mint.storage.keys import EXTERNAL_FILES, external_file_key, tokenizer_key
from mint.storage.objects import ObjectStore, ObjectStream, object_store_for
from mint.storage.queries import get_owned
from mint.storage.tables import (
    ApiKey,
    BaseModelRow,
    Future,
    Organization,
    TinkerCheckpoint,
    TrainingSession,
    as_utc,
    utcnow,
)

# ---- rows as the API and the worker halves read them ---------------------------------------


def str_dict(values: dict[str, Any] | None) -> dict[str, str]:
    """User metadata as Tinker keeps it: strings to strings (NUL removed; PostgreSQL refuses it)."""
    return {str(key).replace("\x00", ""): str(value).replace("\x00", "") for key, value in (values or {}).items()}


def owned_model(session: Session, organization_id: str, model_id: str) -> TrainingSession:
    """The organization's training model `model_id` (a sampler's id is not found)."""
    row = get_owned(session, TrainingSession, model_id, organization_id=organization_id, noun="model")
    if row.kind != "training":
        raise NotFound(f"No model with id {model_id!r} in this organization (it names a sampler).", param="model_id")
    return row


def owned_checkpoint(session: Session, organization_id: str, path: wire.TinkerPath) -> TinkerCheckpoint:
    """The organization's checkpoint at a `tinker://` path."""
    row = catalog.checkpoint_at(session, path)
    if row is None or row.organization_id != organization_id:
        raise NotFound(f"no checkpoint {path} in this organization", param="path")
    return row


def copy_origin(source: TinkerCheckpoint, organization_id: str) -> str | None:
    """What a copy of `source` into `organization_id` stands on (`copy_weights` records it):
    the publication `source` itself stands on, else `source` when it is another organization's,
    else None (the organization's own weights)."""
    if source.origin_checkpoint_id is not None:
        return source.origin_checkpoint_id
    return source.id if source.organization_id != organization_id else None


def end_foreign_copies(session: Session, row: TinkerCheckpoint) -> int:
    """Delete the copies other organizations took of `row` while it was published (and the
    copies of those): its publication is withdrawn. Their objects are `row`'s and stay with it;
    the caller deletes whatever no row names any more. How many copies were ended."""
    query = select(TinkerCheckpoint).where(TinkerCheckpoint.origin_checkpoint_id == row.id)
    copies = list(session.execute(query).scalars())
    for copy in copies:
        session.delete(copy)
    session.flush()
    return len(copies)


def newest_checkpoint(session: Session, model_id: str, kind: str) -> TinkerCheckpoint | None:
    """A model's last saved training state (`kind="training"`) or sampler weights (`"sampler"`)."""
    return session.execute(
        select(TinkerCheckpoint)
        .where(TinkerCheckpoint.model_id == model_id, TinkerCheckpoint.kind == kind)
        .order_by(TinkerCheckpoint.created_at.desc())
        .limit(1)
    ).scalar_one_or_none()


# ---- models, training runs and checkpoints ----------------------------------------------------


def get_info(session: Session, settings: Settings, organization_id: str, model_id: str) -> wire.GetInfoResponse:
    """A model's base, LoRA rank and tokenizer folder (`get_info`)."""
    row = owned_model(session, organization_id, model_id)
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


def path_of(row: TinkerCheckpoint) -> wire.TinkerPath:
    return wire.TinkerPath(row.model_id, wire.checkpoint_kind(row.kind), row.name)


def checkpoint_view(row: TinkerCheckpoint) -> wire.Checkpoint:
    path = path_of(row)
    return wire.Checkpoint(
        checkpoint_id=path.checkpoint_id,
        checkpoint_type=path.kind,
        time=as_utc(row.created_at),
        tinker_path=str(path),
        size_bytes=row.size_bytes,
        public=row.public,
        user_metadata=str_dict(row.user_metadata) or None,
        expires_at=as_utc(row.expires_at) if row.expires_at else None,
    )


def training_run_view(session: Session, row: TrainingSession) -> wire.TrainingRun:
    last_request = session.execute(select(func.max(Future.created_at)).where(Future.model_id == row.id)).scalar_one()
    last_state = newest_checkpoint(session, row.id, "training")
    last_sampler = newest_checkpoint(session, row.id, "sampler")
    return wire.TrainingRun(
        training_run_id=row.id,
        base_model=row.base_model,
        model_owner=row.organization_id,
        lora_rank=row.lora.get("rank"),
        last_request_time=as_utc(last_request or row.created_at),
        last_checkpoint=checkpoint_view(last_state) if last_state else None,
        last_sampler_checkpoint=checkpoint_view(last_sampler) if last_sampler else None,
        user_metadata=str_dict(row.tags) or None,
    )


def get_training_run(session: Session, organization_id: str, model_id: str) -> wire.TrainingRun:
    return training_run_view(session, owned_model(session, organization_id, model_id))


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
    row = owned_model(session, organization_id, model_id)
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
    """Forget a checkpoint. A training state's object, or exported weights' files, go with it,
    unless a copy of this organization still names them (`copy_weights` shares them); copies
    other organizations took while it was published end with it (`end_foreign_copies`).
    Sampler weights stay an adapter version (retire that through /v1/adapters).

    The row is deleted and committed first: a crash before the objects are deleted leaves
    objects no row references, which `mint admin gc` collects, never a path to nothing."""
    owned_model(session, organization_id, model_id)
    path = wire.TinkerPath.of_checkpoint(model_id, checkpoint_id)
    row = owned_checkpoint(session, organization_id, path)
    keys = checkpoint_objects(row)
    end_foreign_copies(session, row)
    session.delete(row)
    session.commit()
    for key in keys:
        if not is_referenced(session, key):
            store.delete(key)
    return path


def checkpoint_objects(row: TinkerCheckpoint) -> list[str]:
    """The objects that go with a checkpoint's row: none for sampler weights (an adapter version's)."""
    if row.kind == "training":
        return [row.object_key]
    if row.kind == "external":
        return [external_file_key(row.object_key, name) for name in EXTERNAL_FILES]
    return []


def weights_info(session: Session, organization_id: str, tinker_path: str) -> wire.WeightsInfoResponse:
    """What a checkpoint holds (its base and LoRA shape), for one the organization may read."""
    path = wire.TinkerPath.parse(tinker_path)
    checkpoint = catalog.readable_checkpoint(session, organization_id, path)
    model = session.get(TrainingSession, checkpoint.model_id)
    assert model is not None
    return wire.WeightsInfoResponse(
        base_model=model.base_model,
        lora_rank=model.lora.get("rank"),
        train_attn=model.lora.get("train_attn"),
        train_mlp=model.lora.get("train_mlp"),
        train_unembed=model.lora.get("train_unembed"),
    )


# ---- lifetime and publishing --------------------------------------------------------------------


def set_checkpoint_ttl(
    session: Session, organization_id: str, model_id: str, checkpoint_id: str, ttl_seconds: int | None
) -> TinkerCheckpoint:
    """Expire a checkpoint `ttl_seconds` from now (None: never); beat's retention task deletes it then."""
    row = owned_checkpoint(session, organization_id, wire.TinkerPath.of_checkpoint(model_id, checkpoint_id))
    row.expires_at = utcnow() + timedelta(seconds=ttl_seconds) if ttl_seconds else None
    return row


def set_published(
    session: Session, actor: Principal, model_id: str, checkpoint_id: str, public: bool
) -> TinkerCheckpoint:
    """Publish (every organization may read it) or unpublish one of the organization's checkpoints.

    A copy of another organization's weights is refused publication (PermissionDenied): only
    their own organization says who reads them. Unpublishing ends the copies other
    organizations took meanwhile (`end_foreign_copies`), as it ends the download URLs they were
    given (`signed_urls.Grant`)."""
    row = owned_checkpoint(session, actor.organization_id, wire.TinkerPath.of_checkpoint(model_id, checkpoint_id))
    if public and row.origin_checkpoint_id is not None:
        origin = session.get(TinkerCheckpoint, row.origin_checkpoint_id)
        source = str(path_of(origin)) if origin is not None else "since withdrawn"
        raise PermissionDenied(
            f"{path_of(row)} is a copy of weights another organization published ({source}); only that "
            "organization can publish them. Publish weights this organization trained, or ask the owners to "
            "keep theirs published"
        )
    if row.public != public:
        row.public = public
        details: dict[str, Any] = {"path": str(path_of(row))}
        if not public:
            details["copies_ended"] = end_foreign_copies(session, row)
        action = "tinker_checkpoint.publish" if public else "tinker_checkpoint.unpublish"
        record_audit(session, actor, action, "tinker_checkpoint", row.id, details)
    return row


# ---- exported weights: signed downloads ------------------------------------------------------


def external_weights_urls(
    session: Session,
    settings: Settings,
    store: ObjectStore,
    principal: Principal,
    model_id: str,
    checkpoint_id: str,
) -> wire.ExternalWeightsUrlsResponse:
    """A download URL per file of exported weights (`external_weights/<name>`) that needs no key,
    all expiring together (`signed_urls.download_url`). Each stands on what let this request
    read them: the key that asked, and the publication they were read through, if any (another
    organization's checkpoint, or the origin of a copy of one); revoke the one or withdraw the
    other and the URLs stop working."""
    path = wire.TinkerPath.of_checkpoint(model_id, checkpoint_id)
    row = catalog.readable_checkpoint(session, principal.organization_id, path)
    if path.kind != "external":
        raise InvalidRequest(
            f"{path} is not exported weights; export them with save_weights_external (`tinker checkpoint "
            "download` does this for a tinker://.../weights/... path)",
            param="checkpoint_id",
        )
    publication = row.id if row.organization_id != principal.organization_id else row.origin_checkpoint_id
    grant = signed_urls.Grant.of(principal, publication_id=publication)
    urls, expires = {}, utcnow()
    for name in EXTERNAL_FILES:
        urls[name], expires = signed_urls.download_url(settings, store, external_file_key(row.object_key, name), grant)
    return wire.ExternalWeightsUrlsResponse(urls=urls, expires=expires)


# ---- the presented key ----------------------------------------------------------------------


def self_api_key(session: Session, principal: Principal) -> wire.SelfApiKeyResponse:
    """The key that made this request, as `tinker auth login` verifies it. Mint's keys belong to
    an organization, not a person, so the user's email is empty."""
    key = session.get(ApiKey, principal.key_id) if principal.key_id else None
    if key is None:
        raise NotFound("this request carries no API key of its own")
    organization = session.get(Organization, key.organization_id)
    assert organization is not None
    return wire.SelfApiKeyResponse(
        key_id=int.from_bytes(hashlib.sha256(key.id.encode()).digest()[:6], "big"),
        name=key.name,
        note=f"Mint key {key.id} ({key.prefix}...), role {key.role}",
        details=wire.ApiKeyDetails(
            org_details=wire.ApiKeyOrgDetails(name=organization.name),
            user_details=wire.ApiKeyUserDetails(email=""),
        ),
    )


# ---- tokenizers -----------------------------------------------------------------------------


def tokenizer_archive(settings: Settings, base_model: str) -> ObjectStream:
    """The base's tokenizer files as a tar, opened for streaming to clients on other machines."""
    try:
        return object_store_for(settings).stream(tokenizer_key(base_model))
    except NotFound:
        raise NotFound(
            f"no tokenizer of base {base_model!r} yet: a worker of the base saves it when it first creates a model",
            param="base_model",
        ) from None


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
    try:
        unpack_folder(store.get_bytes(tokenizer_key(base_model)), staging)
    except BaseException:  # an archive that cannot be unpacked leaves no half-made folder behind
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        os.replace(staging, folder)
    except OSError:  # unpacked concurrently by another request: keep theirs
        for path in staging.iterdir():
            path.unlink()
        staging.rmdir()
    return folder

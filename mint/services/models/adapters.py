"""Adapters and their versions: immutable PEFT adapters in the object store, named by content.

A version is one tar archive of the two PEFT files (`adapter_config.json`,
`adapter_model.safetensors`), written deterministically (sorted names, zero times and
owners) so the same weights always give the same sha256. The archive is stored under that
hash (`adapters/sha256/<hex>.tar`), which is also the key of the serving cache: a new
version is a new key, never a stale cache hit.

A full-parameter job's version (`kind` full) is a whole transformers checkpoint instead
(`extract_model`): it is evaluated on a worker of its base and downloaded like any version,
but never served by multi-LoRA serving nodes or deployed (`require_lora` says so).

Model references name what to sample from: a base (`tiny-glm-moe`) or an adapter version
(`my-adapter@3`; `my-adapter` alone is its newest ready version). Every use case resolves them
through the catalog (`mint.services.catalog.resolve_model_ref`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest, NotFound
from mint.services import catalog
from mint.storage.archives import pack_folder, unpack_folder
from mint.storage.keys import PEFT_FILES, adapter_key
from mint.storage.objects import ObjectStore
from mint.storage.queries import PageResult, get_owned, owned_by, paginate
from mint.storage.tables import Adapter, AdapterVersion, new_id

# What a whole-model (full-parameter) version's archive may hold: never a pickle.
MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".jinja", ".txt", ".model", ".tiktoken")
MAX_ARCHIVE_BYTES = 8 * 1024**3


def archive_adapter(folder: Path) -> bytes:
    """The PEFT files of `folder` as a deterministic, uncompressed tar."""
    return pack_folder(folder, PEFT_FILES)


def extract_adapter(data: bytes, folder: Path) -> Path:
    """Write the PEFT files of an archive into `folder`; anything else in it is refused."""
    return unpack_folder(data, folder, exactly=PEFT_FILES, param="file")


def extract_model(data: bytes, folder: Path) -> Path:
    """Write the files of a whole-model version (a full-parameter job's transformers checkpoint:
    config, safetensors weights, tokenizer) into `folder`; only those kinds of files are taken,
    so a pickled checkpoint never reaches a loader."""
    unpack_folder(data, folder)
    refused = sorted(path.name for path in folder.iterdir() if not path.name.endswith(MODEL_FILE_SUFFIXES))
    if refused:
        raise InvalidRequest(f"a whole-model version holds config, safetensors and tokenizer files only, not {refused}")
    return folder


def adapter_for_base(session: Session, *, organization_id: str, name: str, base_model: str) -> Adapter | None:
    """The organization's adapter `name`, if it exists; a conflict if it is another base's.

    A job checks its `suffix` with it at create, so a name taken on another base is refused
    before any training, not when the trained version is registered."""
    adapter = catalog.adapter_named(session, organization_id, name)
    if adapter is not None and adapter.base_model != base_model:
        raise Conflict(
            f"adapter {name!r} belongs to base {adapter.base_model!r}, not {base_model!r}; choose another name",
            param="suffix",
        )
    return adapter


def ensure_adapter(session: Session, *, organization_id: str, name: str, base_model: str) -> Adapter:
    """The organization's adapter `name` on `base_model`, created if new; another base is a conflict."""
    adapter = adapter_for_base(session, organization_id=organization_id, name=name, base_model=base_model)
    if adapter is None:
        adapter = Adapter(id=new_id("adapter"), organization_id=organization_id, name=name, base_model=base_model)
        session.add(adapter)
        session.flush()
    return adapter


def _hold_numbering(session: Session, adapter: Adapter) -> None:
    """Hold the adapter's version numbering until this transaction ends.

    Two versions registered at once (two jobs of one suffix finishing together) would both read
    the same newest version and collide on it. A no-op UPDATE of the adapter's row takes its row
    lock on PostgreSQL and the write lock on SQLite, so the second waits, then reads the first's
    version."""
    session.execute(
        update(Adapter)
        .where(Adapter.id == adapter.id)
        .values(name=Adapter.name)
        .execution_options(synchronize_session=False)
    )


def register_version(
    session: Session,
    store: ObjectStore,
    *,
    organization_id: str,
    name: str,
    base_model: str,
    archive: bytes,
    lora: dict[str, Any],
    training_job_id: str | None = None,
    metrics: dict[str, Any] | None = None,
    parent_version_id: str | None = None,
    status: str = "ready",
    kind: str = "lora",
) -> AdapterVersion:
    """Store an adapter archive (once per content) and record it as the adapter's next version,
    with the version it was trained from (`parent_version_id`), if any; an upload starts
    `validating` (`mint.services.models.uploads`)."""
    stored = store.put_content(archive, adapter_key)
    key, sha256 = stored.key, stored.sha256
    adapter = ensure_adapter(session, organization_id=organization_id, name=name, base_model=base_model)
    _hold_numbering(session, adapter)
    newest = session.execute(
        select(func.max(AdapterVersion.version)).where(AdapterVersion.adapter_id == adapter.id)
    ).scalar_one()
    version = AdapterVersion(
        id=new_id("adv"),
        adapter_id=adapter.id,
        version=(newest or 0) + 1,
        kind=kind,
        object_key=key,
        sha256=sha256,
        size_bytes=len(archive),
        base_model=base_model,
        rank=int(lora.get("rank", 0)),
        alpha=float(lora.get("alpha", 0.0)),
        targets={"modules": lora.get("targets", [])},
        training_job_id=training_job_id,
        parent_version_id=parent_version_id,
        metrics=metrics or {},
        status=status,
    )
    session.add(version)
    session.flush()
    return version


def require_lora(version: AdapterVersion, ref: str, *, param: str) -> None:
    """Refuse (400, naming `param`) a whole-model version (`kind` full) where a LoRA adapter is
    needed: serving nodes and deployments hold LoRA adapters on their shared resident base."""
    if version.kind == "lora":
        return
    download = f"GET /v1/adapters/{version.adapter_id}/versions/{version.version}/download"
    raise InvalidRequest(
        f"{ref} is a whole model trained with training_type 'full'; serving nodes hold LoRA adapters on a shared "
        f"base, so it cannot be served or deployed there. Evaluate it with POST /v1/evals, download it "
        f"({download}, or `mint adapters download {ref}`), or register the downloaded folder as a base "
        "(a `local_path` source in configs/models) to serve it",
        param=param,
    )


def get_adapter(session: Session, organization_id: str, adapter_id: str) -> Adapter:
    return get_owned(session, Adapter, adapter_id, organization_id=organization_id, noun="adapter")


def list_adapters(session: Session, organization_id: str, *, after: str | None, limit: int) -> PageResult[Adapter]:
    """One page of the organization's adapters, newest first."""
    return paginate(session, owned_by(Adapter, organization_id), Adapter, after=after, limit=limit)


def list_versions(session: Session, adapter: Adapter) -> list[AdapterVersion]:
    """Every version of an adapter, newest first."""
    query = select(AdapterVersion).where(AdapterVersion.adapter_id == adapter.id)
    return list(session.execute(query.order_by(AdapterVersion.version.desc())).scalars())


def get_version(session: Session, organization_id: str, adapter_id: str, version: int) -> AdapterVersion:
    adapter = get_adapter(session, organization_id, adapter_id)
    row = session.execute(
        select(AdapterVersion).where(AdapterVersion.adapter_id == adapter.id, AdapterVersion.version == version)
    ).scalar_one_or_none()
    if row is None:
        raise NotFound(f"adapter {adapter.name!r} has no version {version}", param="version")
    return row

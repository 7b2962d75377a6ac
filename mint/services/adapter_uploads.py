"""Adapters brought in from outside Mint (trained with TRL, verl, OpenRLHF, plain peft, ...).

An upload is a PEFT folder: `adapter_config.json` and `adapter_model.safetensors`, as two files
or one tar archive. The API checks what it can read without the base (`mint.trainer.peft_files`):
plain LoRA settings, a safetensors header of LoRA A/B pairs, the base enabled, the sizes. A bad
upload is a 400 that names what is wrong, and nothing is stored. A good one becomes the adapter's
next version, `validating`, and a message goes to the workers of its base
(`VALIDATE_ADAPTER_TASK`). A worker loads it into its resident base exactly as evals, serving
and warm starts will (`ResidentBase.create_session_from_adapter`): every tensor must name a
module or parameter of the base with the shape the rank gives. The version is then `ready`,
and can be evaluated, deployed and trained on (`from_adapter`), or `invalid` with the loader's
message in `error`. A message lost before a worker took it is sent again by the reconciler.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import InvalidRequest, MintError, NotFound, PayloadTooLarge
from mint.services import adapters
from mint.services.audit import record_audit
from mint.services.dispatch import Dispatch
from mint.services.principal import Principal
from mint.storage.db import session_scope
from mint.storage.objects import ObjectStore, object_store_for
from mint.storage.tables import AdapterVersion, BaseModelRow, as_utc, utcnow
from mint.trainer import peft_files

VALIDATE_ADAPTER_TASK = "mint.adapters.validate"
CONFIG_FILE, WEIGHTS_FILE = adapters.PEFT_FILES


def validation_task_id(version_id: str) -> str:
    return f"validate-{version_id}"


def upload_files(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """The two PEFT files of an upload: given as themselves, or as one tar archive."""
    if len(files) == 1 and next(iter(files)).endswith(".tar"):
        with tempfile.TemporaryDirectory(prefix="mint-upload-") as scratch:
            folder = adapters.extract_adapter(next(iter(files.values())), Path(scratch))
            return {name: (folder / name).read_bytes() for name in adapters.PEFT_FILES}
    names = sorted(files)
    if names != sorted(adapters.PEFT_FILES):
        raise InvalidRequest(
            f"an adapter upload is {CONFIG_FILE} and {WEIGHTS_FILE} (a PEFT folder, as save_pretrained writes "
            f"it), as two files or one .tar archive; got {', '.join(names) or 'no files'}",
            param="files",
        )
    return dict(files)


def check_upload(files: Mapping[str, bytes]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The adapter's config and its LoRA description (rank, alpha, targets), or InvalidRequest."""
    try:
        config = json.loads(files[CONFIG_FILE])
        options = peft_files.lora_options(config)
    except ValueError as exc:
        raise InvalidRequest(f"{CONFIG_FILE} is not a LoRA config Mint can load: {exc}", param="files") from None
    try:
        tensors = peft_files.safetensors_header(files[WEIGHTS_FILE])
    except ValueError as exc:
        raise InvalidRequest(f"{WEIGHTS_FILE} is not a safetensors file: {exc}", param="files") from None
    problems = peft_files.lora_weight_problems(tensors)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise InvalidRequest(f"{WEIGHTS_FILE} is not a LoRA adapter: {'; '.join(problems[:3])}{more}", param="files")
    targets = [*(options.target_modules or []), *(options.target_parameters or [])]
    return config, {"rank": options.rank, "alpha": options.alpha, "targets": targets, "tensors": len(tensors)}


def upload_adapter(
    session: Session,
    store: ObjectStore,
    send: Dispatch,
    actor: Principal,
    *,
    name: str,
    base_model: str,
    files: Mapping[str, bytes],
    max_bytes: int,
) -> AdapterVersion:
    """Check an uploaded PEFT adapter, store it as the adapter's next version (`validating`),
    commit, and ask a worker of its base to load it."""
    actor.require("developer")
    size = sum(len(data) for data in files.values())
    if size > max_bytes:
        raise PayloadTooLarge(
            f"the adapter is {size} bytes; uploads are limited to {max_bytes} (MINT_MAX_UPLOAD_BYTES)"
        )
    base = session.get(BaseModelRow, base_model)
    if base is None or not base.enabled:
        raise NotFound(f"no enabled base model {base_model!r}; list them at /v1/base_models", param="base_model")
    peft = upload_files(files)
    _, lora = check_upload(peft)
    with tempfile.TemporaryDirectory(prefix="mint-upload-") as scratch:
        for file_name, data in peft.items():
            (Path(scratch) / file_name).write_bytes(data)
        archive = adapters.archive_adapter(Path(scratch))
    version = adapters.register_version(
        session,
        store,
        organization_id=actor.organization_id,
        name=name,
        base_model=base_model,
        archive=archive,
        lora=lora,
        metrics={"uploaded": True, "tensors": lora["tensors"]},
        status="validating",
    )
    record_audit(
        session, actor, "adapter.upload", "adapter_version", version.id, {"name": name, "sha256": version.sha256}
    )
    session.commit()
    send_validation(version, send)
    return version


def send_validation(version: AdapterVersion, send: Dispatch) -> None:
    send(
        VALIDATE_ADAPTER_TASK,
        args=[version.id],
        task_id=validation_task_id(version.id),
        base_model=version.base_model,
    )


def validate_uploaded_version(settings: Settings, version_id: str, load_base: Callable[[str], Any]) -> str:
    """Load a `validating` version into this worker's resident base: `ready` if it fits, else
    `invalid` with the reason. A version no longer validating (a duplicate message) is left as it is."""
    with session_scope(settings.database) as session:
        version = session.get(AdapterVersion, version_id)
        if version is None or version.status != "validating":
            return "skipped"
        base_model, key = version.base_model, version.object_key
    base = load_base(base_model)
    error: str | None = None
    with tempfile.TemporaryDirectory(prefix="mint-validate-") as scratch:
        folder = adapters.extract_adapter(object_store_for(settings).get_bytes(key), Path(scratch))
        try:
            base.close(base.create_session_from_adapter(folder).session_id)
        except MintError as exc:  # whatever the loader refuses, with its reason (else the reconciler resends)
            error = exc.message.replace(str(folder), "the upload")
    with session_scope(settings.database) as session:
        version = session.get(AdapterVersion, version_id)
        if version is None or version.status != "validating":
            return "skipped"
        version.status, version.error = ("invalid", error) if error else ("ready", None)
        return version.status


def stranded_validations(
    session: Session, *, grace_s: float, pending: Callable[[str], frozenset[str] | None]
) -> list[AdapterVersion]:
    """Uploads still validating `grace_s` after they were made whose message is not in their
    base's queue (lost before a worker took it, or its worker died): to send again."""
    cutoff = utcnow() - timedelta(seconds=grace_s)
    rows = session.execute(select(AdapterVersion).where(AdapterVersion.status == "validating")).scalars()
    stranded, known = [], {}
    for row in rows:
        if as_utc(row.created_at) > cutoff:
            continue
        if row.base_model not in known:
            known[row.base_model] = pending(row.base_model)
        held = known[row.base_model]
        if held is None or validation_task_id(row.id) not in held:
            stranded.append(row)
    return stranded

"""Adapters brought in from outside Mint (trained with TRL, verl, OpenRLHF, plain peft, ...).

An upload is a PEFT folder: `adapter_config.json` and `adapter_model.safetensors`, as two files
or one tar archive (regular files only, read in memory, their declared sizes bounded by the upload
limit before any is read: `mint.storage.archives`). The API checks what it can read without the
base (`mint.trainer.peft_files`): a config of at most MAX_CONFIG_BYTES in JSON that Python's
parser reads safely (no NaN or Infinity, a bounded depth), plain LoRA settings, every number of
the config within its range, a safetensors header of LoRA A/B pairs, the base enabled, the
sizes. A bad upload is a 400 that names what is wrong, and nothing is stored. A good one becomes
the adapter's next version, `validating`, and a message goes to the workers of its base
(`VALIDATE_ADAPTER_TASK`). A worker loads it into its resident base exactly as evals, serving
and warm starts will (`ResidentBase.create_session_from_adapter`): every tensor must name a
module or parameter of the base with the shape the rank gives. The version is then `ready`,
and can be evaluated, deployed and trained on (`from_adapter`), or `invalid` with the loader's
message in `error`. A message lost before a worker took it is sent again by the reconciler.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import InvalidRequest, MintError, NotFound, PayloadTooLarge
from mint.schemas.fine_tuning import MAX_LORA_ALPHA
from mint.services.audit import record_audit
from mint.services.dispatch import Dispatch
from mint.services.models import adapters
from mint.services.principal import Principal
from mint.storage.archives import read_archive
from mint.storage.db import session_scope
from mint.storage.keys import PEFT_FILES
from mint.storage.objects import ObjectStore, object_store_for
from mint.storage.tables import AdapterVersion, BaseModelRow, as_utc, utcnow
from mint.trainer import peft_files

VALIDATE_ADAPTER_TASK = "mint.adapters.validate"
CONFIG_FILE, WEIGHTS_FILE = PEFT_FILES
# A PEFT config is a few KiB (a long list of target modules tens of KiB); Python holds a parsed
# JSON document in several times its bytes, so a config is read only up to this size.
MAX_CONFIG_BYTES = 1024 * 1024
# How deep an uploaded JSON document may nest: a PEFT config nests three levels at most. Python's
# parser recurses once a level (a RecursionError far deeper), and so do the readers after it.
MAX_JSON_DEPTH = 16
# The largest rank Mint trains (LoraOptions.rank), so the largest it loads.
MAX_LORA_RANK = 1024
# Every other number of a config (layer indices, token ids, bits, iterations) fits a 32-bit integer.
MAX_CONFIG_NUMBER = 2**31 - 1


def validation_task_id(version_id: str) -> str:
    return f"validate-{version_id}"


def upload_files(files: Mapping[str, bytes], *, max_bytes: int) -> dict[str, bytes]:
    """The two PEFT files of an upload: given as themselves, or as one tar archive, read in memory
    once its members are known to be those two regular files, `max_bytes` at most together."""
    if len(files) == 1 and next(iter(files)).endswith(".tar"):
        return read_archive(next(iter(files.values())), exactly=PEFT_FILES, param="files", max_bytes=max_bytes)
    names = sorted(files)
    if names != sorted(PEFT_FILES):
        raise InvalidRequest(
            f"an adapter upload is {CONFIG_FILE} and {WEIGHTS_FILE} (a PEFT folder, as save_pretrained writes "
            f"it), as two files or one .tar archive; got {', '.join(names) or 'no files'}",
            param="files",
        )
    return dict(files)


def _refuse_constant(name: str) -> Any:
    raise ValueError(
        f"it holds {name}, which is no JSON number (Python's json.dumps writes it unless allow_nan=False); "
        "write a finite number"
    )


def _parse_int(text: str) -> int:
    """An integer of the JSON text, refused before conversion when no setting could be that long
    (Python converts up to 4300 digits, and its message would tell a client to raise that limit)."""
    if len(text.lstrip("-")) > len(str(MAX_CONFIG_NUMBER)):
        raise ValueError(
            f"it holds an integer of {len(text.lstrip('-'))} digits; numbers of an adapter config are at most "
            f"{MAX_CONFIG_NUMBER} in size"
        )
    return int(text)


def _nesting(document: Any) -> int:
    """How many levels of arrays and objects a parsed JSON document nests (0: a plain value)."""
    deepest, pending = 0, [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, depth)
            pending.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return deepest


def read_json(data: bytes, what: str) -> Any:
    """An uploaded JSON document, or InvalidRequest naming `what`: for text that is not JSON, for
    NaN and Infinity (which Python's parser takes though JSON has no such numbers), and for
    nesting deeper than MAX_JSON_DEPTH (the parser recurses per level, and would end in a
    RecursionError)."""
    try:
        document = json.loads(data, parse_constant=_refuse_constant, parse_int=_parse_int)
    except RecursionError:
        raise InvalidRequest(
            f"{what} nests arrays or objects too deeply to read; an adapter's JSON nests at most "
            f"{MAX_JSON_DEPTH} levels",
            param="files",
        ) from None
    except ValueError as exc:  # not UTF-8, not JSON, or a constant refused above
        raise InvalidRequest(f"{what} is not JSON Mint can read: {exc}", param="files") from None
    depth = _nesting(document)
    if depth > MAX_JSON_DEPTH:
        raise InvalidRequest(
            f"{what} nests arrays or objects {depth} levels deep; an adapter's JSON nests at most {MAX_JSON_DEPTH}",
            param="files",
        )
    return document


def _numbers(document: Any, path: str = "") -> Iterator[tuple[str, int | float]]:
    """Every number of a parsed JSON document (of bounded depth) with where it is: `lora_alpha`,
    `loftq_config.loftq_bits`, `layers_to_transform[2]`."""
    if isinstance(document, dict):
        for key, value in document.items():
            yield from _numbers(value, f"{path}.{key}" if path else str(key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from _numbers(value, f"{path}[{index}]")
    elif isinstance(document, int | float) and not isinstance(document, bool):
        yield path, document


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 32 else f"{text[:16]}... ({len(text)} characters)"


# The LoRA settings engines compute with: the test each value passes, and the range said when it fails.
LORA_NUMBER_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "r": (
        lambda rank: isinstance(rank, int) and not isinstance(rank, bool) and 1 <= rank <= MAX_LORA_RANK,
        f"the rank is a whole number from 1 to {MAX_LORA_RANK}",
    ),
    "lora_alpha": (
        lambda alpha: _is_number(alpha) and 0 < alpha <= MAX_LORA_ALPHA,
        f"it is a number above 0 and at most {MAX_LORA_ALPHA:g} (LoRA scales its update by lora_alpha / r)",
    ),
    "lora_dropout": (
        lambda dropout: dropout is None or (_is_number(dropout) and 0 <= dropout < 1),
        "it is a fraction from 0 up to, not including, 1",
    ),
}


def config_number_problem(config: Mapping[str, Any]) -> str | None:
    """What is wrong with the numbers of an adapter config, or None: the rank, alpha and dropout
    within the ranges Mint trains with (LORA_NUMBER_RANGES), every other number finite and at most
    MAX_CONFIG_NUMBER in size. Engines compute with these (the update is scaled by lora_alpha / r):
    an infinite or huge one turns every output into NaN, or overflows where it is an integer."""
    for key, (valid, expected) in LORA_NUMBER_RANGES.items():
        if key in config and not valid(config[key]):
            return f"{key} is {_shown(config[key])}; {expected}"
    for path, value in _numbers(config):
        if not math.isfinite(value) or abs(value) > MAX_CONFIG_NUMBER:
            return (
                f"{path} is {_shown(value)}; every number of an adapter config is finite and at most "
                f"{MAX_CONFIG_NUMBER} in size"
            )
    return None


def check_upload(files: Mapping[str, bytes]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The adapter's config and its LoRA description (rank, alpha, targets), or InvalidRequest."""
    if len(files[CONFIG_FILE]) > MAX_CONFIG_BYTES:
        raise InvalidRequest(
            f"{CONFIG_FILE} is {len(files[CONFIG_FILE])} bytes; a PEFT config is a few KiB, at most "
            f"{MAX_CONFIG_BYTES}: upload the config save_pretrained wrote",
            param="files",
        )
    config = read_json(files[CONFIG_FILE], CONFIG_FILE)
    if not isinstance(config, dict):
        raise InvalidRequest(
            f"{CONFIG_FILE} is not a JSON object; save the adapter with save_pretrained", param="files"
        )
    problem = config_number_problem(config)
    if problem is not None:
        raise InvalidRequest(f"{CONFIG_FILE}: {problem}; fix it and upload again", param="files")
    try:
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
    peft = upload_files(files, max_bytes=max_bytes)
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

"""Datasets: JSONL uploads, validated row by row, stored once per content hash.

An upload is streamed to a local spool file while it is hashed and measured (past the size
limit it is refused at once), then every line is checked by the validator of its kind, one
line in memory at a time (a line longer than `max_row_bytes` is refused, so a file with no
newlines is never read whole), then the spool is streamed into the object store:

- `chat`: OpenAI chat rows `{"messages": [...], "tools"?: [...]}`, for supervised jobs;
- `preference`: `{"input": {...}, "preferred_output": [...], "non_preferred_output": [...]}`,
  for DPO jobs;
- `prompts`: conversations that end before the assistant's turn, with a `reference` and
  optional `environment` (scripted tool results, or a registered environment's name), for
  reinforcement jobs.

The kind is given, or read from the first row. A file with any invalid row is refused as a
whole with errors that name the line and the field, and nothing is stored. Content lives in
the object store under its sha256 (`datasets/sha256/<hex>.jsonl`), so identical content is
stored once; uploading the same file twice returns the same dataset.
"""

from __future__ import annotations

import hashlib
import io
import json
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, BinaryIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.chat.rows import validate_chat_row, validate_preference_row, validate_prompt_row
from mint.errors import InvalidRequest, NotFound, PayloadTooLarge
from mint.evals.agent_environments import prompt_row_environment_errors
from mint.schemas.common import loads_finite
from mint.storage.keys import dataset_key
from mint.storage.objects import ObjectStore
from mint.storage.queries import PageResult, insert_or_first, owned_by, paginate
from mint.storage.tables import DATASET_KINDS, Dataset, new_id

VALIDATORS: dict[str, Callable[[Any], list[str]]] = {
    "chat": validate_chat_row,
    "preference": validate_preference_row,
    "prompts": lambda row: validate_prompt_row(row) or prompt_row_environment_errors(row),
}
# Which dataset kind each fine-tuning method trains on.
KIND_OF_METHOD = {"sft": "chat", "dpo": "preference", "rl": "prompts"}
MAX_REPORTED_ERRORS = 20
SPOOL_IN_MEMORY_BYTES = 8 * 1024 * 1024
CHUNK_BYTES = 1024 * 1024


def infer_kind(row: Any) -> str:
    """The kind a first row looks like: DPO fields, a finished conversation, or a prompt."""
    if isinstance(row, dict) and ("preferred_output" in row or "non_preferred_output" in row):
        return "preference"
    messages = row.get("messages") if isinstance(row, dict) else None
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return "chat" if messages[-1].get("role") == "assistant" else "prompts"
    return "chat"


def _spool(source: BinaryIO | Iterable[bytes], max_bytes: int) -> tuple[IO[bytes], str, int]:
    """Copy the upload to a spool file, hashing as it goes; refuse it past `max_bytes`."""
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES)  # noqa: SIM115 - returned open
    digest, size = hashlib.sha256(), 0
    chunks = iter(lambda: source.read(CHUNK_BYTES), b"") if hasattr(source, "read") else iter(source)
    for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            spool.close()
            raise PayloadTooLarge(
                f"the file is larger than the {max_bytes}-byte upload limit; split it into smaller files",
                param="file",
            )
        digest.update(chunk)
        spool.write(chunk)
    spool.seek(0)
    return spool, digest.hexdigest(), size


class RowTooLong(Exception):
    """A line of a dataset is longer than the row limit."""


def _rows(spool: IO[bytes], max_row_bytes: int) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, parsed row or None, parse error or None) for each non-blank line; raises
    RowTooLong at a line over `max_row_bytes`, having read no more than that of it."""
    for number, line in enumerate(iter(lambda: spool.readline(max_row_bytes + 2), b""), start=1):
        if len(line.rstrip(b"\r\n")) > max_row_bytes:
            raise RowTooLong(
                f"line {number}: longer than {max_row_bytes} bytes, the row limit (MINT_MAX_DATASET_ROW_BYTES); "
                "write one row per line, and shorten the row"
            )
        raw = line.decode("utf-8")
        if not raw.strip():
            continue
        try:
            # NaN and Infinity are not JSON: a row holding one is refused like any other bad line.
            yield number, loads_finite(raw), None
        except json.JSONDecodeError as exc:
            yield number, None, f"not valid JSON ({exc.msg} at column {exc.colno}); write one JSON object per line"
        except ValueError as exc:
            yield number, None, f"not valid JSON ({exc}); write one JSON object per line"


def _text_bytes(messages: Any) -> int:
    """UTF-8 bytes of the assistant turns of a message list: what SFT and DPO put loss on."""
    if not isinstance(messages, list):
        return 0
    total = 0
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "assistant":
            total += len(json.dumps([message.get("content"), message.get("tool_calls")], ensure_ascii=False).encode())
    return total


def trained_bytes(kind: str, row: dict[str, Any]) -> int:
    """Bytes of a row that training puts loss on (0 for prompts: RL trains on what it samples).
    Kept in the validation report, so an estimate can count trained tokens before any job ran."""
    if kind == "chat":
        return _text_bytes(row.get("messages"))
    if kind == "preference":
        return _text_bytes(row.get("preferred_output")) + _text_bytes(row.get("non_preferred_output"))
    return 0


def validate_rows(spool: IO[bytes], kind: str | None, max_row_bytes: int) -> tuple[str, int, list[str], int]:
    """(kind, row count, errors as `line N: field: problem`, trained bytes) of a JSONL file."""
    count, errors, trained = 0, [], 0
    try:
        for number, row, parse_error in _rows(spool, max_row_bytes):
            count += 1
            if parse_error is None and kind is None:
                kind = infer_kind(row)
            problems = [parse_error] if parse_error else VALIDATORS[kind or "chat"](row)
            errors += [f"line {number}: {problem}" for problem in problems]
            if not problems:
                trained += trained_bytes(kind or "chat", row)
            if len(errors) >= MAX_REPORTED_ERRORS:
                break
    except UnicodeDecodeError as exc:
        errors.append(f"the file is not UTF-8 text (byte {exc.start}); save it as UTF-8 JSONL")
    except RowTooLong as exc:
        errors.append(str(exc))
    return kind or "chat", count, errors[:MAX_REPORTED_ERRORS], trained


def _refuse(kind: str, errors: list[str], count: int) -> InvalidRequest:
    shown = "; ".join(errors[:5])
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    if not errors:
        return InvalidRequest("the file holds no rows; write one JSON object per line", param="file")
    return InvalidRequest(f"invalid {kind} dataset, nothing was stored: {shown}{more}", param="file")


def store_dataset(
    session: Session,
    store: ObjectStore,
    *,
    organization_id: str,
    filename: str,
    source: BinaryIO | Iterable[bytes],
    kind: str | None = None,
    purpose: str = "fine-tune",
    max_bytes: int,
    max_row_bytes: int,
    source_eval_run_id: str | None = None,
) -> Dataset:
    """Validate an upload and record it; the same content and kind again returns the same dataset."""
    if kind is not None and kind not in DATASET_KINDS:
        raise InvalidRequest(f"unknown dataset kind {kind!r}; use one of: {', '.join(DATASET_KINDS)}", param="kind")
    spool, sha256, size = _spool(source, max_bytes)
    with spool:
        kind, count, errors, trained = validate_rows(spool, kind, max_row_bytes)
        if errors or count == 0:
            raise _refuse(kind, errors, count)
        existing = _same_content(session, organization_id, sha256, kind)
        if existing is not None:
            return existing
        key = dataset_key(sha256)
        if not store.exists(key):
            spool.seek(0)
            store.put(key, spool, max_bytes=max_bytes)
    dataset = Dataset(
        id=new_id("file"),
        organization_id=organization_id,
        filename=filename,
        purpose=purpose,
        kind=kind,
        status="ready",
        object_key=key,
        sha256=sha256,
        size_bytes=size,
        row_count=count,
        validation_report={"rows": count, "errors": [], "trained_bytes": trained},
        source_eval_run_id=source_eval_run_id,
    )
    # The same file uploaded twice at once: both stored the same object; the first row wins.
    return insert_or_first(session, dataset, lambda: _same_content(session, organization_id, sha256, kind))


def _same_content(session: Session, organization_id: str, sha256: str, kind: str) -> Dataset | None:
    query = select(Dataset).where(
        Dataset.organization_id == organization_id, Dataset.sha256 == sha256, Dataset.kind == kind
    )
    return session.execute(query).scalar_one_or_none()


def create_dataset_from_rows(
    session: Session,
    store: ObjectStore,
    *,
    organization_id: str,
    kind: str,
    rows: list[dict[str, Any]],
    filename: str,
    source_eval_run_id: str | None = None,
) -> Dataset:
    """A dataset made by Mint itself (e.g. mined from failed trajectories), validated like an upload."""
    content = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
    return store_dataset(
        session,
        store,
        organization_id=organization_id,
        filename=filename,
        source=io.BytesIO(content),
        kind=kind,
        max_bytes=max(len(content), 1),
        max_row_bytes=max(len(content), 1),
        source_eval_run_id=source_eval_run_id,
    )


def get_dataset(session: Session, organization_id: str, dataset_id: str) -> Dataset:
    """The organization's dataset by id; an unknown id that is the file name of an upload gets
    that upload's id, and any other how to upload one."""
    row = session.get(Dataset, dataset_id)
    if row is not None and row.organization_id == organization_id:
        return row
    uploads = session.execute(
        select(Dataset.id)
        .where(Dataset.organization_id == organization_id, Dataset.filename == dataset_id)
        .order_by(Dataset.created_at.desc())
        .limit(3)
    ).scalars()
    ids = ", ".join(uploads)
    hint = f"{dataset_id!r} is the file name of {ids}: pass an id" if ids else "upload one with POST /v1/files"
    raise NotFound(f"No dataset with id {dataset_id!r} in this organization; {hint}", param="id")


def list_datasets(session: Session, organization_id: str, *, after: str | None, limit: int) -> PageResult[Dataset]:
    """One page of the organization's datasets (OpenAI's files), newest first."""
    return paginate(session, owned_by(Dataset, organization_id), Dataset, after=after, limit=limit)


def content_key(dataset: Dataset) -> str:
    """The object key of a dataset's JSONL."""
    if dataset.object_key is None:
        raise NotFound(f"dataset {dataset.id!r} has no stored content", param="id")
    return dataset.object_key


def read_rows(store: ObjectStore, dataset: Dataset) -> list[dict[str, Any]]:
    """Every row of a stored dataset, in file order (a worker's training data, read whole)."""
    text = store.get_bytes(content_key(dataset)).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def require_kind(dataset: Dataset, kind: str, param: str) -> None:
    """Refuse a dataset of another kind, saying which kind the job needs."""
    if dataset.status != "ready":
        raise InvalidRequest(f"dataset {dataset.id!r} is {dataset.status}, not ready", param=param)
    if dataset.kind != kind:
        raise InvalidRequest(
            f"dataset {dataset.id!r} holds {dataset.kind} rows, but this method trains on {kind} rows", param=param
        )

"""Datasets: JSONL or parquet uploads, validated row by row, stored once per content hash.

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

Rows may be written for TRL, verl or OpenRLHF (`mint.chat.formats`): each row's format is
named by the upload or read from its keys, and the row is converted to Mint's shape before its
kind's validator sees it. Parquet files (by name or by their `PAR1` magic) are read a batch of
rows at a time, after their footer showed the data fits the upload limit uncompressed. Mint's
own JSONL is stored as uploaded; any other file is stored as its converted rows, so trainers
and evals read one shape, and the validation report names the source format and file.

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
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.chat.formats import (
    DEFAULT_OPTIONS,
    SOURCE_FORMATS,
    FormatOptions,
    SourceFormat,
    convert,
    detect,
    mint_kind,
    no_format_error,
)
from mint.chat.rows import validate_chat_row, validate_preference_row, validate_prompt_row
from mint.errors import InvalidRequest, NotFound, PayloadTooLarge
from mint.evals.agent_environments import prompt_row_environment_errors
from mint.evals.mining import MiningResult
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
PARQUET_MAGIC = b"PAR1"
PARQUET_BATCH_ROWS = 256
# Rows in Mint's shape may be somewhat longer than the uploaded rows (message objects around strings).
CONVERTED_GROWTH = 2


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


class UnreadableFile(Exception):
    """A parquet file pyarrow cannot read (or whose data is over the size limit)."""


def is_parquet(filename: str, spool: IO[bytes]) -> bool:
    """A parquet file by its name or by its magic bytes (`PAR1`)."""
    head = spool.read(4)
    spool.seek(0)
    return filename.lower().endswith(".parquet") or head == PARQUET_MAGIC


def _parquet_rows(spool: IO[bytes], max_bytes: int) -> Iterator[tuple[str, Any, str | None]]:
    """(`row N`, row, None) for each row of a parquet file, read a batch at a time.

    The footer's uncompressed size is checked first, so a small file that would expand past
    the upload limit is refused before any of it is decompressed.
    """
    import pyarrow as pa  # type: ignore[import-untyped]  # only parquet uploads need it
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    try:
        parquet = pq.ParquetFile(spool)
        metadata = parquet.metadata
        data_bytes = sum(metadata.row_group(index).total_byte_size for index in range(metadata.num_row_groups))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise UnreadableFile(f"the file is not a readable parquet file ({exc})") from None
    if data_bytes > max_bytes:
        raise UnreadableFile(
            f"the parquet file holds {data_bytes} bytes of data uncompressed, over the {max_bytes}-byte upload "
            "limit; split it into smaller files"
        )
    number = 0
    try:
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                number += 1
                yield f"row {number}", row, None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise UnreadableFile(f"row {number + 1}: the parquet file cannot be read there ({exc})") from None


def _jsonl_rows(spool: IO[bytes], max_row_bytes: int) -> Iterator[tuple[str, Any, str | None]]:
    for number, row, error in _rows(spool, max_row_bytes):
        yield f"line {number}", row, error


@dataclass
class CheckedRows:
    """What validating an upload found: the kind, rows kept, errors (`line N: field: problem`),
    bytes trained on, the source format of each row, rows skipped, and the rows in Mint's shape."""

    kind: str | None
    count: int
    errors: list[str]
    trained: int
    formats: Counter[str] = field(default_factory=Counter)
    skipped: int = 0
    canonical: IO[bytes] | None = None

    @property
    def source_format(self) -> str:
        """The rows' format, e.g. `verl` (formats joined by `+` in a file that mixes them)."""
        return "+".join(sorted(self.formats)) or "mint"


def validate_rows(
    spool: IO[bytes],
    kind: str | None,
    max_row_bytes: int,
    *,
    parquet: bool = False,
    source_format: SourceFormat | None = None,
    options: FormatOptions = DEFAULT_OPTIONS,
    max_bytes: int | None = None,
) -> CheckedRows:
    """Check a JSONL or parquet file row by row, each row read as `source_format` (or as the
    format its keys show) and converted to Mint's shape; the converted rows are written, one
    JSON object a line, to `canonical` (closed by the caller)."""
    limit = max_bytes if max_bytes is not None else max_row_bytes
    checked = CheckedRows(kind, 0, [], 0)
    canonical = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES)  # noqa: SIM115 - returned open
    checked.canonical = canonical
    written = 0
    rows = _parquet_rows(spool, limit) if parquet else _jsonl_rows(spool, max_row_bytes)
    try:
        for where, row, parse_error in rows:
            problems, line = _check_row(checked, row, parse_error, source_format, options, max_row_bytes)
            checked.errors += [f"{where}: {problem}" for problem in problems]
            if line is not None:
                written += len(line)
                if written > limit * CONVERTED_GROWTH:
                    checked.errors.append(f"{where}: the rows in Mint's shape pass the upload limit; split the file")
                    break
                canonical.write(line)
            if len(checked.errors) >= MAX_REPORTED_ERRORS:
                break
    except UnicodeDecodeError as exc:
        checked.errors.append(f"the file is not UTF-8 text (byte {exc.start}); save it as UTF-8 JSONL")
    except (RowTooLong, UnreadableFile) as exc:
        checked.errors.append(str(exc))
    checked.errors = checked.errors[:MAX_REPORTED_ERRORS]
    checked.kind = checked.kind or "chat"
    canonical.seek(0)
    return checked


def _check_row(
    checked: CheckedRows,
    row: Any,
    parse_error: str | None,
    source_format: SourceFormat | None,
    options: FormatOptions,
    max_row_bytes: int,
) -> tuple[list[str], bytes | None]:
    """One row's problems, and its line in Mint's shape (None when refused or skipped)."""
    if parse_error is not None:
        checked.count += 1
        return [parse_error], None
    source = source_format or detect(row, options)
    if source is None:
        checked.count += 1
        return [no_format_error(row)], None
    converted = convert(row, source, options)
    if converted.errors:
        checked.count += 1
        return converted.errors, None
    if converted.row is None:  # a row that trains nothing in Mint (an undesirable KTO completion)
        checked.skipped += 1
        return [], None
    checked.count += 1
    if checked.kind is None:  # the first row decides, unless the upload named the kind
        checked.kind = converted.kind or mint_kind(converted.row)
    kind = checked.kind
    if converted.kind is not None and converted.kind != kind:
        return [
            f"is a {converted.variant} row, which makes a {converted.kind} row, but this dataset holds {kind} "
            f"rows; upload {converted.kind} rows separately"
        ], None
    problems = VALIDATORS[kind](converted.row)
    if problems:
        if source != "mint":
            problems = [f"{problem} (in the {converted.variant} row as Mint reads it)" for problem in problems]
        return problems, None
    try:
        line = (json.dumps(converted.row, ensure_ascii=False, allow_nan=False) + "\n").encode()
    except (TypeError, ValueError) as exc:
        return [f"holds a value JSON cannot hold ({exc}); write strings, numbers, lists and objects"], None
    if len(line) > max_row_bytes + 1:
        return [
            f"longer than {max_row_bytes} bytes in Mint's shape, the row limit (MINT_MAX_DATASET_ROW_BYTES); "
            "shorten the row"
        ], None
    checked.formats[source] += 1
    checked.trained += trained_bytes(kind, converted.row)
    return [], line


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
    source_format: SourceFormat | None = None,
    options: FormatOptions = DEFAULT_OPTIONS,
) -> Dataset:
    """Validate an upload (JSONL or parquet; Mint, TRL, verl or OpenRLHF rows) and record its
    rows in Mint's shape; the same content and kind again returns the same dataset.

    Mint's own JSONL is stored as uploaded; any other file is stored as its rows in Mint's
    shape, so every trainer and eval reads one shape. The dataset's sha256 is that of the
    stored content; the validation report names the source format and the uploaded file.
    """
    if kind is not None and kind not in DATASET_KINDS:
        raise InvalidRequest(f"unknown dataset kind {kind!r}; use one of: {', '.join(DATASET_KINDS)}", param="kind")
    if source_format is not None and source_format not in SOURCE_FORMATS:
        raise InvalidRequest(
            f"unknown format {source_format!r}; use one of: {', '.join(SOURCE_FORMATS)}, or omit it to detect it",
            param="format",
        )
    spool, sha256, size = _spool(source, max_bytes)
    with spool:
        parquet = is_parquet(filename, spool)
        checked = validate_rows(
            spool,
            kind,
            max_row_bytes,
            parquet=parquet,
            source_format=source_format,
            options=options,
            max_bytes=max_bytes,
        )
        assert checked.canonical is not None
        with checked.canonical as canonical:
            kind = checked.kind or "chat"
            if checked.errors or checked.count == 0:
                raise _refuse(kind, checked.errors, checked.count)
            report: dict[str, Any] = {
                "rows": checked.count,
                "errors": [],
                "trained_bytes": checked.trained,
                "source_format": checked.source_format,
            }
            content = spool
            if parquet or checked.source_format != "mint":
                # Stored in Mint's shape: the dataset's hash and size are those of what is stored.
                report["source_file"] = {"type": "parquet" if parquet else "jsonl", "sha256": sha256, "bytes": size}
                if checked.skipped:
                    report["skipped_rows"] = checked.skipped
                content, sha256, size = canonical, _hash(canonical), _length(canonical)
            existing = _same_content(session, organization_id, sha256, kind)
            if existing is not None:
                return existing
            key = dataset_key(sha256)
            if not store.exists(key):
                content.seek(0)
                store.put(key, content, max_bytes=max(size, 1))
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
        row_count=checked.count,
        validation_report=report,
        source_eval_run_id=source_eval_run_id,
    )
    # The same file uploaded twice at once: both stored the same object; the first row wins.
    return insert_or_first(session, dataset, lambda: _same_content(session, organization_id, sha256, kind))


def _hash(content: IO[bytes]) -> str:
    content.seek(0)
    digest = hashlib.sha256()
    for chunk in iter(lambda: content.read(CHUNK_BYTES), b""):
        digest.update(chunk)
    return digest.hexdigest()


def _length(content: IO[bytes]) -> int:
    return content.seek(0, io.SEEK_END)


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


def dataset_of_mined(
    session: Session,
    store: ObjectStore,
    result: MiningResult,
    *,
    organization_id: str,
    what: str,
    filename: str,
    source_eval_run_id: str | None = None,
) -> Dataset:
    """A dataset of the rows mined from `what` (a run's failures, corrected captures, expert
    corrections); refused (400) when none gave a row, with the first reasons why."""
    if not result.rows:
        raise InvalidRequest(
            f"none of {what} gives a {result.kind} row ({result.first_reasons()})",
            param="kind",
        )
    return create_dataset_from_rows(
        session,
        store,
        organization_id=organization_id,
        kind=result.kind,
        rows=result.rows,
        filename=filename,
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

"""Datasets, and their OpenAI-shaped twin, files: upload JSONL or parquet (a path, bytes or an
open file) of Mint's, TRL's, verl's or OpenRLHF's rows, list, read, and fetch the stored content.

The server validates every row and refuses a file with a bad row whole; the error's message
names the line and the field. Content is stored once per sha256, so uploading the same file
again returns the same dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from mint.schemas.common import Page
from mint.schemas.datasets import DatasetFormat, DatasetKind, DatasetPublic, FileObject
from mint.sdk._http import AsyncHTTP, Call, FileInput, SyncHTTP, Upload, filename_of, parse_bytes, parse_model
from mint.sdk.pagination import AsyncPager, PageCall, SyncPager


def _file_object(data: Any) -> FileObject:
    # FileObject is built from rows on the server, where the size is `size_bytes`; on the wire
    # it is OpenAI's `bytes`, which the schema reads only under its validation alias.
    if isinstance(data, dict) and "bytes" in data and "size_bytes" not in data:
        data = {**data, "size_bytes": data["bytes"]}
    return FileObject.model_validate(data)


def _file_page(response: httpx.Response) -> Page[FileObject]:
    body = response.json()
    return Page[FileObject](**{**body, "data": [_file_object(item) for item in body["data"]]})


def _upload(
    source: FileInput, kind: DatasetKind | None, purpose: str, filename: str | None, rows: RowFormat | None
) -> Upload:
    form = {"purpose": purpose} | ({"kind": kind} if kind else {}) | (rows.form() if rows else {})
    return Upload(source=source, filename=filename_of(source, filename), form=form)


@dataclass(frozen=True)
class RowFormat:
    """How an upload's rows are written: `format` (mint | trl | verl | openrlhf; the server reads
    it from each row's keys when omitted) and OpenRLHF's keys, renamed as with its own flags."""

    format: DatasetFormat | None = None
    input_key: str | None = None
    output_key: str | None = None
    label_key: str | None = None

    def form(self) -> dict[str, str]:
        return {name: value for name, value in vars(self).items() if value is not None}


# ---- the calls, shared by the blocking and the asyncio resources ----------------------------


def upload_dataset(
    source: FileInput, kind: DatasetKind | None, purpose: str, filename: str | None, rows: RowFormat | None = None
) -> Call[DatasetPublic]:
    upload = _upload(source, kind, purpose, filename, rows)
    return Call("POST", "/v1/datasets", parse_model(DatasetPublic), upload=upload)


def create_file(
    source: FileInput, kind: DatasetKind | None, purpose: str, filename: str | None, rows: RowFormat | None = None
) -> Call[FileObject]:
    upload = _upload(source, kind, purpose, filename, rows)
    return Call("POST", "/v1/files", lambda response: _file_object(response.json()), upload=upload)


def list_datasets(limit: int) -> PageCall:
    return lambda after: Call("GET", "/v1/datasets", parse_model(Page[DatasetPublic]), {"after": after, "limit": limit})


def list_files(limit: int) -> PageCall:
    return lambda after: Call("GET", "/v1/files", _file_page, {"after": after, "limit": limit})


def get_dataset(dataset_id: str) -> Call[DatasetPublic]:
    return Call("GET", f"/v1/datasets/{dataset_id}", parse_model(DatasetPublic))


def get_file(file_id: str) -> Call[FileObject]:
    return Call("GET", f"/v1/files/{file_id}", lambda response: _file_object(response.json()))


def content(prefix: str, dataset_id: str) -> Call[bytes]:
    return Call("GET", f"/v1/{prefix}/{dataset_id}/content", parse_bytes)


# ---- resources -------------------------------------------------------------------------------


class Datasets:
    """`/v1/datasets`: validated JSONL datasets (kind chat | preference | prompts)."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def upload(
        self,
        file: FileInput,
        *,
        kind: DatasetKind | None = None,
        purpose: str = "fine-tune",
        filename: str | None = None,
        rows: RowFormat | None = None,
    ) -> DatasetPublic:
        """Upload a JSONL or parquet file; `kind` is read from the first row when not given, and
        the rows' format (`rows=RowFormat(format="verl")`) from each row's keys."""
        return self._http.send(upload_dataset(file, kind, purpose, filename, rows))

    def list(self, *, limit: int = 20) -> SyncPager[DatasetPublic]:
        """Every dataset of the organization, newest first (`limit` per page)."""
        return SyncPager(self._http, list_datasets(limit))

    def get(self, dataset_id: str) -> DatasetPublic:
        return self._http.send(get_dataset(dataset_id))

    def content(self, dataset_id: str) -> bytes:
        """The JSONL as stored."""
        return self._http.send(content("datasets", dataset_id))


class Files:
    """`/v1/files`: the same datasets as OpenAI's files API shows them."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def create(
        self,
        file: FileInput,
        *,
        purpose: str = "fine-tune",
        kind: DatasetKind | None = None,
        filename: str | None = None,
        rows: RowFormat | None = None,
    ) -> FileObject:
        """Upload a JSONL or parquet file (OpenAI's `files.create`)."""
        return self._http.send(create_file(file, kind, purpose, filename, rows))

    def list(self, *, limit: int = 20) -> SyncPager[FileObject]:
        return SyncPager(self._http, list_files(limit))

    def get(self, file_id: str) -> FileObject:
        return self._http.send(get_file(file_id))

    def content(self, file_id: str) -> bytes:
        return self._http.send(content("files", file_id))


class AsyncDatasets:
    """`/v1/datasets`, for asyncio: the twin of `Datasets`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def upload(
        self,
        file: FileInput,
        *,
        kind: DatasetKind | None = None,
        purpose: str = "fine-tune",
        filename: str | None = None,
        rows: RowFormat | None = None,
    ) -> DatasetPublic:
        return await self._http.send(upload_dataset(file, kind, purpose, filename, rows))

    def list(self, *, limit: int = 20) -> AsyncPager[DatasetPublic]:
        return AsyncPager(self._http, list_datasets(limit))

    async def get(self, dataset_id: str) -> DatasetPublic:
        return await self._http.send(get_dataset(dataset_id))

    async def content(self, dataset_id: str) -> bytes:
        return await self._http.send(content("datasets", dataset_id))


class AsyncFiles:
    """`/v1/files`, for asyncio: the twin of `Files`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def create(
        self,
        file: FileInput,
        *,
        purpose: str = "fine-tune",
        kind: DatasetKind | None = None,
        filename: str | None = None,
        rows: RowFormat | None = None,
    ) -> FileObject:
        return await self._http.send(create_file(file, kind, purpose, filename, rows))

    def list(self, *, limit: int = 20) -> AsyncPager[FileObject]:
        return AsyncPager(self._http, list_files(limit))

    async def get(self, file_id: str) -> FileObject:
        return await self._http.send(get_file(file_id))

    async def content(self, file_id: str) -> bytes:
        return await self._http.send(content("files", file_id))

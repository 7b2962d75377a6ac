"""Datasets and their OpenAI-shaped twin, files: streamed JSONL uploads, validated row by row.

`POST /v1/files` is what the official `openai` client's `files.create` sends (multipart,
`file` and `purpose`); `POST /v1/datasets` takes the same upload with Mint's answer shape.
Both may name the `kind` (chat | preference | prompts); otherwise the first row decides. The file
is JSONL or parquet, of Mint's, TRL's, verl's or OpenRLHF's rows: `format` names it, or each row's
keys show it; OpenRLHF's `input_key`, `output_key` and `label_key` may be renamed as in OpenRLHF.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, UploadFile
from fastapi.responses import StreamingResponse

from mint.api.deps import CurrentPrincipal, SessionDep, SettingsDep
from mint.api.downloads import JSONL_MEDIA_TYPE, stream_object
from mint.api.pagination import After, Limit, id_path, page_of
from mint.chat.formats import FormatOptions
from mint.schemas.common import Page
from mint.schemas.datasets import DatasetFormat, DatasetKind, DatasetPublic, FileObject
from mint.services import datasets
from mint.storage.objects import object_store_for
from mint.storage.tables import Dataset

router = APIRouter(tags=["datasets"])

DatasetId = Annotated[str, id_path("The dataset's id, e.g. `file_...`.")]


def _upload(
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
    file: UploadFile,
    purpose: str,
    kind: DatasetKind | None,
    source: SourceOptions,
) -> Dataset:
    # The request gate limits the body to the file's limit plus its multipart envelope; the
    # service refuses a file over settings.max_upload_bytes while it spools it.
    return datasets.store_dataset(
        session,
        object_store_for(settings),
        organization_id=principal.organization_id,
        filename=file.filename or "upload.jsonl",
        source=file.file,
        kind=kind,
        purpose=purpose,
        max_bytes=settings.max_upload_bytes,
        max_row_bytes=settings.max_dataset_row_bytes,
        source_format=source.format,
        options=FormatOptions(input_key=source.input_key, output_key=source.output_key, label_key=source.label_key),
    )


def _content(
    session: SessionDep, settings: SettingsDep, principal: CurrentPrincipal, dataset_id: str
) -> StreamingResponse:
    """The stored JSONL, streamed from the object store (a file may be `max_upload_bytes` large)."""
    dataset = datasets.get_dataset(session, principal.organization_id, dataset_id)
    stream = object_store_for(settings).stream(datasets.content_key(dataset))
    return stream_object(stream, media_type=JSONL_MEDIA_TYPE)


JSONL_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"description": "The JSONL file.", "content": {"application/jsonl": {"schema": {"type": "string"}}}}
}
Upload = Annotated[UploadFile, File(description="The JSONL file (one row per line), or a parquet file.")]
Purpose = Annotated[str, Form(max_length=50, pattern=r"^[a-z0-9_-]+$")]
Kind = Annotated[
    DatasetKind | None, Form(description="chat | preference | prompts; read from the first row if omitted.")
]

RowKey = Annotated[str, Form(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")]


@dataclass
class SourceOptions:
    """How the file's rows are written: their format, and OpenRLHF's keys."""

    format: Annotated[
        DatasetFormat | None,
        Form(description="mint | trl | verl | openrlhf; read from each row's keys if omitted."),
    ] = None
    input_key: RowKey = "input"
    output_key: RowKey = "output"
    label_key: RowKey = "label"


Source = Annotated[SourceOptions, Depends()]


@router.post("/v1/datasets", response_model=DatasetPublic, status_code=201)
def upload_dataset(
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
    file: Upload,
    source: Source,
    kind: Kind = None,
    purpose: Purpose = "fine-tune",
) -> Dataset:
    """Upload a JSONL or parquet dataset (Mint, TRL, verl or OpenRLHF rows); it is validated row by
    row and stored, in Mint's shape, only if every row is valid."""
    return _upload(session, settings, principal, file, purpose, kind, source)


@router.get("/v1/datasets", response_model=Page[DatasetPublic])
def list_datasets(
    session: SessionDep, principal: CurrentPrincipal, after: After = None, limit: Limit = 20
) -> Page[DatasetPublic]:
    result = datasets.list_datasets(session, principal.organization_id, after=after, limit=limit)
    return page_of(result, DatasetPublic)


@router.get("/v1/datasets/{dataset_id}", response_model=DatasetPublic)
def get_dataset(dataset_id: DatasetId, session: SessionDep, principal: CurrentPrincipal) -> Dataset:
    return datasets.get_dataset(session, principal.organization_id, dataset_id)


@router.get("/v1/datasets/{dataset_id}/content", response_class=StreamingResponse, responses=JSONL_RESPONSE)
def dataset_content(
    dataset_id: DatasetId, session: SessionDep, settings: SettingsDep, principal: CurrentPrincipal
) -> StreamingResponse:
    """The dataset's JSONL, as stored."""
    return _content(session, settings, principal, dataset_id)


@router.post("/v1/files", response_model=FileObject, status_code=200)
def upload_file(
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
    file: Upload,
    source: Source,
    purpose: Purpose = "fine-tune",
    kind: Kind = None,
) -> Dataset:
    """OpenAI's `files.create`: the same validated upload, answered as a file object."""
    return _upload(session, settings, principal, file, purpose, kind, source)


@router.get("/v1/files", response_model=Page[FileObject])
def list_files(
    session: SessionDep, principal: CurrentPrincipal, after: After = None, limit: Limit = 20
) -> Page[FileObject]:
    result = datasets.list_datasets(session, principal.organization_id, after=after, limit=limit)
    return page_of(result, FileObject)


@router.get("/v1/files/{dataset_id}", response_model=FileObject)
def get_file(dataset_id: DatasetId, session: SessionDep, principal: CurrentPrincipal) -> Any:
    return datasets.get_dataset(session, principal.organization_id, dataset_id)


@router.get("/v1/files/{dataset_id}/content", response_class=StreamingResponse, responses=JSONL_RESPONSE)
def file_content(
    dataset_id: DatasetId, session: SessionDep, settings: SettingsDep, principal: CurrentPrincipal
) -> StreamingResponse:
    return _content(session, settings, principal, dataset_id)

"""Wire types for datasets, and their OpenAI-shaped view as files."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import AliasChoices, Field, field_serializer, field_validator

from mint.schemas.common import WireModel

DatasetKind = Literal["chat", "preference", "prompts"]
# How an uploaded file's rows are written (mint.chat.formats.SOURCE_FORMATS: the same names).
DatasetFormat = Literal["mint", "trl", "verl", "openrlhf"]


class DatasetPublic(WireModel):
    """A validated JSONL dataset: its kind, size, row count and content hash."""

    id: str
    object: Literal["dataset"] = "dataset"
    filename: str
    purpose: str
    kind: DatasetKind
    status: str
    sha256: str
    size_bytes: int
    row_count: int
    validation_report: dict[str, Any]
    source_eval_run_id: str | None = Field(default=None, description="The eval run it was mined from, if any.")
    created_at: datetime


class FileObject(WireModel):
    """A dataset as OpenAI's `files` API shows it (times in Unix seconds), plus Mint's kind."""

    id: str
    object: Literal["file"] = "file"
    bytes: int = Field(validation_alias=AliasChoices("size_bytes", "bytes"))
    created_at: datetime
    filename: str
    purpose: str
    status: Literal["processed", "error"] = "processed"
    status_details: str | None = None
    kind: DatasetKind
    row_count: int

    @field_validator("status", mode="before")
    @classmethod
    def _openai_status(cls, value: str) -> str:
        """Only validated files are stored, so a stored one is `processed` in OpenAI's words."""
        return "processed" if value in ("ready", "processed") else "error"

    @field_serializer("created_at")
    def _unix(self, moment: datetime) -> int:
        return int(moment.timestamp())

"""Wire types shared by every resource: the error body and OpenAI-style list pages."""

from __future__ import annotations

from typing import Annotated, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")

# Resource ids and names as they appear in URLs: no control characters (PostgreSQL refuses
# NUL in text, and nothing legitimate needs them), no spaces, no slashes.
ID_PATTERN = r"^[A-Za-z0-9_.:@-]+$"
# Labels people type (key names, descriptions' titles): any printable text.
LABEL_PATTERN = r"^[^\x00-\x1f\x7f]+$"

Label = Annotated[str, Field(min_length=1, max_length=200, pattern=LABEL_PATTERN)]


class WireModel(BaseModel):
    """Base of every response model: built from ORM rows by attribute."""

    model_config = ConfigDict(from_attributes=True)


class ErrorDetail(BaseModel):
    type: str = Field(description="Machine-readable kind, e.g. `not_found_error`.")
    message: str = Field(description="What was wrong and how to fix it.")
    param: str | None = Field(default=None, description="The offending field or parameter, if any.")


class ErrorBody(BaseModel):
    """The one shape of every error response."""

    error: ErrorDetail


class Page(BaseModel, Generic[T]):
    """A page of a list, paged with `after=<last_id>&limit=N` as in the OpenAI API."""

    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None

"""Query parameters and response shape of paged lists, shared by every list route."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import Path, Query
from pydantic import BaseModel

from mint.schemas.common import ID_PATTERN, Page
from mint.storage.queries import MAX_PAGE_SIZE, PageResult

WireT = TypeVar("WireT", bound=BaseModel)

Limit = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description="Page size.")]
After = Annotated[
    str | None, Query(max_length=100, pattern=ID_PATTERN, description="Cursor: the last id of the previous page.")
]


def id_path(description: str) -> Any:
    """A path parameter holding a resource id or name (validated before any query)."""
    return Path(max_length=100, pattern=ID_PATTERN, description=description)


def page_from(data: list[WireT], has_more: bool, wire: type[WireT]) -> Page[WireT]:
    """A page of wire items already built, with the cursors of its first and last item."""
    # The ignores: pydantic needs the concrete Page[wire] (to validate and serialize the items
    # as `wire`), which mypy cannot type with a class held in a variable; and every wire item
    # has an `id`, which a TypeVar bound to BaseModel cannot say as well.
    return Page[wire](  # type: ignore[valid-type]
        data=data,
        has_more=has_more,
        first_id=data[0].id if data else None,  # type: ignore[attr-defined]
        last_id=data[-1].id if data else None,  # type: ignore[attr-defined]
    )


def page_of(result: PageResult[Any], wire: type[WireT]) -> Page[WireT]:
    """A page of ORM rows, each read into `wire`."""
    return page_from([wire.model_validate(row) for row in result.rows], result.has_more, wire)

"""Query helpers that every service uses, so that tenancy and paging are written once.

`get_owned` is the one way to load a tenant resource by id: a row of another
organization is indistinguishable from a missing one (NotFound), so ids cannot be probed.
`insert_or_first` is the one way to add a row that two concurrent requests may both add.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy import CursorResult, Result, Select, and_, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mint.errors import InvalidRequest, NotFound

RowT = TypeVar("RowT")


class Owned(Protocol):
    """A tenant resource: a row that belongs to one organization."""

    @property
    def organization_id(self) -> str: ...


class Listed(Protocol):
    """A row that `paginate` pages through: ordered by (created_at, id)."""

    @property
    def id(self) -> str: ...

    @property
    def created_at(self) -> datetime: ...


OwnedT = TypeVar("OwnedT", bound=Owned)
ListedT = TypeVar("ListedT", bound=Listed)

MAX_PAGE_SIZE = 100


def insert_or_first(session: Session, row: RowT, first: Callable[[], RowT | None]) -> RowT:
    """Add `row`, or return the one a concurrent request added first.

    A check-then-insert (an `Idempotency-Key`, a content hash) races with its twin: both find
    nothing, both insert, and the unique constraint refuses the second. That loser rolls back
    and answers with the winner's row, looked up by `first`, instead of an IntegrityError.
    The rollback drops the whole transaction, so nothing but locks (a quota's hold) may come
    before the insert."""
    try:
        session.add(row)
        session.flush()
    except IntegrityError:
        session.rollback()
        winner = first()
        if winner is None:  # another constraint refused it: not a race this function resolves
            raise
        return winner
    return row


def get_owned(session: Session, model: type[OwnedT], resource_id: str, *, organization_id: str, noun: str) -> OwnedT:
    """Load `model` by primary key if it belongs to `organization_id`; else NotFound."""
    row = session.get(model, resource_id)
    if row is None or row.organization_id != organization_id:
        raise NotFound(f"No {noun} with id {resource_id!r} in this organization.", param="id")
    return row


@dataclass(frozen=True)
class PageResult(Generic[RowT]):
    rows: Sequence[RowT]
    has_more: bool


def paginate(
    session: Session,
    query: Select[ListedT],
    model: Any,
    *,
    after: str | None,
    limit: int,
    newest_first: bool = True,
) -> PageResult[ListedT]:
    """One page of `query` ordered by (created_at, id), starting after the row `after`.

    `query` must already be filtered to the caller's organization; `after` is looked up
    inside that same query, so a cursor from another organization is refused.
    """
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE_SIZE}, got {limit}.", param="limit")
    created, ident = model.created_at, model.id
    if after is not None:
        anchor = session.execute(query.where(ident == after)).scalar_one_or_none()
        if anchor is None:
            raise InvalidRequest(f"Unknown cursor {after!r}: pass the last id of the previous page.", param="after")
        if newest_first:
            query = query.where(or_(created < anchor.created_at, and_(created == anchor.created_at, ident < after)))
        else:
            query = query.where(or_(created > anchor.created_at, and_(created == anchor.created_at, ident > after)))
    order = (created.desc(), ident.desc()) if newest_first else (created.asc(), ident.asc())
    rows = list(session.execute(query.order_by(*order).limit(limit + 1)).scalars())
    return PageResult(rows=rows[:limit], has_more=len(rows) > limit)


def children_of(session: Session, model: Any, parent: Any, parent_ids: Sequence[str]) -> dict[str, list[Any]]:
    """The rows of `model` whose column `parent` names each of `parent_ids` (a capture's feedback,
    an episode's turns), oldest first; every id has its list, empty when it has none."""
    found: dict[str, list[Any]] = {parent_id: [] for parent_id in parent_ids}
    if not parent_ids:
        return found
    rows = session.execute(
        select(model).where(parent.in_(list(parent_ids))).order_by(model.created_at, model.id)
    ).scalars()
    for row in rows:
        found[getattr(row, parent.key)].append(row)
    return found


def owned_by(model: Any, organization_id: str) -> Select[Any]:
    """`SELECT model WHERE organization_id = ...`: the start of every tenant list query."""
    return select(model).where(model.organization_id == organization_id)


def rowcount(result: Result[*tuple[Any, ...]]) -> int:
    """How many rows an UPDATE or DELETE matched. `Session.execute` is typed as returning a plain
    `Result`; for those statements it returns a `CursorResult`, the one that counts them."""
    if not isinstance(result, CursorResult):
        raise TypeError(f"expected the CursorResult of an UPDATE or DELETE, got {type(result).__name__}")
    return result.rowcount

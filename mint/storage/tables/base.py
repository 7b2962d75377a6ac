"""What every table module shares: the declarative `Base` and its metadata, id and time helpers,
and the columns most tables repeat.

Conventions:
- Primary keys are short prefixed strings (`org_...`, `ftjob_...`) made by `new_id`, so ids
  say what they name in logs and URLs, and never reveal counts.
- Every tenant resource carries `organization_id`; queries filter on it (see
  `mint.storage.queries`). A row of another organization is a 404, never a 403.
- Timestamps are timezone-aware UTC.
- Enumerations are stored as short strings with a CHECK constraint, so that adding a
  value is a plain migration on SQLite and PostgreSQL alike.
- Free-form but validated documents (specs, metrics, reports) are JSON columns.
- Tables of different modules refer to each other by table name only (`ForeignKey("datasets.id")`),
  so no table module imports another.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, CheckConstraint, DateTime, ForeignKey, MetaData, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID_LENGTH = 40


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """`moment` as an aware UTC datetime: SQLite hands back naive values for aware columns."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def new_id(prefix: str) -> str:
    """A random, URL-safe id that names its kind, e.g. `ftjob_3pX...`."""
    return f"{prefix}_{secrets.token_urlsafe(16).replace('-', 'x').replace('_', 'z')}"


def one_of(column: str, values: tuple[str, ...]) -> CheckConstraint:
    """The CHECK constraint of an enumeration column: `column` holds one of `values`."""
    allowed = ", ".join(f"'{v}'" for v in values)
    return CheckConstraint(f"{column} IN ({allowed})", name=f"{column}_allowed")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


def id_column() -> Mapped[str]:
    """A `new_id` primary key."""
    return mapped_column(String(ID_LENGTH), primary_key=True)


def organization_column() -> Mapped[str]:
    """The owning organization of a tenant resource (indexed: every query filters on it)."""
    return mapped_column(String(ID_LENGTH), ForeignKey("organizations.id"), index=True)


def created_column() -> Mapped[datetime]:
    """`created_at`: when the row was written."""
    return mapped_column(DateTime(timezone=True), default=utcnow)

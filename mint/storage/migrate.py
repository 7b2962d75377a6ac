"""Run Alembic programmatically: upgrade, current revision, and drift between the
SQLAlchemy tables and the migrated schema."""

from __future__ import annotations

from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.exc import OperationalError

from mint.config import PROJECT_ROOT
from mint.errors import ConfigurationError, ServiceUnavailable
from mint.storage.db import get_engine
from mint.storage.tables import Base

MIGRATIONS_DIR = PROJECT_ROOT / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the database up to `revision` (idempotent; safe on an up-to-date database)."""
    _run(command.upgrade, database_url, revision)


def downgrade(database_url: str, revision: str) -> None:
    """Take the database down to `revision` (`base` drops every table)."""
    _run(command.downgrade, database_url, revision)


def _run(operation: Any, database_url: str, revision: str) -> None:
    with get_engine(database_url).begin() as connection:
        config = alembic_config(database_url)
        config.attributes["connection"] = connection
        operation(config, revision)


def current_revision(database_url: str) -> str | None:
    with get_engine(database_url).connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def require_schema(database_url: str) -> None:
    """Raise a clear error unless the database is reachable and migrated to head."""
    try:
        current = current_revision(database_url)
    except OperationalError as exc:
        raise ServiceUnavailable(f"Cannot reach the database: {exc.orig}. Check MINT_DATABASE_URL.") from exc
    if current is None:
        raise ConfigurationError(
            "The database has no Mint schema yet: run `mint admin init` (or `mint admin migrate`)."
        )
    head = head_revision()
    if current != head:
        raise ConfigurationError(
            f"The database is at migration {current}, this Mint expects {head}: run `mint admin migrate`."
        )


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def schema_drift(database_url: str) -> list[Any]:
    """Differences between the tables in code and the migrated database (empty = none)."""
    with get_engine(database_url).connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))

"""Alembic environment: migrates the database named by Mint's settings (or the URL that
`mint.storage.migrate` passes in), on SQLite and PostgreSQL alike."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from mint.config import get_settings
from mint.storage.db import make_engine
from mint.storage.tables import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url") or get_settings().database
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url") or get_settings().database, target_metadata=target_metadata
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()

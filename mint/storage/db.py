"""Database engine and sessions.

One engine per process and database URL. SQLite (the embedded default) is shared by the
API, the workers and beat, so it runs in WAL mode with a busy timeout and foreign keys on;
PostgreSQL gets a pre-ping pool so that a restarted server costs one retry, not an error.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

if TYPE_CHECKING:
    from mint.config import Settings

SQLITE_BUSY_TIMEOUT_MS = 30_000


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _create_private_file(path: Path) -> None:
    """Create the SQLite file (and its folder) for its owner only, before SQLite would create it
    world-readable; SQLite gives its WAL and shared-memory files the same mode."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


@dataclass(frozen=True)
class PoolOptions:
    """A process's pool of connections to one database: `size` kept open, `max_overflow` more
    opened under load, and how long a caller waits for one before the pool gives up."""

    size: int = 10
    max_overflow: int = 20
    timeout_s: float = 30.0


def make_engine(url: str, pool: PoolOptions | None = None) -> Engine:
    """A new engine for `url`, with the per-dialect settings Mint relies on."""
    pool = pool or PoolOptions()
    sizing = {"pool_size": pool.size, "max_overflow": pool.max_overflow, "pool_timeout": pool.timeout_s}
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            _create_private_file(Path(parsed.database))
        else:  # an in-memory database lives in one connection: no pool to size
            sizing = {}
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **sizing)
        event.listen(engine, "connect", _on_sqlite_connect)
        return engine
    return create_engine(url, pool_pre_ping=True, **sizing)


_engines: dict[str, Engine] = {}
_factories: dict[str, sessionmaker[Session]] = {}
_pools: dict[str, PoolOptions] = {}
_lock = threading.Lock()


def configure_pool(url: str, pool: PoolOptions) -> None:
    """Size this process's pool for `url` (`Settings.database_pool`); an engine already made
    for it is closed, so the next session opens the new pool."""
    with _lock:
        _pools[url] = pool
        engine = _engines.pop(url, None)
        _factories.pop(url, None)
    if engine is not None:
        engine.dispose()


def configure_pool_from(settings: Settings) -> None:
    """Size this process's database pool from the settings (`MINT_DATABASE_POOL_*`)."""
    pool = PoolOptions(
        size=settings.database_pool_size,
        max_overflow=settings.database_max_overflow,
        timeout_s=settings.database_pool_timeout_s,
    )
    configure_pool(settings.database, pool)


def get_engine(url: str) -> Engine:
    """The process-wide engine for `url` (one pool shared by every caller)."""
    with _lock:
        if url not in _engines:
            _engines[url] = make_engine(url, _pools.get(url))
            _factories[url] = sessionmaker(bind=_engines[url], expire_on_commit=False)
        return _engines[url]


def new_session(url: str) -> Session:
    """A new ORM session on the engine for `url`; the caller commits and closes it."""
    get_engine(url)
    return _factories[url]()


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session that commits on success and rolls back on any exception."""
    session = new_session(url)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def ping(url: str) -> None:
    """Run `SELECT 1`; raises the driver's error when the database cannot be reached."""
    with get_engine(url).connect() as connection:
        connection.execute(text("SELECT 1"))


def dispose_engines() -> None:
    """Close every pooled connection and forget the engines (after a fork, between tests)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _factories.clear()

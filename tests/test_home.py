"""The embedded defaults' files are private: the home folder and the SQLite database are
readable by their owner only."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sqlalchemy import text

from mint.config import Settings
from mint.storage.db import make_engine

pytestmark = pytest.mark.backend_free


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_home_and_database_are_created_private(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "shared" / "mint-home")
    settings.ensure_home()
    assert mode_of(settings.home) == 0o700
    engine = make_engine(settings.database)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (x INTEGER)"))
    engine.dispose()
    database = settings.home / "mint.db"
    assert mode_of(database) == 0o600
    for companion in (settings.home / "mint.db-wal", settings.home / "mint.db-shm"):
        if companion.exists():
            assert mode_of(companion) & 0o077 == 0, companion


def test_a_database_in_a_new_folder_gets_a_private_folder(tmp_path: Path) -> None:
    make_engine(f"sqlite:///{tmp_path / 'new' / 'mint.db'}").dispose()
    assert mode_of(tmp_path / "new") == 0o700 and mode_of(tmp_path / "new" / "mint.db") == 0o600

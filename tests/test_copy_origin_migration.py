"""Migration 0021 fills in the origin of Tinker copies made before it, from what their runs
recorded (`tags.copied_from`): a copy of another organization's checkpoint stands on it (a copy
of that copy on the same), a copy of the organization's own weights on nothing, and a copy of
another organization's checkpoint that is already gone on `withdrawn` (ended, like copies of a
deleted checkpoint). A copy of another organization's weights that its holder had published is
unpublished."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from mint.storage import migrate
from mint.storage.db import get_engine

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_copies_made_before_the_migration_get_their_origin(empty_database_url: str) -> None:
    url = empty_database_url
    if migrate.current_revision(url) is not None:
        migrate.downgrade(url, "base")
    migrate.upgrade(url, "0020")
    metadata = sa.MetaData()
    metadata.reflect(get_engine(url))
    tables = metadata.tables

    def run(run_id: str, org: str, copied_from: str | None = None) -> dict[str, Any]:
        tags = {"copied_from": copied_from} if copied_from else {}
        session = {"id": f"tks_{run_id}", "organization_id": org, "status": "finished", "tags": [], "user_metadata": {}}
        training = {
            "id": run_id,
            "organization_id": org,
            "base_model": "base-a",
            "kind": "training",
            "status": "closed",
            "lora": {"rank": 4},
            "tags": tags,
            "next_seq_id": 0,
            "tinker_session_id": f"tks_{run_id}",
        }
        return {"session": session | {"created_at": NOW}, "training": training | {"created_at": NOW}}

    def checkpoint(checkpoint_id: str, org: str, run_id: str, public: bool = False) -> dict[str, Any]:
        return {
            "id": checkpoint_id,
            "organization_id": org,
            "model_id": run_id,
            "kind": "training",
            "name": "kept",
            "object_key": f"tinker/states/{checkpoint_id}.tar",
            "sha256": "0" * 64,
            "size_bytes": 1,
            "user_metadata": {},
            "public": public,
            "created_at": NOW,
        }

    runs = [
        run("alice-run", "org_alice"),
        run("bob-copy", "org_bob", "tinker://alice-run/weights/kept"),
        run("bob-copy-of-copy", "org_bob", "tinker://bob-copy/weights/kept"),
        run("alice-own-copy", "org_alice", "tinker://alice-run/weights/kept"),
        run("gone-run", "org_alice"),
        run("bob-orphan", "org_bob", "tinker://gone-run/weights/kept"),
    ]
    checkpoints = [
        checkpoint("tkc_original", "org_alice", "alice-run", public=True),
        checkpoint("tkc_bob_copy", "org_bob", "bob-copy", public=True),  # published again by Bob
        checkpoint("tkc_bob_copy_2", "org_bob", "bob-copy-of-copy"),
        checkpoint("tkc_alice_copy", "org_alice", "alice-own-copy"),
        checkpoint("tkc_orphan", "org_bob", "bob-orphan"),  # its source (gone-run's) was deleted
    ]
    with get_engine(url).begin() as connection:
        connection.execute(
            tables["organizations"].insert(),
            [{"id": org, "name": org, "created_at": NOW} for org in ("org_alice", "org_bob")],
        )
        base = {"name": "base-a", "architecture": "x", "moe": False, "enabled": True, "spec": {}}
        connection.execute(tables["base_models"].insert(), [base | {"created_at": NOW, "updated_at": NOW}])
        connection.execute(tables["tinker_sessions"].insert(), [r["session"] for r in runs])
        connection.execute(tables["training_sessions"].insert(), [r["training"] for r in runs])
        connection.execute(tables["tinker_checkpoints"].insert(), checkpoints)

    migrate.upgrade(url)
    with get_engine(url).connect() as connection:
        rows = connection.execute(sa.text("SELECT id, origin_checkpoint_id, public FROM tinker_checkpoints")).all()
    assert {row[0]: (row[1], bool(row[2])) for row in rows} == {
        "tkc_original": (None, True),
        "tkc_bob_copy": ("tkc_original", False),  # only Alice publishes her weights
        "tkc_bob_copy_2": ("tkc_original", False),
        "tkc_alice_copy": (None, False),
        "tkc_orphan": ("withdrawn", False),
    }
    assert migrate.schema_drift(url) == []
    # Leave the shared empty database as empty as it came.
    with get_engine(url).begin() as connection:
        for table in ("tinker_checkpoints", "training_sessions", "tinker_sessions", "base_models", "organizations"):
            connection.execute(sa.text(f"DELETE FROM {table}"))
    migrate.downgrade(url, "base")

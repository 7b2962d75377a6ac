"""Migrations upgrade an empty database, and the tables in code match the migrated schema."""

from __future__ import annotations

from sqlalchemy import inspect

from mint.storage import migrate
from mint.storage.db import get_engine
from mint.storage.tables import Base


def test_upgrade_empty_database_to_head_without_drift(empty_database_url: str) -> None:
    assert migrate.current_revision(empty_database_url) is None
    migrate.upgrade(empty_database_url)
    assert migrate.current_revision(empty_database_url) == migrate.head_revision()
    tables = set(inspect(get_engine(empty_database_url)).get_table_names())
    assert set(Base.metadata.tables) <= tables
    assert migrate.schema_drift(empty_database_url) == []


def test_upgrade_is_idempotent_and_downgrade_round_trips(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    migrate.downgrade(empty_database_url, "base")
    assert set(inspect(get_engine(empty_database_url)).get_table_names()) <= {"alembic_version"}
    migrate.upgrade(empty_database_url)
    assert migrate.schema_drift(empty_database_url) == []


def test_data_model_covers_design_section_4() -> None:
    expected = {
        "organizations", "api_keys", "base_models", "datasets", "benchmarks", "benchmark_versions",
        "eval_runs", "trajectories", "training_jobs", "job_events", "checkpoints", "adapters",
        "adapter_versions", "deployments", "deployment_revisions", "training_sessions", "futures",
        "usage_records", "audit_log", "webhooks", "webhook_deliveries",
    }  # fmt: skip
    assert expected <= set(Base.metadata.tables)

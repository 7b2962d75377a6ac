"""Initial schema: the whole data model of DESIGN.md section 4.

Revision ID: 0001
Revises:
Create Date: 2026-12-02 14:29:13.662212
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "base_models",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("architecture", sa.String(length=100), nullable=False),
        sa.Column("moe", sa.Boolean(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_base_models")),
    )
    op.create_table(
        "organizations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_organizations")),
        sa.UniqueConstraint("name", name=op.f("uq_organizations_name")),
    )
    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("hostname", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("base_model", sa.String(length=100), nullable=True),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )
    op.create_table(
        "adapters",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("base_model", sa.String(length=100), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["base_model"], ["base_models.name"], name=op.f("fk_adapters_base_model_base_models")),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_adapters_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapters")),
        sa.UniqueConstraint("organization_id", "name", name=op.f("uq_adapters_organization_id_name")),
    )
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_adapters_organization_id"), ["organization_id"], unique=False)

    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_by_key_id", sa.String(length=40), nullable=True),
        sa.CheckConstraint("role IN ('admin', 'developer', 'viewer')", name=op.f("ck_api_keys_role_allowed")),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_api_keys_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_organization_id"), ["organization_id"], unique=False)

    op.create_table(
        "audit_log",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("actor_key_id", sa.String(length=40), nullable=True),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=100), nullable=False),
        sa.Column("resource_type", sa.String(length=50), nullable=False),
        sa.Column("resource_id", sa.String(length=40), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_audit_log_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_log_organization_id"), ["organization_id"], unique=False)

    op.create_table(
        "benchmarks",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_benchmarks_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_benchmarks")),
        sa.UniqueConstraint("organization_id", "name", name=op.f("uq_benchmarks_organization_id_name")),
    )
    with op.batch_alter_table("benchmarks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_benchmarks_organization_id"), ["organization_id"], unique=False)

    op.create_table(
        "datasets",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("filename", sa.String(length=300), nullable=False),
        sa.Column("purpose", sa.String(length=50), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("object_key", sa.String(length=1024), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("validation_report", sa.JSON(), nullable=False),
        sa.Column("source_eval_run_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('chat', 'preference', 'prompts')", name=op.f("ck_datasets_kind_allowed")),
        sa.CheckConstraint("status IN ('validating', 'ready', 'invalid')", name=op.f("ck_datasets_status_allowed")),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_datasets_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
        sa.UniqueConstraint("organization_id", "sha256", "kind", name=op.f("uq_datasets_organization_id_sha256_kind")),
    )
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_datasets_organization_id"), ["organization_id"], unique=False)

    op.create_table(
        "deployments",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("base_model", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("current_revision", sa.Integer(), nullable=False),
        sa.Column("gate", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('single', 'mixture')", name=op.f("ck_deployments_kind_allowed")),
        sa.CheckConstraint("status IN ('active', 'withdrawn')", name=op.f("ck_deployments_status_allowed")),
        sa.ForeignKeyConstraint(
            ["base_model"], ["base_models.name"], name=op.f("fk_deployments_base_model_base_models")
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_deployments_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployments")),
        sa.UniqueConstraint("organization_id", "name", name=op.f("uq_deployments_organization_id_name")),
    )
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_deployments_organization_id"), ["organization_id"], unique=False)

    op.create_table(
        "training_sessions",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("base_model", sa.String(length=100), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("lora", sa.JSON(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("next_seq_id", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=True),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('training', 'sampling')", name=op.f("ck_training_sessions_kind_allowed")),
        sa.CheckConstraint("status IN ('active', 'closed')", name=op.f("ck_training_sessions_status_allowed")),
        sa.ForeignKeyConstraint(
            ["base_model"], ["base_models.name"], name=op.f("fk_training_sessions_base_model_base_models")
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_training_sessions_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_training_sessions")),
    )
    with op.batch_alter_table("training_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_training_sessions_organization_id"), ["organization_id"], unique=False)

    op.create_table(
        "usage_records",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("base_model", sa.String(length=100), nullable=False),
        sa.Column("model_ref", sa.String(length=300), nullable=False),
        sa.Column("resource_type", sa.String(length=50), nullable=True),
        sa.Column("resource_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('trained', 'sampled', 'served')", name=op.f("ck_usage_records_kind_allowed")),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_usage_records_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_records")),
    )
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.create_index("ix_usage_org_created", ["organization_id", "created_at"], unique=False)

    op.create_table(
        "benchmark_versions",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("benchmark_id", sa.String(length=40), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("object_key", sa.String(length=1024), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("task_count", sa.Integer(), nullable=False),
        sa.Column("splits", sa.JSON(), nullable=False),
        sa.Column("grader", sa.JSON(), nullable=False),
        sa.Column("locked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["benchmark_id"], ["benchmarks.id"], name=op.f("fk_benchmark_versions_benchmark_id_benchmarks")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_benchmark_versions")),
        sa.UniqueConstraint("benchmark_id", "version", name=op.f("uq_benchmark_versions_benchmark_id_version")),
    )
    with op.batch_alter_table("benchmark_versions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_benchmark_versions_benchmark_id"), ["benchmark_id"], unique=False)

    op.create_table(
        "futures",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("session_id", sa.String(length=40), nullable=False),
        sa.Column("model_id", sa.String(length=200), nullable=True),
        sa.Column("seq_id", sa.Integer(), nullable=True),
        sa.Column("operation", sa.String(length=50), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("request_object_key", sa.String(length=1024), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("result_object_key", sa.String(length=1024), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_category", sa.String(length=16), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_futures_status_allowed"),
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_futures_organization_id_organizations")
        ),
        sa.ForeignKeyConstraint(
            ["session_id"], ["training_sessions.id"], name=op.f("fk_futures_session_id_training_sessions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_futures")),
    )
    with op.batch_alter_table("futures", schema=None) as batch_op:
        batch_op.create_index("ix_futures_model_seq", ["model_id", "seq_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_futures_organization_id"), ["organization_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_futures_session_id"), ["session_id"], unique=False)

    op.create_table(
        "training_jobs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("base_model", sa.String(length=100), nullable=False),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("training_dataset_id", sa.String(length=40), nullable=False),
        sa.Column("validation_dataset_id", sa.String(length=40), nullable=True),
        sa.Column("suffix", sa.String(length=64), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=False),
        sa.Column("completed_steps", sa.Integer(), nullable=False),
        sa.Column("trained_tokens", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("result_adapter_version_id", sa.String(length=40), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("method IN ('sft', 'dpo', 'rl')", name=op.f("ck_training_jobs_method_allowed")),
        sa.CheckConstraint(
            "status IN ('validating_files', 'queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_training_jobs_status_allowed"),
        ),
        sa.ForeignKeyConstraint(
            ["base_model"], ["base_models.name"], name=op.f("fk_training_jobs_base_model_base_models")
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_training_jobs_organization_id_organizations")
        ),
        sa.ForeignKeyConstraint(
            ["training_dataset_id"], ["datasets.id"], name=op.f("fk_training_jobs_training_dataset_id_datasets")
        ),
        sa.ForeignKeyConstraint(
            ["validation_dataset_id"], ["datasets.id"], name=op.f("fk_training_jobs_validation_dataset_id_datasets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_training_jobs")),
        sa.UniqueConstraint(
            "organization_id", "idempotency_key", name=op.f("uq_training_jobs_organization_id_idempotency_key")
        ),
    )
    with op.batch_alter_table("training_jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_training_jobs_organization_id"), ["organization_id"], unique=False)
        batch_op.create_index("ix_training_jobs_status", ["status"], unique=False)

    op.create_table(
        "adapter_versions",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("adapter_id", sa.String(length=40), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("object_key", sa.String(length=1024), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("base_model", sa.String(length=100), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("alpha", sa.Float(), nullable=False),
        sa.Column("targets", sa.JSON(), nullable=False),
        sa.Column("training_job_id", sa.String(length=40), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('ready', 'withdrawn', 'deleted')", name=op.f("ck_adapter_versions_status_allowed")
        ),
        sa.ForeignKeyConstraint(["adapter_id"], ["adapters.id"], name=op.f("fk_adapter_versions_adapter_id_adapters")),
        sa.ForeignKeyConstraint(
            ["base_model"], ["base_models.name"], name=op.f("fk_adapter_versions_base_model_base_models")
        ),
        sa.ForeignKeyConstraint(
            ["training_job_id"], ["training_jobs.id"], name=op.f("fk_adapter_versions_training_job_id_training_jobs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapter_versions")),
        sa.UniqueConstraint("adapter_id", "version", name=op.f("uq_adapter_versions_adapter_id_version")),
    )
    with op.batch_alter_table("adapter_versions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_adapter_versions_adapter_id"), ["adapter_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_adapter_versions_sha256"), ["sha256"], unique=False)

    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("object_key", sa.String(length=1024), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["training_jobs.id"], name=op.f("fk_checkpoints_job_id_training_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint("job_id", "step", name=op.f("uq_checkpoints_job_id_step")),
    )
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_checkpoints_job_id"), ["job_id"], unique=False)

    op.create_table(
        "job_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("level IN ('info', 'warning', 'error')", name=op.f("ck_job_events_level_allowed")),
        sa.CheckConstraint("type IN ('message', 'metrics')", name=op.f("ck_job_events_type_allowed")),
        sa.ForeignKeyConstraint(["job_id"], ["training_jobs.id"], name=op.f("fk_job_events_job_id_training_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_events_job_id"), ["job_id"], unique=False)

    op.create_table(
        "deployment_revisions",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("deployment_id", sa.String(length=40), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("adapter_version_id", sa.String(length=40), nullable=True),
        sa.Column("routing", sa.JSON(), nullable=False),
        sa.Column("gate_verdict", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_by_key_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "action IN ('create', 'promote', 'rollback', 'withdraw', 'update')",
            name=op.f("ck_deployment_revisions_action_allowed"),
        ),
        sa.ForeignKeyConstraint(
            ["adapter_version_id"],
            ["adapter_versions.id"],
            name=op.f("fk_deployment_revisions_adapter_version_id_adapter_versions"),
        ),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_deployment_revisions_deployment_id_deployments")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment_revisions")),
        sa.UniqueConstraint("deployment_id", "revision", name=op.f("uq_deployment_revisions_deployment_id_revision")),
    )
    with op.batch_alter_table("deployment_revisions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_deployment_revisions_deployment_id"), ["deployment_id"], unique=False)

    op.create_table(
        "eval_runs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("benchmark_version_id", sa.String(length=40), nullable=False),
        sa.Column("model_ref", sa.String(length=300), nullable=False),
        sa.Column("adapter_version_id", sa.String(length=40), nullable=True),
        sa.Column("split", sa.String(length=50), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_eval_runs_status_allowed"),
        ),
        sa.ForeignKeyConstraint(
            ["adapter_version_id"],
            ["adapter_versions.id"],
            name=op.f("fk_eval_runs_adapter_version_id_adapter_versions"),
        ),
        sa.ForeignKeyConstraint(
            ["benchmark_version_id"],
            ["benchmark_versions.id"],
            name=op.f("fk_eval_runs_benchmark_version_id_benchmark_versions"),
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_eval_runs_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_runs")),
    )
    with op.batch_alter_table("eval_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_eval_runs_benchmark_version_id"), ["benchmark_version_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_eval_runs_organization_id"), ["organization_id"], unique=False)

    op.create_table(
        "trajectories",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("eval_run_id", sa.String(length=40), nullable=False),
        sa.Column("task_id", sa.String(length=200), nullable=False),
        sa.Column("messages", sa.JSON(), nullable=False),
        sa.Column("output", sa.Text(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("tokens_in", sa.Integer(), nullable=False),
        sa.Column("tokens_out", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["eval_run_id"], ["eval_runs.id"], name=op.f("fk_trajectories_eval_run_id_eval_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trajectories")),
        sa.UniqueConstraint("eval_run_id", "task_id", name=op.f("uq_trajectories_eval_run_id_task_id")),
    )
    with op.batch_alter_table("trajectories", schema=None) as batch_op:
        batch_op.create_index("ix_trajectories_run_passed", ["eval_run_id", "passed"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("trajectories", schema=None) as batch_op:
        batch_op.drop_index("ix_trajectories_run_passed")

    op.drop_table("trajectories")
    with op.batch_alter_table("eval_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_eval_runs_organization_id"))
        batch_op.drop_index(batch_op.f("ix_eval_runs_benchmark_version_id"))

    op.drop_table("eval_runs")
    with op.batch_alter_table("deployment_revisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_deployment_revisions_deployment_id"))

    op.drop_table("deployment_revisions")
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_events_job_id"))

    op.drop_table("job_events")
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_checkpoints_job_id"))

    op.drop_table("checkpoints")
    with op.batch_alter_table("adapter_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_adapter_versions_sha256"))
        batch_op.drop_index(batch_op.f("ix_adapter_versions_adapter_id"))

    op.drop_table("adapter_versions")
    with op.batch_alter_table("training_jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_training_jobs_status")
        batch_op.drop_index(batch_op.f("ix_training_jobs_organization_id"))

    op.drop_table("training_jobs")
    with op.batch_alter_table("futures", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_futures_session_id"))
        batch_op.drop_index(batch_op.f("ix_futures_organization_id"))
        batch_op.drop_index("ix_futures_model_seq")

    op.drop_table("futures")
    with op.batch_alter_table("benchmark_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_benchmark_versions_benchmark_id"))

    op.drop_table("benchmark_versions")
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.drop_index("ix_usage_org_created")

    op.drop_table("usage_records")
    with op.batch_alter_table("training_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_training_sessions_organization_id"))

    op.drop_table("training_sessions")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_deployments_organization_id"))

    op.drop_table("deployments")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_datasets_organization_id"))

    op.drop_table("datasets")
    with op.batch_alter_table("benchmarks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_benchmarks_organization_id"))

    op.drop_table("benchmarks")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_log_organization_id"))

    op.drop_table("audit_log")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_organization_id"))

    op.drop_table("api_keys")
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_adapters_organization_id"))

    op.drop_table("adapters")
    op.drop_table("workers")
    op.drop_table("organizations")
    op.drop_table("base_models")

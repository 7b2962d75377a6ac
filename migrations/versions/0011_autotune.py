"""Auto mode: `autotune_runs` (a goal, a budget, where the run is, its decisions and cost) and
`autotune_trials` (the search's choices, each a job and a dev eval run).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 08:48:09.031483
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "autotune_runs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("base_model", sa.String(length=100), nullable=False),
        sa.Column("benchmark_id", sa.String(length=40), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.JSON(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("decisions", sa.JSON(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("tick_id", sa.String(length=100), nullable=True),
        sa.Column("advanced_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'stopped', 'failed', 'cancelled')",
            name=op.f("ck_autotune_runs_status_allowed"),
        ),
        sa.ForeignKeyConstraint(
            ["base_model"], ["base_models.name"], name=op.f("fk_autotune_runs_base_model_base_models")
        ),
        sa.ForeignKeyConstraint(
            ["benchmark_id"], ["benchmarks.id"], name=op.f("fk_autotune_runs_benchmark_id_benchmarks")
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_autotune_runs_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_runs")),
    )
    with op.batch_alter_table("autotune_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_autotune_runs_organization_id"), ["organization_id"], unique=False)

    op.create_table(
        "autotune_trials",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=True),
        sa.Column("eval_run_id", sa.String(length=40), nullable=True),
        sa.Column("model_ref", sa.String(length=300), nullable=True),
        sa.Column("dev_pass_rate", sa.Float(), nullable=True),
        sa.Column("dev_mean_score", sa.Float(), nullable=True),
        sa.Column("estimated_usd", sa.Float(), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["eval_run_id"], ["eval_runs.id"], name=op.f("fk_autotune_trials_eval_run_id_eval_runs")
        ),
        sa.ForeignKeyConstraint(["job_id"], ["training_jobs.id"], name=op.f("fk_autotune_trials_job_id_training_jobs")),
        sa.ForeignKeyConstraint(["run_id"], ["autotune_runs.id"], name=op.f("fk_autotune_trials_run_id_autotune_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_trials")),
        sa.UniqueConstraint("run_id", "number", name=op.f("uq_autotune_trials_run_id_number")),
    )
    with op.batch_alter_table("autotune_trials", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_autotune_trials_run_id"), ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("autotune_trials", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_autotune_trials_run_id"))

    op.drop_table("autotune_trials")
    with op.batch_alter_table("autotune_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_autotune_runs_organization_id"))

    op.drop_table("autotune_runs")

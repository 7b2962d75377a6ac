"""Expert review: queues over eval runs' trajectories and deployments' captures
(`review_queues`), their items with a snapshot of what a reviewer reads (`review_items`), and
one review per reviewer per item (`reviews`).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-14 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _fk(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint([column], [f"{target}.id"], name=op.f(f"fk_{table}_{column}_{target}"))


def upgrade() -> None:
    op.create_table(
        "review_queues",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("instructions", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("eval_run_id", sa.String(length=40), nullable=True),
        sa.Column("deployment_id", sa.String(length=40), nullable=True),
        sa.Column("benchmark_version_id", sa.String(length=40), nullable=True),
        sa.Column("filters", sa.JSON(), nullable=False),
        sa.Column("reviews_per_item", sa.Integer(), nullable=False),
        sa.Column("item_count", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("source IN ('eval_run', 'deployment')", name=op.f("ck_review_queues_source_allowed")),
        _fk("review_queues", "organization_id", "organizations"),
        _fk("review_queues", "eval_run_id", "eval_runs"),
        _fk("review_queues", "deployment_id", "deployments"),
        _fk("review_queues", "benchmark_version_id", "benchmark_versions"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_review_queues")),
    )
    for column in ("organization_id", "eval_run_id", "benchmark_version_id"):
        op.create_index(op.f(f"ix_review_queues_{column}"), "review_queues", [column])
    op.create_table(
        "review_items",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("queue_id", sa.String(length=40), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("source_id", sa.String(length=64), nullable=False),
        sa.Column("task_id", sa.String(length=200), nullable=False),
        sa.Column("assignee_key_id", sa.String(length=40), nullable=True),
        sa.Column("snapshot", sa.JSON(), nullable=False),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        _fk("review_items", "organization_id", "organizations"),
        _fk("review_items", "queue_id", "review_queues"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_review_items")),
        sa.UniqueConstraint("queue_id", "position", name=op.f("uq_review_items_queue_id_position")),
        sa.UniqueConstraint("queue_id", "source_id", name=op.f("uq_review_items_queue_id_source_id")),
    )
    for column in ("organization_id", "queue_id", "source_id"):
        op.create_index(op.f(f"ix_review_items_{column}"), "review_items", [column])
    op.create_table(
        "reviews",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("item_id", sa.String(length=40), nullable=False),
        sa.Column("reviewer", sa.String(length=200), nullable=False),
        sa.Column("reviewer_name", sa.String(length=200), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=True),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("rubric", sa.JSON(), nullable=False),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("correction", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        _fk("reviews", "organization_id", "organizations"),
        _fk("reviews", "item_id", "review_items"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reviews")),
        sa.UniqueConstraint("item_id", "reviewer", name=op.f("uq_reviews_item_id_reviewer")),
    )
    for column in ("organization_id", "item_id"):
        op.create_index(op.f(f"ix_reviews_{column}"), "reviews", [column])


def downgrade() -> None:
    for column in ("organization_id", "item_id"):
        op.drop_index(op.f(f"ix_reviews_{column}"), table_name="reviews")
    op.drop_table("reviews")
    for column in ("organization_id", "queue_id", "source_id"):
        op.drop_index(op.f(f"ix_review_items_{column}"), table_name="review_items")
    op.drop_table("review_items")
    for column in ("organization_id", "eval_run_id", "benchmark_version_id"):
        op.drop_index(op.f(f"ix_review_queues_{column}"), table_name="review_queues")
    op.drop_table("review_queues")

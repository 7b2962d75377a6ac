"""Production capture: a deployment's capture rate and retention, `captures` (requests it
served and what answered them) and `feedback` on them.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 17:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("capture_rate", sa.Float(), server_default="0", nullable=False))
        batch.add_column(sa.Column("capture_retention_days", sa.Integer(), server_default="30", nullable=False))
    op.create_table(
        "captures",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("deployment_id", sa.String(length=40), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("model_ref", sa.String(length=300), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["deployment_id"], ["deployments.id"]),
        sa.ForeignKeyConstraint(["organization_id"], ["organizations.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("captures") as batch:
        batch.create_index("ix_captures_deployment_created", ["deployment_id", "created_at"], unique=False)
        batch.create_index(batch.f("ix_captures_expires_at"), ["expires_at"], unique=False)
        batch.create_index(batch.f("ix_captures_organization_id"), ["organization_id"], unique=False)
    op.create_table(
        "feedback",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("capture_id", sa.String(length=64), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("label", sa.String(length=100), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("correction", sa.JSON(), nullable=True),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["capture_id"], ["captures.id"]),
        sa.ForeignKeyConstraint(["organization_id"], ["organizations.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("feedback") as batch:
        batch.create_index(batch.f("ix_feedback_capture_id"), ["capture_id"], unique=False)
        batch.create_index(batch.f("ix_feedback_organization_id"), ["organization_id"], unique=False)


def downgrade() -> None:
    op.drop_table("feedback")
    op.drop_table("captures")
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("capture_retention_days")
        batch.drop_column("capture_rate")

"""Money: the `prices` table, what each usage record and job cost, and the spend limits of an
organization.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 17:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "prices",
        sa.Column("base_model", sa.String(length=100), nullable=False),
        sa.Column("usd_per_million_trained", sa.Float(), nullable=False),
        sa.Column("usd_per_million_sampled", sa.Float(), nullable=False),
        sa.Column("usd_per_million_served", sa.Float(), nullable=False),
        sa.Column("usd_per_gpu_hour", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["base_model"], ["base_models.name"]),
        sa.PrimaryKeyConstraint("base_model"),
    )
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("cost_usd", sa.Float(), server_default="0", nullable=False))
    with op.batch_alter_table("training_jobs") as batch:
        batch.add_column(sa.Column("sampled_tokens", sa.BigInteger(), server_default="0", nullable=False))
        batch.add_column(sa.Column("cost_usd", sa.Float(), server_default="0", nullable=False))
    with op.batch_alter_table("organizations") as batch:
        batch.add_column(sa.Column("spend_limit_month_usd", sa.Float(), nullable=True))
        batch.add_column(sa.Column("spend_limit_job_usd", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("organizations") as batch:
        batch.drop_column("spend_limit_job_usd")
        batch.drop_column("spend_limit_month_usd")
    with op.batch_alter_table("training_jobs") as batch:
        batch.drop_column("cost_usd")
        batch.drop_column("sampled_tokens")
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("cost_usd")
    op.drop_table("prices")

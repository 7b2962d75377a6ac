"""Reward endpoints: an organization's reward servers (`reward_endpoints`), which the `remote`
grader POSTs outputs to, signed as webhooks are.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "reward_endpoints",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(length=100), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_reward_endpoints_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reward_endpoints")),
        sa.UniqueConstraint("organization_id", "name", name=op.f("uq_reward_endpoints_organization_id_name")),
    )
    op.create_index(op.f("ix_reward_endpoints_organization_id"), "reward_endpoints", ["organization_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_reward_endpoints_organization_id"), table_name="reward_endpoints")
    op.drop_table("reward_endpoints")

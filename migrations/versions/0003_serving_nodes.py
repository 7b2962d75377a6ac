"""Serving nodes: the processes that serve a base model's adapters, as they report themselves.

The API forwards inference to a live node of the requested base (one that reported within
the last minute), so nodes can be added and removed without configuration.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 18:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "serving_nodes",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("base_model", sa.String(length=100), nullable=False),
        sa.Column("url", sa.String(length=500), nullable=False),
        sa.Column("hostname", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_serving_nodes")),
    )
    op.create_index(op.f("ix_serving_nodes_base_model"), "serving_nodes", ["base_model"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_serving_nodes_base_model"), table_name="serving_nodes")
    op.drop_table("serving_nodes")

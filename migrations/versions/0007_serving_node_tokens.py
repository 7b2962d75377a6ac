"""Serving nodes record the credential they issued themselves, so that the API presents it on
every call to their internal routes (nodes answer nobody else). Nodes that share
MINT_NODE_TOKEN record none.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("serving_nodes") as batch:
        batch.add_column(sa.Column("token", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("serving_nodes") as batch:
        batch.drop_column("token")

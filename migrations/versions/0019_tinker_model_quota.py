"""A quota of live Tinker training models per organization (each holds a LoRA slot on a worker):
`organizations.quota_tinker_models`, null for the platform default (MINT_QUOTA_TINKER_MODELS).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 04:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("organizations") as batch:
        batch.add_column(sa.Column("quota_tinker_models", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("organizations") as batch:
        batch.drop_column("quota_tinker_models")

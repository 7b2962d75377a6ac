"""Organizations carry their own quotas: live Tinker sessions, queued and running fine-tuning
jobs, queued and running eval runs. A null quota is the platform default (MINT_QUOTA_*), so
existing organizations keep the defaults until an operator sets theirs.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("quota_tinker_sessions", "quota_jobs", "quota_eval_runs")


def upgrade() -> None:
    with op.batch_alter_table("organizations") as batch:
        for column in COLUMNS:
            batch.add_column(sa.Column(column, sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("organizations") as batch:
        for column in reversed(COLUMNS):
            batch.drop_column(column)

"""Trajectories keep how their grade was reached: the grader's detail, a composite grader's
parts, and a judge model's prompt and reply (`mint.evals.graders.Grade.record`).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trajectories") as batch:
        batch.add_column(sa.Column("grade", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trajectories") as batch:
        batch.drop_column("grade")

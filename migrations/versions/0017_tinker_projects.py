"""Tinker projects, as Mint keeps them: a label on Tinker sessions inside one organization
(`create_session`'s `project_id`, `PUT /api/v1/sessions/{id}/project`), which session search
filters by and `copy_weights` files a copy under.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 00:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tinker_sessions") as batch:
        batch.add_column(sa.Column("project", sa.String(200), nullable=True))
        batch.create_index("ix_tinker_sessions_org_project", ["organization_id", "project"])


def downgrade() -> None:
    with op.batch_alter_table("tinker_sessions") as batch:
        batch.drop_index("ix_tinker_sessions_org_project")
        batch.drop_column("project")

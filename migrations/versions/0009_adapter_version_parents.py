"""Adapter versions record the version they were trained from (`parent_version_id`): a job
warm-started with `from_adapter`, or a later stage of a chained job, names its parent.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("adapter_versions") as batch:
        batch.add_column(sa.Column("parent_version_id", sa.String(length=40), nullable=True))
        batch.create_foreign_key(
            batch.f("fk_adapter_versions_parent_version_id_adapter_versions"),
            "adapter_versions",
            ["parent_version_id"],
            ["id"],
        )


def downgrade() -> None:
    with op.batch_alter_table("adapter_versions") as batch:
        batch.drop_constraint(batch.f("fk_adapter_versions_parent_version_id_adapter_versions"), type_="foreignkey")
        batch.drop_column("parent_version_id")

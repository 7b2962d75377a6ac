"""Adapters brought in from outside Mint: an uploaded version is `validating` until a worker of
its base has loaded it, then `ready`, or `invalid` with the reason in `error`.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-12 11:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHECK = "ck_adapter_versions_status_allowed"


def upgrade() -> None:
    with op.batch_alter_table("adapter_versions") as batch:
        batch.drop_constraint(op.f(CHECK), type_="check")
        batch.create_check_constraint(
            op.f(CHECK), "status IN ('validating', 'ready', 'invalid', 'withdrawn', 'deleted')"
        )
        batch.add_column(sa.Column("error", sa.Text(), nullable=True))


def downgrade() -> None:
    op.execute("UPDATE adapter_versions SET status = 'deleted' WHERE status IN ('validating', 'invalid')")
    with op.batch_alter_table("adapter_versions") as batch:
        batch.drop_column("error")
        batch.drop_constraint(op.f(CHECK), type_="check")
        batch.create_check_constraint(op.f(CHECK), "status IN ('ready', 'withdrawn', 'deleted')")

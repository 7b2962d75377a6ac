"""Tinker checkpoints: external weights (`kind` external, `tinker://<model>/external_weights/<name>`,
the PEFT files a client downloads through signed URLs) and publishing (`public`: readable by
every organization, writable only by its own).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-12 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHECK = "ck_tinker_checkpoints_kind_allowed"


def upgrade() -> None:
    with op.batch_alter_table("tinker_checkpoints") as batch:
        batch.drop_constraint(op.f(CHECK), type_="check")
        batch.create_check_constraint(op.f(CHECK), "kind IN ('training', 'sampler', 'external')")
        batch.add_column(sa.Column("public", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.execute("DELETE FROM tinker_checkpoints WHERE kind = 'external'")
    with op.batch_alter_table("tinker_checkpoints") as batch:
        batch.drop_column("public")
        batch.drop_constraint(op.f(CHECK), type_="check")
        batch.create_check_constraint(op.f(CHECK), "kind IN ('training', 'sampler')")

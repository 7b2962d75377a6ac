"""Full-parameter training: a version is a LoRA adapter (`lora`) or a whole model (`full`), and
full-parameter jobs are billed by the seconds they hold a training device (`device_seconds`).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 07:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION_KIND = "ck_adapter_versions_kind_allowed"
USAGE_KIND = "ck_usage_records_kind_allowed"


def upgrade() -> None:
    with op.batch_alter_table("adapter_versions") as batch:
        batch.add_column(sa.Column("kind", sa.String(8), nullable=False, server_default="lora"))
        batch.create_check_constraint(op.f(VERSION_KIND), "kind IN ('lora', 'full')")
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_constraint(op.f(USAGE_KIND), type_="check")
        batch.create_check_constraint(op.f(USAGE_KIND), "kind IN ('trained', 'sampled', 'served', 'device_seconds')")


def downgrade() -> None:
    op.execute("DELETE FROM usage_records WHERE kind = 'device_seconds'")
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_constraint(op.f(USAGE_KIND), type_="check")
        batch.create_check_constraint(op.f(USAGE_KIND), "kind IN ('trained', 'sampled', 'served')")
    op.execute("UPDATE adapter_versions SET status = 'deleted' WHERE kind = 'full'")
    with op.batch_alter_table("adapter_versions") as batch:
        batch.drop_constraint(op.f(VERSION_KIND), type_="check")
        batch.drop_column("kind")

"""Captured completions and their feedback count against a storage quota of the organization:
`organizations.quota_capture_storage_mib` (null: the platform default,
MINT_QUOTA_CAPTURE_STORAGE_MIB), and each capture and feedback row records its size as JSON
(`stored_bytes`), so what an organization keeps is a sum, not a reading of every document.
Existing rows are measured once here (by their JSON text's length).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 06:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("organizations") as batch:
        batch.add_column(sa.Column("quota_capture_storage_mib", sa.Integer(), nullable=True))
    with op.batch_alter_table("captures") as batch:
        batch.add_column(sa.Column("stored_bytes", sa.BigInteger(), server_default="0", nullable=False))
    with op.batch_alter_table("feedback") as batch:
        batch.add_column(sa.Column("stored_bytes", sa.Integer(), server_default="0", nullable=False))
    op.execute(
        "UPDATE captures SET stored_bytes = "
        "COALESCE(LENGTH(CAST(request AS TEXT)), 0) + COALESCE(LENGTH(CAST(response AS TEXT)), 0)"
    )
    op.execute(
        "UPDATE feedback SET stored_bytes = COALESCE(LENGTH(label), 0) + COALESCE(LENGTH(comment), 0) "
        "+ COALESCE(LENGTH(CAST(correction AS TEXT)), 0)"
    )


def downgrade() -> None:
    with op.batch_alter_table("feedback") as batch:
        batch.drop_column("stored_bytes")
    with op.batch_alter_table("captures") as batch:
        batch.drop_column("stored_bytes")
    with op.batch_alter_table("organizations") as batch:
        batch.drop_column("quota_capture_storage_mib")

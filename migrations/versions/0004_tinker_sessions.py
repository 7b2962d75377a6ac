"""Tinker compatibility: client sessions, checkpoints, and what models and futures need.

- `tinker_sessions`: one per `ServiceClient` (Tinker's `create_session`): the container of
  its training models and samplers, with its heartbeat and finish reason.
- `tinker_checkpoints`: saved training states (`tinker://<model>/weights/<name>`) and sampler
  weights (`tinker://<model>/sampler_weights/<name>`, each also an adapter version).
- `training_sessions` gains the Tinker session it belongs to, and for samplers the path they
  sample and the PEFT archive they load.
- `futures` gains the request itself (small ones inline; large ones in the object store), the
  worker process running it, and at most one request per seq_id of a model.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tinker_sessions",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("user_metadata", sa.JSON(), nullable=False),
        sa.Column("display_name", sa.String(length=200), nullable=True),
        sa.Column("sdk_version", sa.String(length=50), nullable=True),
        sa.Column("finish_reason", sa.String(length=16), nullable=True),
        sa.Column("finish_detail", sa.Text(), nullable=True),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('active', 'finished')", name=op.f("ck_tinker_sessions_status_allowed")),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_tinker_sessions_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tinker_sessions")),
    )
    with op.batch_alter_table("tinker_sessions") as batch:
        batch.create_index(batch.f("ix_tinker_sessions_organization_id"), ["organization_id"], unique=False)

    with op.batch_alter_table("training_sessions") as batch:
        batch.add_column(sa.Column("tinker_session_id", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("model_path", sa.String(length=1024), nullable=True))
        batch.add_column(sa.Column("adapter_object_key", sa.String(length=1024), nullable=True))
        batch.create_index(batch.f("ix_training_sessions_tinker_session_id"), ["tinker_session_id"], unique=False)
        batch.create_foreign_key(
            batch.f("fk_training_sessions_tinker_session_id_tinker_sessions"),
            "tinker_sessions",
            ["tinker_session_id"],
            ["id"],
        )

    with op.batch_alter_table("futures") as batch:
        batch.add_column(sa.Column("request", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("worker_id", sa.String(length=200), nullable=True))
        # One request per seq_id of a model: a retried request can never be applied twice.
        batch.drop_index("ix_futures_model_seq")
        batch.create_index("ix_futures_model_seq", ["model_id", "seq_id"], unique=True)

    op.create_table(
        "tinker_checkpoints",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("model_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("object_key", sa.String(length=1024), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("adapter_version_id", sa.String(length=40), nullable=True),
        sa.Column("user_metadata", sa.JSON(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('training', 'sampler')", name=op.f("ck_tinker_checkpoints_kind_allowed")),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_tinker_checkpoints_organization_id_organizations")
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["training_sessions.id"], name=op.f("fk_tinker_checkpoints_model_id_training_sessions")
        ),
        sa.ForeignKeyConstraint(
            ["adapter_version_id"],
            ["adapter_versions.id"],
            name=op.f("fk_tinker_checkpoints_adapter_version_id_adapter_versions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tinker_checkpoints")),
        sa.UniqueConstraint("model_id", "kind", "name", name=op.f("uq_tinker_checkpoints_model_id_kind_name")),
    )
    with op.batch_alter_table("tinker_checkpoints") as batch:
        batch.create_index(batch.f("ix_tinker_checkpoints_organization_id"), ["organization_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tinker_checkpoints") as batch:
        batch.drop_index(batch.f("ix_tinker_checkpoints_organization_id"))
    op.drop_table("tinker_checkpoints")
    with op.batch_alter_table("futures") as batch:
        batch.drop_index("ix_futures_model_seq")
        batch.create_index("ix_futures_model_seq", ["model_id", "seq_id"], unique=False)
        batch.drop_column("worker_id")
        batch.drop_column("request")
    with op.batch_alter_table("training_sessions") as batch:
        batch.drop_constraint(batch.f("fk_training_sessions_tinker_session_id_tinker_sessions"), type_="foreignkey")
        batch.drop_index(batch.f("ix_training_sessions_tinker_session_id"))
        batch.drop_column("adapter_object_key")
        batch.drop_column("model_path")
        batch.drop_column("tinker_session_id")
    with op.batch_alter_table("tinker_sessions") as batch:
        batch.drop_index(batch.f("ix_tinker_sessions_organization_id"))
    op.drop_table("tinker_sessions")

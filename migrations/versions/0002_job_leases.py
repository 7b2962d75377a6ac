"""Leases of fine-tuning jobs and eval runs: a running one's heartbeat, and the id of the
queue message that carries it.

`heartbeat_at` lets the reconciler tell a job whose worker died (its lease ran out) from a
long step; `task_id` and `enqueued_at` let it tell a queued job whose message is still in
the broker from one whose message was lost (a broker restart), and re-enqueue only those.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 17:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("training_jobs") as batch:
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("task_id", sa.String(length=100), nullable=True))
        batch.add_column(sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("steps_redone", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("eval_runs") as batch:
        batch.add_column(sa.Column("worker_id", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("task_id", sa.String(length=100), nullable=True))
        batch.add_column(sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("eval_runs") as batch:
        batch.drop_column("enqueued_at")
        batch.drop_column("task_id")
        batch.drop_column("heartbeat_at")
        batch.drop_column("worker_id")
    with op.batch_alter_table("training_jobs") as batch:
        batch.drop_column("steps_redone")
        batch.drop_column("enqueued_at")
        batch.drop_column("task_id")
        batch.drop_column("heartbeat_at")

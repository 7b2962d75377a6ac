"""Episodes: turns of an agent's task recorded token-exact from a deployment (`episodes`,
`episode_turns`), a deployment's `capture_tokens` switch, and online RL jobs (method
`online_rl`), which train from a deployment's episodes and so have no training file.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_METHODS = "method IN ('sft', 'dpo', 'rl')"
NEW_METHODS = "method IN ('sft', 'dpo', 'rl', 'online_rl')"


def upgrade() -> None:
    op.create_table(
        "episodes",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("deployment_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("task", sa.String(length=128), nullable=True),
        sa.Column("turn_count", sa.Integer(), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("turn_scores", sa.JSON(), nullable=True),
        sa.Column("label", sa.String(length=100), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("rewarded_by", sa.String(length=200), nullable=True),
        sa.Column("rewarded_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stored_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_turn_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_episodes_deployment_id_deployments")
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_episodes_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_episodes")),
        sa.UniqueConstraint("organization_id", "key", name=op.f("uq_episodes_organization_id_key")),
    )
    op.create_index(op.f("ix_episodes_organization_id"), "episodes", ["organization_id"])
    op.create_index(op.f("ix_episodes_expires_at"), "episodes", ["expires_at"])
    op.create_index("ix_episodes_deployment_rewarded", "episodes", ["deployment_id", "rewarded_at"])
    op.create_table(
        "episode_turns",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("episode_id", sa.String(length=64), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("model_ref", sa.String(length=300), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("prompt_token_ids", sa.JSON(), nullable=False),
        sa.Column("token_ids", sa.JSON(), nullable=False),
        sa.Column("logprobs", sa.JSON(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("stored_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.id"], name=op.f("fk_episode_turns_episode_id_episodes")),
        sa.ForeignKeyConstraint(
            ["organization_id"], ["organizations.id"], name=op.f("fk_episode_turns_organization_id_organizations")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_episode_turns")),
    )
    op.create_index(op.f("ix_episode_turns_organization_id"), "episode_turns", ["organization_id"])
    op.create_index("ix_episode_turns_episode_created", "episode_turns", ["episode_id", "created_at"])
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("capture_tokens", sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table("training_jobs") as batch:
        batch.alter_column("training_dataset_id", existing_type=sa.String(length=40), nullable=True)
        batch.drop_constraint(op.f("ck_training_jobs_method_allowed"), type_="check")
        batch.create_check_constraint("method_allowed", NEW_METHODS)


def downgrade() -> None:
    op.execute("DELETE FROM job_events WHERE job_id IN (SELECT id FROM training_jobs WHERE method = 'online_rl')")
    op.execute("DELETE FROM checkpoints WHERE job_id IN (SELECT id FROM training_jobs WHERE method = 'online_rl')")
    op.execute("DELETE FROM training_jobs WHERE method = 'online_rl'")
    with op.batch_alter_table("training_jobs") as batch:
        batch.drop_constraint(op.f("ck_training_jobs_method_allowed"), type_="check")
        batch.create_check_constraint("method_allowed", OLD_METHODS)
        batch.alter_column("training_dataset_id", existing_type=sa.String(length=40), nullable=False)
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("capture_tokens")
    op.drop_index("ix_episode_turns_episode_created", table_name="episode_turns")
    op.drop_index(op.f("ix_episode_turns_organization_id"), table_name="episode_turns")
    op.drop_table("episode_turns")
    op.drop_index("ix_episodes_deployment_rewarded", table_name="episodes")
    op.drop_index(op.f("ix_episodes_expires_at"), table_name="episodes")
    op.drop_index(op.f("ix_episodes_organization_id"), table_name="episodes")
    op.drop_table("episodes")

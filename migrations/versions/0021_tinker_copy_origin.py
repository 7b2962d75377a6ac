"""Tinker copies record where they come from: a `copy_weights` copy of another organization's
published checkpoint names it (`origin_checkpoint_id`), so the copy stands only while that
publication does (unpublishing or deleting it ends the copy) and cannot be published again by
the organization that copied it.

Copies made before this revision are filled in from what their run recorded (`tags.copied_from`,
the source's path): a copy of another organization's checkpoint gets that checkpoint (or, for a
copy of a copy, the checkpoint it stands on) as its origin; one whose source is already gone
gets `withdrawn`, an id no checkpoint has, so it is ended like the copies of a deleted source.
Such a copy that its holder had published is unpublished: only the weights' owner publishes them.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_tinker_checkpoints_origin_checkpoint_id"
WITHDRAWN = "withdrawn"
KIND_OF_SEGMENT = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}


def upgrade() -> None:
    with op.batch_alter_table("tinker_checkpoints") as batch:
        batch.add_column(sa.Column("origin_checkpoint_id", sa.String(40), nullable=True))
        batch.create_index(INDEX, ["origin_checkpoint_id"])
    _fill_in_origins(op.get_bind())


def downgrade() -> None:
    with op.batch_alter_table("tinker_checkpoints") as batch:
        batch.drop_index(INDEX)
        batch.drop_column("origin_checkpoint_id")


def _fill_in_origins(connection: sa.Connection) -> None:
    runs = sa.table("training_sessions", sa.column("id"), sa.column("organization_id"), sa.column("tags", sa.JSON))
    checkpoints = sa.table(
        "tinker_checkpoints",
        sa.column("id"),
        sa.column("organization_id"),
        sa.column("model_id"),
        sa.column("kind"),
        sa.column("name"),
        sa.column("origin_checkpoint_id"),
        sa.column("public", sa.Boolean),
    )
    owner_of_run = dict(connection.execute(sa.select(runs.c.id, runs.c.organization_id)).all())
    rows = connection.execute(
        sa.select(
            checkpoints.c.id,
            checkpoints.c.organization_id,
            checkpoints.c.model_id,
            checkpoints.c.kind,
            checkpoints.c.name,
            runs.c.tags,
        ).join(runs, runs.c.id == checkpoints.c.model_id)
    ).all()
    by_path = {(row.model_id, row.kind, row.name): row for row in rows}
    by_id = {row.id: row for row in rows}
    origins: dict[str, str | None] = {}

    def origin_of(checkpoint_id: str, seen: frozenset[str] = frozenset()) -> str | None:
        """The foreign publication the checkpoint stands on, None for an organization's own weights."""
        if checkpoint_id in origins:
            return origins[checkpoint_id]
        row = by_id[checkpoint_id]
        source_path = (row.tags or {}).get("copied_from") if isinstance(row.tags, dict) else None
        origin = None
        source_key = _parse(source_path)
        if source_key is not None and checkpoint_id not in seen:
            source = by_path.get(source_key)
            if source is None:  # gone: a copy of another organization's weights is ended with them
                origin = WITHDRAWN if owner_of_run.get(source_key[0]) not in (None, row.organization_id) else None
            else:
                inherited = origin_of(source.id, seen | {checkpoint_id})
                origin = inherited or (source.id if source.organization_id != row.organization_id else None)
        origins[checkpoint_id] = origin
        return origin

    for row in rows:
        origin = origin_of(row.id)
        if origin is not None:
            connection.execute(
                checkpoints.update().where(checkpoints.c.id == row.id).values(origin_checkpoint_id=origin, public=False)
            )


def _parse(path: object) -> tuple[str, str, str] | None:
    """(model id, kind, name) of a `tinker://<model>/<segment>/<name>` path, None for anything else."""
    if not isinstance(path, str) or not path.startswith("tinker://"):
        return None
    parts = path.removeprefix("tinker://").split("/", 2)
    if len(parts) != 3 or parts[1] not in KIND_OF_SEGMENT:
        return None
    return parts[0], KIND_OF_SEGMENT[parts[1]], parts[2]

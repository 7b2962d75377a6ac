"""Tinker projects, session search and copied weights, as Mint keeps them.

Tinker files sessions, runs and checkpoints under projects. Mint's tenant is the organization
(an API key belongs to one), so a Tinker project is a label on the organization's sessions:
set at `create_session` (`ServiceClient(project_id=...)`, `TINKER_PROJECT_ID`) or later with
`PUT /api/v1/sessions/{id}/project`; sessions without one are in the `default` project. No
project is a boundary of access: every key of the organization sees them all.

- **Search** (`POST /api/v1/sessions/search`): the organization's sessions, newest first,
  filtered by id, projects, display name (each word, case-insensitive), exact user_metadata
  pairs and status, paged by a (created_at, id) cursor. Owners are organizations: `own` and
  `accessible` both mean the organization's sessions; naming users is refused.
- **Copies** (`POST /api/v1/copy_weights`): a checkpoint the organization may read (its own, or
  published) is copied into a new training run that cannot be trained on (closed), in the named
  project or in a given session's run slot. The copy's row names the same objects as the
  source's: no bytes are duplicated, and deleting either keeps the objects the other still
  names (`tinker_checkpoints.delete_checkpoint`, retention and `mint admin gc` all check). A
  copy of another organization's published checkpoint records it as its origin: it ends when
  that checkpoint is unpublished or deleted, and cannot be published by the copier.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest
from mint.schemas import tinker as wire
from mint.services.catalog import readable_checkpoint
from mint.services.tinker.checkpoints import copy_origin, str_dict
from mint.services.tinker.models import model_id_of
from mint.services.tinker.sessions import get_tinker_session
from mint.storage.tables import TinkerCheckpoint, TinkerSession, TrainingSession, as_utc, new_id, utcnow

DEFAULT_PROJECT = "default"
CLIENT_FINISH_REASONS = ("success", "errored", "interrupted")


def assign_project(session: Session, organization_id: str, session_id: str, project_id: str) -> TinkerSession:
    """File a session (and so its runs and samplers) under a project."""
    row = get_tinker_session(session, organization_id, session_id)
    row.project = project_id
    return row


# ---- search ------------------------------------------------------------------------------------


def status_of(row: TinkerSession) -> dict[str, Any] | None:
    """Tinker's `SessionStatus` of a session: active, or finished by its client (with the
    reason it gave); None for one that expired without a word from its client."""
    if row.status == "active":
        return {"type": "active"}
    if row.finish_reason in CLIENT_FINISH_REASONS:
        return {"type": "client_finished", "reason": {"type": row.finish_reason}, "detail": row.finish_detail}
    return None


def _matches_status(row: TinkerSession, queries: list[wire.SessionStatusQuery]) -> bool:
    status = status_of(row)
    if status is None:
        return False
    return any(
        query.type == status["type"] and (query.reasons is None or row.finish_reason in query.reasons)
        for query in queries
    )


def _matches_name(row: TinkerSession, words: list[str]) -> bool:
    name = (row.display_name or "").casefold()
    return bool(words) and all(word in name for word in words)


def search_sessions(
    session: Session, organization_id: str, body: wire.SessionSearchRequest
) -> wire.SessionSearchResponse:
    """One page of the organization's sessions that match, newest first."""
    if body.owner.type == "user":
        raise InvalidRequest(
            "Mint's keys belong to organizations, not users: search with owner `own` or `accessible` (both are "
            "the organization's sessions)",
            param="owner",
        )
    query = select(TinkerSession).where(TinkerSession.organization_id == organization_id)
    if body.project_ids is not None:
        projects = set(body.project_ids)
        in_projects = TinkerSession.project.in_(projects - {DEFAULT_PROJECT})
        query = query.where(
            or_(in_projects, TinkerSession.project.is_(None)) if DEFAULT_PROJECT in projects else in_projects
        )
    if body.cursor is not None:
        last = body.cursor.last_created_at
        query = query.where(
            or_(
                TinkerSession.created_at < last,
                and_(TinkerSession.created_at == last, TinkerSession.id < body.cursor.last_session_id),
            )
        )
    query = query.order_by(TinkerSession.created_at.desc(), TinkerSession.id.desc())
    words = body.display_name.casefold().split() if body.display_name else []
    found: list[TinkerSession] = []
    more = False
    for row in _rows(session, query):
        # With an id and a name, a session matching either one matches.
        named = body.session_id is not None or words
        if named and not (row.id == body.session_id or _matches_name(row, words)):
            continue
        if any(str_dict(row.user_metadata).get(key) != value for key, value in body.user_metadata.items()):
            continue
        if body.statuses is not None and not _matches_status(row, body.statuses):
            continue
        if len(found) == body.limit:
            more = True
            break
        found.append(row)
    counts = _checkpoint_counts(session, [row.id for row in found])
    sessions = [
        wire.SessionSummary(
            session_id=row.id,
            created_at=as_utc(row.created_at),
            owner=organization_id,
            project_id=row.project or DEFAULT_PROJECT,
            status=status_of(row),
            checkpoints_count=counts.get(row.id, (0, 0))[0],
            display_name=row.display_name,
            user_metadata=str_dict(row.user_metadata) or None,
            checkpoint_storage_bytes=counts.get(row.id, (0, 0))[1],
        )
        for row in found
    ]
    cursor = (
        wire.SessionSearchCursor(last_created_at=as_utc(found[-1].created_at), last_session_id=found[-1].id)
        if more and found
        else None
    )
    return wire.SessionSearchResponse(sessions=sessions, next_cursor=cursor)


def _rows(session: Session, query: Any, batch: int = 200) -> Iterator[TinkerSession]:
    """The query's rows, read a batch at a time (filters that SQL does not run are applied after)."""
    offset = 0
    while True:
        rows = session.execute(query.limit(batch).offset(offset)).scalars().all()
        yield from rows
        if len(rows) < batch:
            return
        offset += batch


def _checkpoint_counts(session: Session, session_ids: list[str]) -> dict[str, tuple[int, int]]:
    """Per Tinker session: how many checkpoints its runs hold, and their bytes."""
    if not session_ids:
        return {}
    rows = session.execute(
        select(
            TrainingSession.tinker_session_id, func.count(TinkerCheckpoint.id), func.sum(TinkerCheckpoint.size_bytes)
        )
        .join(TinkerCheckpoint, TinkerCheckpoint.model_id == TrainingSession.id)
        .where(TrainingSession.tinker_session_id.in_(session_ids))
        .group_by(TrainingSession.tinker_session_id)
    ).all()
    return {str(ident): (int(count), int(size or 0)) for ident, count, size in rows}


# ---- copies ------------------------------------------------------------------------------------


def copy_weights(session: Session, organization_id: str, body: wire.CopyWeightsRequest) -> wire.TinkerPath:
    """Copy a readable checkpoint into a new, closed training run of this organization; its path."""
    if body.weights_access_token is not None:
        raise InvalidRequest(
            "weights_access_token is not used by Mint: a checkpoint another organization published can be copied "
            "with your own key; leave it unset",
            param="weights_access_token",
        )
    source_path = wire.TinkerPath.parse(body.source_path)
    source = readable_checkpoint(session, organization_id, source_path, param="source_path")
    source_run = session.get(TrainingSession, source.model_id)
    assert source_run is not None
    if body.session_id is not None:
        if body.model_seq_id is None:
            raise InvalidRequest("send model_seq_id with session_id: the run slot the copy takes", param="model_seq_id")
        owner = get_tinker_session(session, organization_id, body.session_id)
        run_id = model_id_of(owner.id, body.model_seq_id)
        if session.get(TrainingSession, run_id) is not None:
            raise Conflict(f"run {run_id} already exists; copy into a free model_seq_id", param="model_seq_id")
    elif body.destination_project_id is not None:
        owner = TinkerSession(
            id=f"tks_{secrets.token_hex(8)}",
            organization_id=organization_id,
            status="finished",
            finish_reason="success",
            finish_detail=f"holds a copy of {source_path}",
            display_name=f"copy of {source_path}"[:200],
            project=body.destination_project_id,
            finished_at=utcnow(),
        )
        session.add(owner)
        session.flush()
        run_id = model_id_of(owner.id, 0)
    else:
        raise InvalidRequest(
            "name where the copy goes: destination_project_id, or session_id and model_seq_id",
            param="destination_project_id",
        )
    session.add(
        TrainingSession(
            id=run_id,
            organization_id=organization_id,
            base_model=source_run.base_model,
            kind="training",
            status="closed",  # a copy is read, sampled and downloaded, never trained
            lora=dict(source_run.lora),
            tags={"copied_from": str(source_path)},
            tinker_session_id=owner.id,
        )
    )
    session.flush()
    copy = TinkerCheckpoint(
        id=new_id("tkc"),
        organization_id=organization_id,
        model_id=run_id,
        kind=source.kind,
        name=source.name,
        object_key=source.object_key,
        sha256=source.sha256,
        size_bytes=source.size_bytes,
        adapter_version_id=source.adapter_version_id,
        user_metadata=dict(source.user_metadata or {}),
        expires_at=utcnow() + timedelta(seconds=body.ttl_seconds) if body.ttl_seconds is not None else None,
        # Another organization's published weights: the copy stands on that publication, and
        # only their organization may publish them (tinker_checkpoints, "Publishing").
        origin_checkpoint_id=copy_origin(source, organization_id),
    )
    session.add(copy)
    session.flush()
    return wire.TinkerPath(model_id=run_id, kind=wire.checkpoint_kind(source.kind), name=source.name)

"""Tinker sessions, the API half: created, kept alive by heartbeats, finished or expired, and viewed.

The official `tinker` SDK speaks of sessions, models, samplers and futures. In Mint:

- A **Tinker session** (`create_session`, one per `ServiceClient`) is a `tinker_sessions` row:
  its organization, heartbeat and finish reason. It is the container of the rest.
- A **model** (a `TrainingClient`, id `<session>:train:<n>`) is a `training_sessions` row,
  recorded with its requests by `mint.services.tinker.models`; it lives on ONE worker process.
- A **sampler** (a `SamplingClient`, id `<session>:sample:<n>`) is a `training_sessions` row too,
  recorded with its sample requests by `mint.services.tinker.sampling`; any worker of its base
  serves it.
- Every long call is a **future** (`futures` row, `mint.services.tinker.future_rows`), answered
  at once with its id and read back by `retrieve_future` (`mint.services.tinker.futures`).

When a session finishes (`finish_session`) or goes silent for MINT_TINKER_SESSION_IDLE_S
(`expire_idle_sessions`, a periodic sweep), its models and samplers are closed, their waiting
requests fail, and the worker processes holding its models are asked to free them
(RELEASE_TASK). An expired session answers `Gone` (410) from then on. The worker half is
`mint.services.tinker.runner`. This module never imports torch.
"""

from __future__ import annotations

import logging
import secrets
from datetime import timedelta

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from mint.errors import Gone, InvalidRequest
from mint.schemas import tinker as wire
from mint.services.billing import spend
from mint.services.billing.quotas import QuotaDefaults, hold
from mint.services.dispatch import Dispatch
from mint.services.tinker.checkpoints import str_dict
from mint.services.tinker.future_rows import fail_waiting, send_quietly
from mint.services.workers import live_worker
from mint.storage.queries import get_owned
from mint.storage.tables import BaseModelRow, TinkerSession, TrainingSession, utcnow

log = logging.getLogger(__name__)

RELEASE_TASK = "mint.tinker.release"
EXPIRE_TASK = "mint.tinker.expire_idle_sessions"
# The finish reason of a session that the sweep ended because its heartbeats stopped.
EXPIRED = "expired"


def create_session(
    session: Session, organization_id: str, body: wire.CreateSessionRequest, *, quotas: QuotaDefaults
) -> TinkerSession:
    """Record a live session; an organization at its tinker_sessions quota is refused (QuotaExceeded)."""
    organization = hold(session, organization_id, "tinker_sessions", quotas)
    spend.check_month_open(session, organization, "Tinker session")
    row = TinkerSession(
        id=f"tks_{secrets.token_hex(8)}",
        organization_id=organization_id,
        tags=sorted(set(body.tags)),
        user_metadata=str_dict(body.user_metadata),
        display_name=body.display_name,
        project=body.project_id,
        sdk_version=body.sdk_version,
        last_heartbeat_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row


def get_tinker_session(session: Session, organization_id: str, session_id: str) -> TinkerSession:
    return get_owned(session, TinkerSession, session_id, organization_id=organization_id, noun="session")


def active_session(session: Session, organization_id: str, session_id: str) -> TinkerSession:
    row = get_tinker_session(session, organization_id, session_id)
    if row.status != "active":
        raise_if_expired(row)
        raise InvalidRequest(
            f"session {session_id} is finished; create a new ServiceClient to start another", param="session_id"
        )
    return row


def raise_if_expired(row: TinkerSession | None) -> None:
    """`Gone` (410) if the session expired for want of heartbeats: nothing of it can be used again."""
    if row is not None and row.status != "active" and row.finish_reason == EXPIRED:
        raise Gone(row.finish_detail or f"session {row.id} expired; create a new session", param="session_id")


def heartbeat(session: Session, organization_id: str, session_id: str) -> bool:
    """Record a heartbeat; False once the session is finished (the SDK then stops sending them),
    `Gone` if it expired."""
    row = get_tinker_session(session, organization_id, session_id)
    if row.status != "active":
        raise_if_expired(row)
        return False
    row.last_heartbeat_at = utcnow()
    return True


def _end_session(
    session: Session, row: TinkerSession, reason: str, detail: str | None, why: str
) -> list[tuple[str, str]]:
    """Mark the session finished, close its models and samplers and fail their waiting requests
    (saying `why`); returns the (model, worker) pairs whose worker holds the model's weights.
    The caller commits, then releases them (`_release_models`)."""
    row.status, row.finished_at = "finished", utcnow()
    row.finish_reason, row.finish_detail = reason, detail
    members = session.execute(
        select(TrainingSession).where(TrainingSession.tinker_session_id == row.id, TrainingSession.status == "active")
    ).scalars()
    holders: list[tuple[str, str]] = []
    for member in members:
        member.status = "closed"
        fail_waiting(session, member.id, why)
        if member.kind == "training" and member.worker_id:
            holders.append((member.id, member.worker_id))
    return holders


def _release_models(session: Session, holders: list[tuple[str, str]], send: Dispatch) -> None:
    """Ask each live worker process that holds one of these models to free its memory (a dead
    one freed it with itself; a message lost here is made up by the worker's own sweep)."""
    for model_id, worker_id in holders:
        ref = live_worker(session, worker_id)
        if ref is not None:
            send_quietly(send, RELEASE_TASK, [model_id], worker=ref)


def finish_session(
    session: Session, organization_id: str, session_id: str, body: wire.FinishSessionRequest, send: Dispatch
) -> None:
    """Mark the session finished (the first reason wins), close its models and samplers, and
    ask their workers to free the models' memory."""
    row = get_tinker_session(session, organization_id, session_id)
    if row.status != "active":
        return
    why = f"session {row.id} was finished before this request ran"
    holders = _end_session(session, row, body.reason.type, body.detail, why)
    session.commit()
    _release_models(session, holders, send)


def expired_message(session_id: str, idle_s: float) -> str:
    return (
        f"session {session_id} expired after {idle_s:g} s without a heartbeat (MINT_TINKER_SESSION_IDLE_S); "
        "its models and samplers were released: create a new session (a new ServiceClient) and restore "
        "from a saved state"
    )


def expire_session(session: Session, row: TinkerSession, idle_s: float) -> list[tuple[str, str]]:
    """End a silent session as expired (see `_end_session`); the caller commits and releases."""
    message = expired_message(row.id, idle_s)
    return _end_session(session, row, EXPIRED, message, message)


def expire_idle_sessions(session: Session, *, idle_s: float, send: Dispatch) -> list[str]:
    """The periodic sweep: expire every active session whose last heartbeat is older than
    `idle_s`, fail its waiting requests, and tell the worker processes holding its models to free
    them, so that their LoRA slots serve other sessions and jobs. Returns the expired ids."""
    cutoff = utcnow() - timedelta(seconds=idle_s)
    silent = session.execute(
        select(TinkerSession)
        .where(
            TinkerSession.status == "active",
            or_(
                TinkerSession.last_heartbeat_at < cutoff,
                and_(TinkerSession.last_heartbeat_at.is_(None), TinkerSession.created_at < cutoff),
            ),
        )
        .with_for_update(skip_locked=True)
    ).scalars()
    expired: list[str] = []
    holders: list[tuple[str, str]] = []
    for row in silent:
        holders += expire_session(session, row, idle_s)
        expired.append(row.id)
    session.commit()
    if expired:
        log.info("expired %d silent Tinker sessions: %s", len(expired), ", ".join(expired))
    _release_models(session, holders, send)
    return expired


def session_view(session: Session, organization_id: str, session_id: str) -> wire.GetSessionResponse:
    row = get_tinker_session(session, organization_id, session_id)
    members = list(
        session.execute(
            select(TrainingSession.id, TrainingSession.kind)
            .where(TrainingSession.tinker_session_id == row.id)
            .order_by(TrainingSession.created_at)
        )
    )
    return wire.GetSessionResponse(
        training_run_ids=[ident for ident, kind in members if kind == "training"],
        sampler_ids=[ident for ident, kind in members if kind == "sampling"],
        user_metadata=str_dict(row.user_metadata) or None,
        display_name=row.display_name,
    )


def list_sessions(session: Session, organization_id: str, *, limit: int, offset: int) -> list[str]:
    query = (
        select(TinkerSession.id)
        .where(TinkerSession.organization_id == organization_id)
        .order_by(TinkerSession.created_at.desc(), TinkerSession.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return list(session.execute(query).scalars())


def server_capabilities(session: Session) -> wire.GetServerCapabilitiesResponse:
    rows = session.execute(select(BaseModelRow).where(BaseModelRow.enabled.is_(True)).order_by(BaseModelRow.name))
    return wire.GetServerCapabilitiesResponse(
        supported_models=[
            wire.SupportedModel(model_name=row.name, max_context_length=row.spec.get("context_length"))
            for row in rows.scalars()
        ]
    )


def enabled_base(session: Session, name: str) -> BaseModelRow:
    row = session.get(BaseModelRow, name)
    if row is None or not row.enabled:
        known = session.execute(select(BaseModelRow.name).where(BaseModelRow.enabled.is_(True))).scalars()
        raise InvalidRequest(
            f"unknown or disabled base model {name!r}; this server trains: {', '.join(sorted(known))}",
            param="base_model",
        )
    return row

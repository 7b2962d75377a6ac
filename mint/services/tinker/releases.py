"""Releasing a worker's Tinker models: the LoRA sessions this process holds for models whose
Tinker session ended, expired or went silent.

A release message frees one model, but a message can be lost; so every process also frees its
ended models itself before it takes a new LoRA session (a Tinker model's creation, a job, an
eval adapter), and one release message that arrives makes up for any that did not.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from mint.config import Settings
from mint.services.tinker.future_rows import fail_waiting
from mint.services.tinker.resident import held, release_model
from mint.services.tinker.sessions import expire_session
from mint.storage.db import session_scope
from mint.storage.tables import TinkerSession, TrainingSession, as_utc, utcnow


def release_idle_models(settings: Settings) -> int:
    """Free this process's models whose session finished, expired, or went silent for
    `tinker_session_idle_s` (expiring it here if the periodic sweep has not yet); returns how
    many. Every process runs it before it takes a new LoRA session (a Tinker model, a job, an
    eval adapter), so a release message that never arrived cannot keep a slot taken."""
    if not held.models:
        return 0
    cutoff = utcnow() - timedelta(seconds=settings.tinker_session_idle_s)
    released = 0
    with session_scope(settings.database) as session:
        rows = session.execute(
            select(TrainingSession, TinkerSession)
            .join(TinkerSession, TinkerSession.id == TrainingSession.tinker_session_id)
            .where(TrainingSession.id.in_(list(held.models)))
        ).all()
        found = {row.id for row, _ in rows}
        for row, owner in rows:
            silent = owner.last_heartbeat_at is None or as_utc(owner.last_heartbeat_at) < cutoff
            if owner.status == "active" and silent:
                expire_session(session, owner, settings.tinker_session_idle_s)
            if row.status != "active" or owner.status != "active":
                row.status = "closed"
                fail_waiting(session, row.id, f"model {row.id} was released: its session ended or expired")
                released += release_model(row.id)
        for model_id in set(held.models) - found:
            released += release_model(model_id)
    return released


def release(settings: Settings, model_id: str) -> int:
    """A release message: free `model_id` here, and with it any other model of this process
    whose session ended (so one message that arrives makes up for one that was lost)."""
    return release_model(model_id) + release_idle_models(settings)

"""The audit log: an append-only record of changes to keys, deployments and the like."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from mint.services.principal import Principal
from mint.storage.queries import PageResult, owned_by, paginate
from mint.storage.tables import AuditLog, new_id


def record_audit(
    session: Session,
    actor: Principal,
    action: str,
    resource_type: str,
    resource_id: str,
    data: dict[str, Any] | None = None,
) -> AuditLog:
    """Append one entry in the actor's organization, in the caller's transaction."""
    entry = AuditLog(
        id=new_id("audit"),
        organization_id=actor.organization_id,
        actor_key_id=actor.key_id,
        actor=actor.actor,
        action=action,
        resource_type=resource_type,
        resource_id=resource_id,
        data=data or {},
    )
    session.add(entry)
    return entry


def list_audit_log(session: Session, actor: Principal, *, after: str | None, limit: int) -> PageResult[AuditLog]:
    """One page of the actor's organization's audit log, newest first; admin keys only."""
    actor.require("admin")
    return paginate(session, owned_by(AuditLog, actor.organization_id), AuditLog, after=after, limit=limit)

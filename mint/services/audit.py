"""The audit log: an append-only record of changes to keys, deployments and the like."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from mint.services.principal import Principal
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

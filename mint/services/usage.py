"""Usage: tokens trained, sampled and served per organization."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mint.storage.tables import UsageRecord, new_id


def record_usage(
    session: Session,
    *,
    organization_id: str,
    kind: str,
    tokens: int,
    base_model: str,
    model_ref: str,
    resource_type: str | None = None,
    resource_id: str | None = None,
) -> UsageRecord:
    row = UsageRecord(
        id=new_id("usage"),
        organization_id=organization_id,
        kind=kind,
        tokens=tokens,
        base_model=base_model,
        model_ref=model_ref,
        resource_type=resource_type,
        resource_id=resource_id,
    )
    session.add(row)
    return row


def usage_summary(
    session: Session, organization_id: str, *, since: datetime | None = None, until: datetime | None = None
) -> list[tuple[str, str, int, int]]:
    """(kind, base_model, tokens, records) totals of one organization in a time window."""
    query = select(UsageRecord.kind, UsageRecord.base_model, func.sum(UsageRecord.tokens), func.count()).where(
        UsageRecord.organization_id == organization_id
    )
    if since is not None:
        query = query.where(UsageRecord.created_at >= since)
    if until is not None:
        query = query.where(UsageRecord.created_at < until)
    query = query.group_by(UsageRecord.kind, UsageRecord.base_model).order_by(UsageRecord.kind, UsageRecord.base_model)
    return [(kind, base, int(tokens or 0), int(count)) for kind, base, tokens, count in session.execute(query)]

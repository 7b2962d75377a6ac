"""Usage: tokens trained, sampled and served per organization, each record priced when used."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mint.schemas.usage import UsageLine
from mint.services.billing.prices import prices_for
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
    """Record usage at the base's price now (`cost_usd`)."""
    row = UsageRecord(
        id=new_id("usage"),
        organization_id=organization_id,
        kind=kind,
        tokens=tokens,
        base_model=base_model,
        model_ref=model_ref,
        resource_type=resource_type,
        resource_id=resource_id,
        cost_usd=prices_for(session, base_model).of(kind, tokens),
    )
    session.add(row)
    return row


def usage_summary(
    session: Session, organization_id: str, *, since: datetime | None = None, until: datetime | None = None
) -> list[UsageLine]:
    """Totals (tokens, records, cost) of one organization per kind and base, in a time window."""
    query = select(
        UsageRecord.kind,
        UsageRecord.base_model,
        func.sum(UsageRecord.tokens),
        func.count(),
        func.sum(UsageRecord.cost_usd),
    ).where(UsageRecord.organization_id == organization_id)
    if since is not None:
        query = query.where(UsageRecord.created_at >= since)
    if until is not None:
        query = query.where(UsageRecord.created_at < until)
    query = query.group_by(UsageRecord.kind, UsageRecord.base_model).order_by(UsageRecord.kind, UsageRecord.base_model)
    return [
        UsageLine.model_validate(  # the kind column is text: validated as the literal it was written from
            {
                "kind": kind,
                "base_model": base,
                "tokens": int(tokens or 0),
                "records": int(count),
                "cost_usd": round(cost or 0, 6),
            }
        )
        for kind, base, tokens, count, cost in session.execute(query)
    ]

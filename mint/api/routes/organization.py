"""The caller's organization, its audit log and its usage."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter

from mint.api.deps import CurrentPrincipal, QuotasDep, SessionDep
from mint.api.pagination import After, Limit, page_of
from mint.schemas.auth import AuditEntryPublic, OrganizationPublic, QuotasPublic
from mint.schemas.common import Page
from mint.schemas.usage import PriceLine, PriceTable, SpendLimits, SpendLimitsUpdate, UsageSummary
from mint.services import audit, auth
from mint.services.billing import prices as pricing
from mint.services.billing import spend
from mint.services.billing.quotas import quotas_of
from mint.services.billing.usage import usage_summary
from mint.storage.tables import Organization

router = APIRouter(prefix="/v1", tags=["organization"])


@router.get("/organization", response_model=OrganizationPublic)
def get_organization(session: SessionDep, principal: CurrentPrincipal) -> Organization:
    """The organization that owns the calling key."""
    return auth.get_organization(session, principal.organization_id)


@router.get("/organization/quotas", response_model=QuotasPublic)
def get_quotas(session: SessionDep, quotas: QuotasDep, principal: CurrentPrincipal) -> QuotasPublic:
    """This organization's quotas (live Tinker sessions, jobs, eval runs) and how much of each is
    in use. Operators set them with `mint admin orgs quota`."""
    organization = auth.get_organization(session, principal.organization_id)
    return QuotasPublic(organization_id=organization.id, data=quotas_of(session, organization, quotas))


def _spend_limits(session: SessionDep, organization: Organization) -> SpendLimits:
    status = spend.status_of(session, organization)
    return SpendLimits(
        organization_id=organization.id,
        month_usd=status.month_usd,
        job_usd=status.job_usd,
        spent_this_month_usd=round(status.spent_this_month_usd, 6),
        month_started_at=status.month_started_at,
    )


@router.get("/organization/spend_limits", response_model=SpendLimits)
def get_spend_limits(session: SessionDep, principal: CurrentPrincipal) -> SpendLimits:
    """This organization's spend limits, per calendar month and per job, and this month's spend."""
    return _spend_limits(session, auth.get_organization(session, principal.organization_id))


@router.patch("/organization/spend_limits", response_model=SpendLimits)
def update_spend_limits(body: SpendLimitsUpdate, session: SessionDep, principal: CurrentPrincipal) -> SpendLimits:
    """Set (a number) or remove (null) spend limits; admin keys, audited. A job whose estimate
    passes a limit is refused at create with a 402, and a running job stops before a step would
    take it past one."""
    organization = auth.get_organization(session, principal.organization_id)
    spend.set_limits(session, principal, organization, body.model_dump(include=body.model_fields_set))
    return _spend_limits(session, organization)


@router.get("/prices", response_model=PriceTable)
def get_prices(session: SessionDep, principal: CurrentPrincipal) -> PriceTable:
    """What each base costs: USD per million tokens trained, sampled and served, and per GPU-hour
    of full-parameter training. Operators set them with `mint admin prices set`."""
    return PriceTable(
        data=[
            PriceLine(
                base_model=base,
                usd_per_million_trained=prices.trained,
                usd_per_million_sampled=prices.sampled,
                usd_per_million_served=prices.served,
                usd_per_gpu_hour=prices.gpu_hour,
                is_default=is_default,
            )
            for base, prices, is_default in pricing.price_table(session)
        ]
    )


@router.get("/audit_log", response_model=Page[AuditEntryPublic])
def list_audit_log(
    session: SessionDep,
    principal: CurrentPrincipal,
    after: After = None,
    limit: Limit = 20,
) -> Page[AuditEntryPublic]:
    """Changes to keys, deployments and other audited resources, newest first (admin keys)."""
    result = audit.list_audit_log(session, principal, after=after, limit=limit)
    return page_of(result, AuditEntryPublic)


@router.get("/usage", response_model=UsageSummary)
def get_usage(
    session: SessionDep,
    principal: CurrentPrincipal,
    since: datetime | None = None,
    until: datetime | None = None,
) -> UsageSummary:
    """Tokens trained, sampled and served by this organization, by kind and base model, with
    what they cost."""
    lines = usage_summary(session, principal.organization_id, since=since, until=until)
    return UsageSummary(
        since=since,
        until=until,
        data=lines,
        total_cost_usd=round(sum(line.cost_usd for line in lines), 6),
    )

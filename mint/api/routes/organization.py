"""The caller's organization, its audit log and its usage."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter

from mint.api.deps import CurrentPrincipal, QuotasDep, SessionDep
from mint.api.pagination import After, Limit, page_of
from mint.schemas.auth import AuditEntryPublic, OrganizationPublic, QuotasPublic
from mint.schemas.common import Page
from mint.schemas.usage import UsageLine, UsageSummary
from mint.services import audit, auth
from mint.services.quotas import quotas_of
from mint.services.usage import usage_summary
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
    """Tokens trained, sampled and served by this organization, by kind and base model."""
    lines = usage_summary(session, principal.organization_id, since=since, until=until)
    return UsageSummary(
        since=since,
        until=until,
        data=[UsageLine(kind=k, base_model=b, tokens=t, records=n) for k, b, t, n in lines],  # type: ignore[arg-type]
    )

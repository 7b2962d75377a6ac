"""The caller's organization: who it is, its API keys, its audit log and its usage.

Creating and revoking keys and reading the audit log need an admin key; a key's secret is in
the answer to its creation only.
"""

from __future__ import annotations

from datetime import datetime

from mint.schemas.auth import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyPublic,
    AuditEntryPublic,
    OrganizationPublic,
    QuotasPublic,
    Role,
)
from mint.schemas.common import Page
from mint.schemas.usage import PriceTable, SpendLimits, SpendLimitsUpdate, UsageSummary
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_model, request_body
from mint.sdk.pagination import AsyncPager, PageCall, SyncPager


def get_organization() -> Call[OrganizationPublic]:
    return Call("GET", "/v1/organization", parse_model(OrganizationPublic))


def get_usage(since: datetime | None, until: datetime | None) -> Call[UsageSummary]:
    params = {"since": since.isoformat() if since else None, "until": until.isoformat() if until else None}
    return Call("GET", "/v1/usage", parse_model(UsageSummary), params)


def get_quotas() -> Call[QuotasPublic]:
    return Call("GET", "/v1/organization/quotas", parse_model(QuotasPublic))


def get_spend_limits() -> Call[SpendLimits]:
    return Call("GET", "/v1/organization/spend_limits", parse_model(SpendLimits))


def update_spend_limits(limits: dict[str, float | None]) -> Call[SpendLimits]:
    request_body(SpendLimitsUpdate, **limits)  # a wrong name or value fails here; None (remove) is sent as null
    return Call("PATCH", "/v1/organization/spend_limits", parse_model(SpendLimits), json=limits)


def get_prices() -> Call[PriceTable]:
    return Call("GET", "/v1/prices", parse_model(PriceTable))


def list_audit(limit: int) -> PageCall:
    return lambda after: Call(
        "GET", "/v1/audit_log", parse_model(Page[AuditEntryPublic]), {"after": after, "limit": limit}
    )


def create_key(name: str, role: Role, expires_in_days: int | None) -> Call[ApiKeyCreated]:
    body = request_body(ApiKeyCreate, name=name, role=role, expires_in_days=expires_in_days)
    return Call("POST", "/v1/api_keys", parse_model(ApiKeyCreated), json=body)


def list_keys(limit: int) -> PageCall:
    return lambda after: Call("GET", "/v1/api_keys", parse_model(Page[ApiKeyPublic]), {"after": after, "limit": limit})


def get_key(key_id: str) -> Call[ApiKeyPublic]:
    return Call("GET", f"/v1/api_keys/{key_id}", parse_model(ApiKeyPublic))


def revoke_key(key_id: str) -> Call[ApiKeyPublic]:
    return Call("DELETE", f"/v1/api_keys/{key_id}", parse_model(ApiKeyPublic))


class Organization:
    """`/v1/organization` (and its quotas), `/v1/usage` and `/v1/audit_log`."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def get(self) -> OrganizationPublic:
        """The organization that owns the calling key."""
        return self._http.send(get_organization())

    def usage(self, *, since: datetime | None = None, until: datetime | None = None) -> UsageSummary:
        """Tokens trained, sampled and served, by kind and base model."""
        return self._http.send(get_usage(since, until))

    def quotas(self) -> QuotasPublic:
        """The organization's quotas (live Tinker sessions, jobs, eval runs) and how much of each is in use."""
        return self._http.send(get_quotas())

    def spend_limits(self) -> SpendLimits:
        """The organization's spend limits (per month, per job) and what it spent this month."""
        return self._http.send(get_spend_limits())

    def set_spend_limits(self, **limits: float | None) -> SpendLimits:
        """Set `month_usd` and/or `job_usd` (None removes one); admin keys."""
        return self._http.send(update_spend_limits(limits))

    def prices(self) -> PriceTable:
        """What each base costs per million tokens trained, sampled and served."""
        return self._http.send(get_prices())

    def audit_log(self, *, limit: int = 20) -> SyncPager[AuditEntryPublic]:
        """Changes to keys, deployments and other audited resources, newest first (admin keys)."""
        return SyncPager(self._http, list_audit(limit))


class ApiKeys:
    """`/v1/api_keys`: keys of the caller's organization."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def create(self, name: str, *, role: Role = "developer", expires_in_days: int | None = None) -> ApiKeyCreated:
        """A new key; its secret (`key`) is shown in this answer only."""
        return self._http.send(create_key(name, role, expires_in_days))

    def list(self, *, limit: int = 20) -> SyncPager[ApiKeyPublic]:
        return SyncPager(self._http, list_keys(limit))

    def get(self, key_id: str) -> ApiKeyPublic:
        return self._http.send(get_key(key_id))

    def revoke(self, key_id: str) -> ApiKeyPublic:
        """Revoke a key at once; it stays listed, revoked, for the audit trail."""
        return self._http.send(revoke_key(key_id))


class AsyncOrganization:
    """The twin of `Organization`, for asyncio."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def get(self) -> OrganizationPublic:
        return await self._http.send(get_organization())

    async def usage(self, *, since: datetime | None = None, until: datetime | None = None) -> UsageSummary:
        return await self._http.send(get_usage(since, until))

    async def quotas(self) -> QuotasPublic:
        return await self._http.send(get_quotas())

    async def spend_limits(self) -> SpendLimits:
        return await self._http.send(get_spend_limits())

    async def set_spend_limits(self, **limits: float | None) -> SpendLimits:
        return await self._http.send(update_spend_limits(limits))

    async def prices(self) -> PriceTable:
        return await self._http.send(get_prices())

    def audit_log(self, *, limit: int = 20) -> AsyncPager[AuditEntryPublic]:
        return AsyncPager(self._http, list_audit(limit))


class AsyncApiKeys:
    """The twin of `ApiKeys`, for asyncio."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def create(self, name: str, *, role: Role = "developer", expires_in_days: int | None = None) -> ApiKeyCreated:
        return await self._http.send(create_key(name, role, expires_in_days))

    def list(self, *, limit: int = 20) -> AsyncPager[ApiKeyPublic]:
        return AsyncPager(self._http, list_keys(limit))

    async def get(self, key_id: str) -> ApiKeyPublic:
        return await self._http.send(get_key(key_id))

    async def revoke(self, key_id: str) -> ApiKeyPublic:
        return await self._http.send(revoke_key(key_id))

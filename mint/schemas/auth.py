"""Wire types for organizations and API keys."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mint.schemas.common import Label, RequestModel, WireModel

Role = Literal["admin", "developer", "viewer"]


class OrganizationPublic(WireModel):
    id: str
    name: str
    created_at: datetime


class ApiKeyCreate(RequestModel):
    model_config = ConfigDict(extra="forbid")

    name: Label = Field(description="A label for people, e.g. `ci-pipeline`.")
    role: Role = Field(default="developer", description="admin | developer | viewer.")
    expires_in_days: int | None = Field(
        default=None, ge=1, le=3650, description="Days until the key stops working; never if omitted."
    )


class ApiKeyPublic(WireModel):
    """An API key as lists show it: its prefix, never the secret."""

    id: str
    name: str
    prefix: str
    role: Role
    organization_id: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


class ApiKeyCreated(ApiKeyPublic):
    """The answer to a key creation: the only time the secret is shown."""

    key: str = Field(description="The secret. Store it now: Mint keeps only its hash.")


class AuditEntryPublic(WireModel):
    id: str
    actor: str
    actor_key_id: str | None
    action: str
    resource_type: str
    resource_id: str
    data: dict[str, object]
    created_at: datetime


QuotaKind = Literal["tinker_sessions", "tinker_models", "jobs", "eval_runs", "capture_storage_mib"]


class QuotaPublic(BaseModel):
    """One quota of an organization and how much of it is in use."""

    kind: QuotaKind = Field(description="tinker_sessions | tinker_models | jobs | eval_runs | capture_storage_mib.")
    description: str = Field(description="What the quota counts.")
    limit: int = Field(
        description="How many the organization may have at once (for `capture_storage_mib`, MiB it may keep); "
        "a create beyond it gets a 429."
    )
    used: int = Field(description="How many it has now (MiB, rounded up, for a storage quota).")
    is_default: bool = Field(description="True when the limit is the platform default (MINT_QUOTA_*).")


class QuotasPublic(BaseModel):
    """The quotas of an organization (operators set them with `mint admin orgs quota`)."""

    organization_id: str
    data: list[QuotaPublic]

"""Tenancy and access: organizations, their API keys, and the audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import ID_LENGTH, Base, created_column, id_column, one_of, organization_column

ROLES = ("admin", "developer", "viewer")


class Organization(Base):
    __tablename__ = "organizations"

    id: Mapped[str] = id_column()
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = created_column()
    # Quotas set by an operator (`mint admin orgs quota`); None: the platform default (MINT_QUOTA_*).
    quota_tinker_sessions: Mapped[int | None] = mapped_column(Integer)
    quota_tinker_models: Mapped[int | None] = mapped_column(Integer)
    quota_jobs: Mapped[int | None] = mapped_column(Integer)
    quota_eval_runs: Mapped[int | None] = mapped_column(Integer)
    quota_capture_storage_mib: Mapped[int | None] = mapped_column(Integer)
    # Spend limits the organization's admins set (`PATCH /v1/organization/spend_limits`); None: no limit.
    spend_limit_month_usd: Mapped[float | None] = mapped_column(Float)
    spend_limit_job_usd: Mapped[float | None] = mapped_column(Float)


class ApiKey(Base):
    """An API key. Only its sha256 is stored; `prefix` is what lists show."""

    __tablename__ = "api_keys"
    __table_args__ = (one_of("role", ROLES),)

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(32))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = created_column()
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_by_key_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))


class AuditLog(Base):
    """Who did what to which resource: keys, deployments, rollbacks, admin actions."""

    __tablename__ = "audit_log"

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    actor_key_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(100))
    resource_type: Mapped[str] = mapped_column(String(50))
    resource_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = created_column()

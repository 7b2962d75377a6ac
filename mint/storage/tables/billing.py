"""Billing: usage records and the price table."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, Float, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import ID_LENGTH, Base, created_column, id_column, one_of, utcnow

USAGE_KINDS = ("trained", "sampled", "served", "device_seconds")


class UsageRecord(Base):
    """Tokens trained, sampled or served, per organization, for billing and quotas; for
    `device_seconds` (full-parameter training, priced per GPU-hour) `tokens` holds seconds."""

    __tablename__ = "usage_records"
    __table_args__ = (one_of("kind", USAGE_KINDS), Index("ix_usage_org_created", "organization_id", "created_at"))

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("organizations.id"))
    kind: Mapped[str] = mapped_column(String(16))
    tokens: Mapped[int] = mapped_column(BigInteger)
    base_model: Mapped[str] = mapped_column(String(100))
    model_ref: Mapped[str] = mapped_column(String(300))
    resource_type: Mapped[str | None] = mapped_column(String(50))
    resource_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    # The tokens' price when they were used: a later change of the price table rewrites no bill.
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    created_at: Mapped[datetime] = created_column()


class Price(Base):
    """What a base costs, per million tokens trained, sampled and served, and per GPU-hour of
    full-parameter training. Operators set a row per base (`mint admin prices set`); a base
    without one is priced at the platform's defaults (`mint.services.billing.prices.DEFAULT_PRICES`)."""

    __tablename__ = "prices"

    base_model: Mapped[str] = mapped_column(String(100), ForeignKey("base_models.name"), primary_key=True)
    usd_per_million_trained: Mapped[float] = mapped_column(Float)
    usd_per_million_sampled: Mapped[float] = mapped_column(Float)
    usd_per_million_served: Mapped[float] = mapped_column(Float)
    usd_per_gpu_hour: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

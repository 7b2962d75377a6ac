"""Reward endpoints: servers a team hosts that score outputs for the `remote` grader."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import Base, created_column, id_column, organization_column, utcnow


class RewardEndpoint(Base):
    """An organization's reward server, named so that graders can refer to it (`remote` grader's
    `endpoint`). Mint POSTs the items to grade to `url`, signed as its webhooks are with `secret`
    (Standard Webhooks form, `whsec_<base64>`, kept as it is since Mint signs with it; shown once,
    at create and at rotate)."""

    __tablename__ = "reward_endpoints"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    name: Mapped[str] = mapped_column(String(100))
    url: Mapped[str] = mapped_column(String(2000))
    description: Mapped[str] = mapped_column(Text, default="")
    secret: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = created_column()
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

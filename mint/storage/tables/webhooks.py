"""Webhook endpoints and their deliveries (the outbox)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, DateTime, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import ID_LENGTH, Base, created_column, id_column, one_of, organization_column, utcnow

WEBHOOK_DELIVERY_STATUSES = ("pending", "succeeded", "failed")


class Webhook(Base):
    """An endpoint of an organization that receives signed events of the types it subscribes to.

    `secret` is kept as it is (Standard Webhooks form, `whsec_<base64>`), not hashed: Mint signs
    every delivery with it. It is shown once, at create and at rotate."""

    __tablename__ = "webhooks"

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    url: Mapped[str] = mapped_column(String(2000))
    description: Mapped[str] = mapped_column(Text, default="")
    event_types: Mapped[list[Any]] = mapped_column(default=list)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    secret: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = created_column()
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class WebhookDelivery(Base):
    """One event for one endpoint (the outbox): written in the transaction of the change it
    reports, then sent, retried with backoff until `max_attempts`. `attempt_log` holds every
    attempt: when, HTTP status, a response excerpt or the error, and how long it took."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        one_of("status", WEBHOOK_DELIVERY_STATUSES),
        Index("ix_webhook_deliveries_status_due", "status", "next_attempt_at"),
    )

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    webhook_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("webhooks.id"), index=True)
    # The event's id (`evt_...`): the `webhook-id` header, the same on every attempt and
    # redelivery, so that receivers can tell a repeat from a new event.
    event_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    event_type: Mapped[str] = mapped_column(String(100))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # When the next attempt is due; while an attempt runs, when it counts as lost (its worker
    # died) so that the resend sweep picks the delivery up again.
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    attempt_log: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime] = created_column()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

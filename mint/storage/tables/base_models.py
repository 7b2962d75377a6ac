"""The base models the platform can train and serve (platform-wide)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, DateTime, String
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import Base, created_column, utcnow


class BaseModelRow(Base):
    """A base model the platform can train and serve, synced from `configs/models/*.yaml`."""

    __tablename__ = "base_models"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    architecture: Mapped[str] = mapped_column(String(100))
    moe: Mapped[bool] = mapped_column(Boolean, default=False)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = created_column()
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

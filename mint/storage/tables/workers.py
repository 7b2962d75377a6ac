"""Live worker processes (platform-wide)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import Base, created_column


class Worker(Base):
    """A live Celery worker process, as it last reported itself (broker-independent view)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    base_model: Mapped[str | None] = mapped_column(String(100))
    queues: Mapped[list[Any]] = mapped_column(default=list)
    started_at: Mapped[datetime] = created_column()
    last_seen_at: Mapped[datetime] = created_column()

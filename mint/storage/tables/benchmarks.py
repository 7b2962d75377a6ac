"""Benchmarks and their immutable versions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import ID_LENGTH, Base, created_column, id_column, organization_column


class Benchmark(Base):
    __tablename__ = "benchmarks"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = created_column()


class BenchmarkVersion(Base):
    """An immutable set of tasks and a grader; `locked_at` is set by the first eval using it."""

    __tablename__ = "benchmark_versions"
    __table_args__ = (UniqueConstraint("benchmark_id", "version"),)

    id: Mapped[str] = id_column()
    benchmark_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("benchmarks.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    object_key: Mapped[str] = mapped_column(String(1024))
    sha256: Mapped[str] = mapped_column(String(64))
    task_count: Mapped[int] = mapped_column(Integer)
    splits: Mapped[dict[str, Any]] = mapped_column(default=dict)
    grader: Mapped[dict[str, Any]] = mapped_column(default=dict)
    locked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_column()

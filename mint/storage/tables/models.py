"""Adapters and their trained versions (LoRA or full)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import ID_LENGTH, Base, created_column, id_column, one_of, organization_column

ADAPTER_VERSION_STATUSES = ("validating", "ready", "invalid", "withdrawn", "deleted")
VERSION_KINDS = ("lora", "full")


class Adapter(Base):
    """A named line of LoRA adapter versions on one base model."""

    __tablename__ = "adapters"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    name: Mapped[str] = mapped_column(String(200))
    base_model: Mapped[str] = mapped_column(String(100), ForeignKey("base_models.name"))
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = created_column()


class AdapterVersion(Base):
    """An immutable trained version in the object store, keyed by its content hash: a PEFT adapter
    (`kind` lora), or a full-parameter job's whole transformers checkpoint (`kind` full, rank 0)."""

    __tablename__ = "adapter_versions"
    __table_args__ = (
        one_of("status", ADAPTER_VERSION_STATUSES),
        one_of("kind", VERSION_KINDS),
        UniqueConstraint("adapter_id", "version"),
    )

    id: Mapped[str] = id_column()
    adapter_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("adapters.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(8), default="lora", server_default="lora")
    object_key: Mapped[str] = mapped_column(String(1024))
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    base_model: Mapped[str] = mapped_column(String(100), ForeignKey("base_models.name"))
    rank: Mapped[int] = mapped_column(Integer)
    alpha: Mapped[float] = mapped_column(Float)
    targets: Mapped[dict[str, Any]] = mapped_column(default=dict)
    training_job_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("training_jobs.id"))
    # Lineage: the version this one was trained from (a job's `from_adapter`, or the previous
    # stage of a chained job); None for an adapter trained from scratch or uploaded.
    parent_version_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("adapter_versions.id"))
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # An uploaded version is `validating` until a worker of its base loads it: then `ready`, or
    # `invalid` with what did not fit in `error`.
    status: Mapped[str] = mapped_column(String(16), default="ready")
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = created_column()

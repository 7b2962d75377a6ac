"""Uploaded and mined datasets."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import ID_LENGTH, Base, created_column, id_column, one_of, organization_column

DATASET_KINDS = ("chat", "preference", "prompts")
DATASET_STATUSES = ("validating", "ready", "invalid")


class Dataset(Base):
    """An uploaded or mined JSONL dataset, validated row by row before it is `ready`."""

    __tablename__ = "datasets"
    __table_args__ = (
        one_of("kind", DATASET_KINDS),
        one_of("status", DATASET_STATUSES),
        UniqueConstraint("organization_id", "sha256", "kind"),
    )

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    filename: Mapped[str] = mapped_column(String(300))
    purpose: Mapped[str] = mapped_column(String(50), default="fine-tune")
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="validating")
    object_key: Mapped[str | None] = mapped_column(String(1024))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    row_count: Mapped[int] = mapped_column(Integer, default=0)
    validation_report: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Provenance of a mined dataset. A plain id, not a foreign key: datasets -> eval_runs ->
    # adapter_versions -> training_jobs -> datasets would be a cycle of constraints.
    source_eval_run_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    created_at: Mapped[datetime] = created_column()

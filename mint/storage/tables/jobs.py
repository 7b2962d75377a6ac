"""Fine-tuning jobs, their events and their resumable checkpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import ID_LENGTH, Base, created_column, id_column, one_of, organization_column

JOB_METHODS = ("sft", "dpo", "rl", "online_rl")
JOB_STATUSES = ("validating_files", "queued", "running", "succeeded", "failed", "cancelled")
EVENT_LEVELS = ("info", "warning", "error")
EVENT_TYPES = ("message", "metrics")


class TrainingJob(Base):
    """A fine-tuning job. `spec` is validated at creation (its plan again by the worker); the row is the truth."""

    __tablename__ = "training_jobs"
    __table_args__ = (
        one_of("method", JOB_METHODS),
        one_of("status", JOB_STATUSES),
        UniqueConstraint("organization_id", "idempotency_key"),
        Index("ix_training_jobs_status", "status"),
    )

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    base_model: Mapped[str] = mapped_column(String(100), ForeignKey("base_models.name"))
    method: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(20), default="validating_files")
    # None for an online RL job, which trains from a deployment's live episodes.
    training_dataset_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("datasets.id"))
    validation_dataset_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("datasets.id"))
    suffix: Mapped[str | None] = mapped_column(String(64))
    seed: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int] = mapped_column(Integer, default=0)
    completed_steps: Mapped[int] = mapped_column(Integer, default=0)
    trained_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    sampled_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # What it has cost so far (its usage records, and the steps not billed yet); estimate: `spec["estimate"]`.
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    # The lease of a running job: its worker refreshes it while the job runs; one that ran
    # out means the worker died, and the reconciler queues the job again.
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The queue message that carries the job now, so a lost message can be told from a waiting one.
    task_id: Mapped[str | None] = mapped_column(String(100))
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Optimizer steps run again after resuming from a checkpoint (never part of the final adapter twice).
    steps_redone: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    result_adapter_version_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_column()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class JobEvent(Base):
    """A message or a metrics point of a job; the integer id orders them for `after` paging."""

    __tablename__ = "job_events"
    __table_args__ = (one_of("level", EVENT_LEVELS), one_of("type", EVENT_TYPES))

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("training_jobs.id"), index=True)
    level: Mapped[str] = mapped_column(String(16), default="info")
    type: Mapped[str] = mapped_column(String(16), default="message")
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = created_column()


class Checkpoint(Base):
    """Resumable training state of a job at one step (adapter, optimizer, data position)."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    id: Mapped[str] = id_column()
    job_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("training_jobs.id"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    object_key: Mapped[str] = mapped_column(String(1024))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = created_column()

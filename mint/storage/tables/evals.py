"""Eval runs and the trajectory of each task in them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import ID_LENGTH, Base, created_column, id_column, one_of, organization_column

EVAL_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")


class EvalRun(Base):
    """One benchmark version evaluated against one model reference."""

    __tablename__ = "eval_runs"
    __table_args__ = (one_of("status", EVAL_STATUSES),)

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    benchmark_version_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("benchmark_versions.id"), index=True
    )
    model_ref: Mapped[str] = mapped_column(String(300))
    adapter_version_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("adapter_versions.id"))
    split: Mapped[str | None] = mapped_column(String(50))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Claims so far; at `max_attempts` the run fails instead of being queued again.
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The lease of a running run and its current queue message, as for fine-tuning jobs.
    worker_id: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    task_id: Mapped[str | None] = mapped_column(String(100))
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_column()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Trajectory(Base):
    """Everything one task did in one eval run: messages, tool calls, output, grade and cost."""

    __tablename__ = "trajectories"
    __table_args__ = (
        UniqueConstraint("eval_run_id", "task_id"),
        Index("ix_trajectories_run_passed", "eval_run_id", "passed"),
    )

    id: Mapped[str] = id_column()
    eval_run_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("eval_runs.id"))
    task_id: Mapped[str] = mapped_column(String(200))
    messages: Mapped[list[Any]] = mapped_column(default=list)
    output: Mapped[str] = mapped_column(Text, default="")
    score: Mapped[float] = mapped_column(Float, default=0.0)
    passed: Mapped[bool] = mapped_column(Boolean, default=False)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    tokens_in: Mapped[int] = mapped_column(Integer, default=0)
    tokens_out: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    # How the grader reached its score (`mint.evals.graders.Grade.record`): its detail, a
    # composite's parts, a judge's prompt and reply. None for rows written before it was kept.
    grade: Mapped[dict[str, Any] | None] = mapped_column()
    # Which adapter served each step and why (`mint.evals.runner.TrajectoryRecord.routes`): set
    # by an eval of a mixture deployment, whose router picks an adapter per request.
    routes: Mapped[list[Any] | None] = mapped_column()
    created_at: Mapped[datetime] = created_column()

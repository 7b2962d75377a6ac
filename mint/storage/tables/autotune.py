"""Auto mode: autotune runs and their trials."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import ID_LENGTH, Base, created_column, id_column, one_of, organization_column

AUTOTUNE_STATUSES = ("queued", "running", "succeeded", "stopped", "failed", "cancelled")


class AutotuneRun(Base):
    """An auto run: a goal and a budget on one base and benchmark; its trials are ordinary jobs
    and eval runs. `state` holds where the run is (phase, the base's eval runs, the mined
    datasets, the best trial, the result), `decisions` every choice with its reason."""

    __tablename__ = "autotune_runs"
    __table_args__ = (one_of("status", AUTOTUNE_STATUSES),)

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    base_model: Mapped[str] = mapped_column(String(100), ForeignKey("base_models.name"))
    benchmark_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("benchmarks.id"))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    request: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Who started it: its jobs and eval runs are created in that key's name.
    created_by: Mapped[dict[str, Any]] = mapped_column(default=dict)
    state: Mapped[dict[str, Any]] = mapped_column(default=dict)
    decisions: Mapped[list[Any]] = mapped_column(default=list)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The driver's next tick message: only the tick holding this id advances the run (and sends
    # the next), so a duplicate message or a re-send never starts a second driver.
    tick_id: Mapped[str | None] = mapped_column(String(100))
    # When its driver last advanced it: the reconciler re-sends a run whose driver went quiet.
    advanced_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_column()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AutotuneTrial(Base):
    """One trial of an auto run: the parameters the search chose, its job and its dev eval run."""

    __tablename__ = "autotune_trials"
    __table_args__ = (UniqueConstraint("run_id", "number"),)

    id: Mapped[str] = id_column()
    run_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("autotune_runs.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    method: Mapped[str] = mapped_column(String(16))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default="training")
    job_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("training_jobs.id"))
    eval_run_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("eval_runs.id"))
    model_ref: Mapped[str | None] = mapped_column(String(300))
    dev_pass_rate: Mapped[float | None] = mapped_column(Float)
    dev_mean_score: Mapped[float | None] = mapped_column(Float)
    estimated_usd: Mapped[float | None] = mapped_column(Float)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = created_column()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

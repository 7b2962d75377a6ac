"""Expert review: queues of trajectories or captured answers, their items, and the reviews of them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import ID_LENGTH, Base, created_column, id_column, one_of, organization_column, utcnow

REVIEW_SOURCES = ("eval_run", "deployment")


class ReviewQueue(Base):
    """A round of expert review: the items chosen from one source (an eval run's trajectories,
    or a deployment's captures) by `filters`, and how many reviews each item should get."""

    __tablename__ = "review_queues"
    __table_args__ = (one_of("source", REVIEW_SOURCES),)

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    name: Mapped[str] = mapped_column(String(200))
    instructions: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(16))
    eval_run_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("eval_runs.id"), index=True)
    deployment_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("deployments.id"))
    # The version the run evaluated (None for captures): agreement is reported per version.
    benchmark_version_id: Mapped[str | None] = mapped_column(
        String(ID_LENGTH), ForeignKey("benchmark_versions.id"), index=True
    )
    filters: Mapped[dict[str, Any]] = mapped_column(default=dict)
    reviews_per_item: Mapped[int] = mapped_column(Integer, default=1)
    item_count: Mapped[int] = mapped_column(Integer, default=0)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = created_column()


class ReviewItem(Base):
    """One trajectory or capture to review, with a snapshot of everything a reviewer reads
    (`mint.schemas.reviews.ItemSnapshot`), so that the item reads the same whatever happens
    to its source later (a capture past its retention, a benchmark with a new version)."""

    __tablename__ = "review_items"
    __table_args__ = (UniqueConstraint("queue_id", "source_id"), UniqueConstraint("queue_id", "position"))

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    queue_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("review_queues.id"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    # The trajectory's id or the capture's id (a plain id: captures are deleted past retention).
    source_id: Mapped[str] = mapped_column(String(64), index=True)
    task_id: Mapped[str] = mapped_column(String(200))
    # The key whose reviewer should judge it; None: any reviewer of the organization.
    assignee_key_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    snapshot: Mapped[dict[str, Any]] = mapped_column(default=dict)
    reasons: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime] = created_column()


class Review(Base):
    """One reviewer's judgement of one item: a verdict, rubric marks, a comment and perhaps
    the corrected trajectory. One per reviewer per item: a second submission replaces the
    first (the first stays in the audit log)."""

    __tablename__ = "reviews"
    __table_args__ = (UniqueConstraint("item_id", "reviewer"),)

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    item_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("review_items.id"), index=True)
    # Who reviewed: `key:<key id>` (Principal.actor), and the key's name as it was then.
    reviewer: Mapped[str] = mapped_column(String(200))
    reviewer_name: Mapped[str] = mapped_column(String(200))
    passed: Mapped[bool | None] = mapped_column(Boolean)
    score: Mapped[float | None] = mapped_column(Float)
    rubric: Mapped[dict[str, Any]] = mapped_column(default=dict)
    comment: Mapped[str | None] = mapped_column(Text)
    # {"from_message": index into the snapshot's messages, "messages": the rewritten turns}.
    correction: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = created_column()
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

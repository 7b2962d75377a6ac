"""Serving: deployments and their revisions, captured traffic and its feedback, serving nodes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.sql.expression import false

from mint.storage.tables.base import ID_LENGTH, Base, created_column, id_column, one_of, organization_column, utcnow

DEPLOYMENT_KINDS = ("single", "mixture")
DEPLOYMENT_STATUSES = ("active", "withdrawn")
REVISION_ACTIONS = ("create", "promote", "rollback", "withdraw", "update")


class Deployment(Base):
    """A name that serves one adapter version (single) or routes among several (mixture)."""

    __tablename__ = "deployments"
    __table_args__ = (
        one_of("kind", DEPLOYMENT_KINDS),
        one_of("status", DEPLOYMENT_STATUSES),
        UniqueConstraint("organization_id", "name"),
    )

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16), default="single")
    base_model: Mapped[str] = mapped_column(String(100), ForeignKey("base_models.name"))
    status: Mapped[str] = mapped_column(String(16), default="active")
    current_revision: Mapped[int] = mapped_column(Integer, default=0)
    gate: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Production capture, opt-in: the share of requests recorded (0: none) and for how long.
    capture_rate: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    capture_retention_days: Mapped[int] = mapped_column(Integer, default=30, server_default="30")
    # Whether the turns of marked episodes are recorded token-exact (prompt ids, sampled ids, logprobs).
    capture_tokens: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = created_column()
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class DeploymentRevision(Base):
    """One state of a deployment; promote, rollback and withdraw each add a revision."""

    __tablename__ = "deployment_revisions"
    __table_args__ = (one_of("action", REVISION_ACTIONS), UniqueConstraint("deployment_id", "revision"))

    id: Mapped[str] = id_column()
    deployment_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("deployments.id"), index=True)
    revision: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(16))
    adapter_version_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("adapter_versions.id"))
    routing: Mapped[dict[str, Any]] = mapped_column(default=dict)
    gate_verdict: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    reason: Mapped[str] = mapped_column(Text, default="")
    created_by_key_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    created_at: Mapped[datetime] = created_column()


class Capture(Base):
    """One request a deployment served, recorded because its deployment captures traffic: what
    was asked, what was answered and by which version, tokens and latency. Its id is the
    completion's (`chatcmpl-...`), so a client's answer finds its record; it is deleted once
    `expires_at` passes (with its feedback)."""

    __tablename__ = "captures"
    __table_args__ = (Index("ix_captures_deployment_created", "deployment_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    organization_id: Mapped[str] = organization_column()
    deployment_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("deployments.id"))
    revision: Mapped[int] = mapped_column(Integer)
    model_ref: Mapped[str] = mapped_column(String(300))  # the version that answered
    kind: Mapped[str] = mapped_column(String(16))  # chat | completion
    request: Mapped[dict[str, Any]] = mapped_column(default=dict)
    response: Mapped[dict[str, Any]] = mapped_column(default=dict)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    # Bytes of its request and response as JSON: what it counts against the capture storage quota.
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = created_column()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class Feedback(Base):
    """What someone said about a captured answer: a score, a label, a comment, and perhaps the
    answer it should have been (`correction`: an assistant message, or the text of a completion)."""

    __tablename__ = "feedback"

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    capture_id: Mapped[str] = mapped_column(String(64), ForeignKey("captures.id"), index=True)
    score: Mapped[float | None] = mapped_column(Float)
    label: Mapped[str | None] = mapped_column(String(100))
    comment: Mapped[str | None] = mapped_column(Text)
    correction: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Bytes of it as JSON: what it counts against the capture storage quota.
    stored_bytes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = created_column()


class ServingNode(Base):
    """A live serving node (`mint serve --base NAME`): where the API forwards inference for a base."""

    __tablename__ = "serving_nodes"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    base_model: Mapped[str] = mapped_column(String(100), index=True)
    url: Mapped[str] = mapped_column(String(500))
    hostname: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    # The credential the node issued itself (MINT_NODE_TOKEN unset), which the API presents on
    # every call to it; None where the node requires the shared MINT_NODE_TOKEN instead.
    token: Mapped[str | None] = mapped_column(String(200), nullable=True)
    started_at: Mapped[datetime] = created_column()
    last_seen_at: Mapped[datetime] = created_column()

"""Tinker primitives: client sessions, training and sampling sessions, futures, checkpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import ID_LENGTH, Base, created_column, id_column, one_of, organization_column

TINKER_SESSION_STATUSES = ("active", "finished")
SESSION_KINDS = ("training", "sampling")
SESSION_STATUSES = ("active", "closed")
FUTURE_STATUSES = ("pending", "running", "succeeded", "failed", "cancelled")
TINKER_CHECKPOINT_KINDS = ("training", "sampler", "external")


class TinkerSession(Base):
    """A Tinker client session (one `ServiceClient`): the container of its models and samplers."""

    __tablename__ = "tinker_sessions"
    __table_args__ = (
        one_of("status", TINKER_SESSION_STATUSES),
        Index("ix_tinker_sessions_org_project", "organization_id", "project"),
    )

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    status: Mapped[str] = mapped_column(String(16), default="active")
    tags: Mapped[list[Any]] = mapped_column(default=list)
    user_metadata: Mapped[dict[str, Any]] = mapped_column(default=dict)
    display_name: Mapped[str | None] = mapped_column(String(200))
    # The Tinker project it belongs to: a label inside the organization (None: the default project).
    project: Mapped[str | None] = mapped_column(String(200))
    sdk_version: Mapped[str | None] = mapped_column(String(50))
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    finish_detail: Mapped[str | None] = mapped_column(Text)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_column()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class TrainingSession(Base):
    """A Tinker-style session: LoRA training or sampling clients on one resident base.

    Its id is the Tinker model id (`<session>:train:<n>`) or sampler id (`<session>:sample:<n>`).
    """

    __tablename__ = "training_sessions"
    __table_args__ = (one_of("kind", SESSION_KINDS), one_of("status", SESSION_STATUSES))

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    base_model: Mapped[str] = mapped_column(String(100), ForeignKey("base_models.name"))
    kind: Mapped[str] = mapped_column(String(16), default="training")
    status: Mapped[str] = mapped_column(String(16), default="active")
    lora: Mapped[dict[str, Any]] = mapped_column(default=dict)
    tags: Mapped[dict[str, Any]] = mapped_column(default=dict)
    next_seq_id: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_column()
    tinker_session_id: Mapped[str | None] = mapped_column(
        String(ID_LENGTH), ForeignKey("tinker_sessions.id"), index=True
    )
    # Samplers: the `tinker://` path they sample (None: the base or a save-and-sample
    # snapshot) and the PEFT archive in the object store that holds their adapter.
    model_path: Mapped[str | None] = mapped_column(String(1024))
    adapter_object_key: Mapped[str | None] = mapped_column(String(1024))


class Future(Base):
    """The state of one asynchronous primitive call; clients poll it by id."""

    __tablename__ = "futures"
    __table_args__ = (
        one_of("status", FUTURE_STATUSES),
        # One request per seq_id of a model (samplers' requests have none).
        Index("ix_futures_model_seq", "model_id", "seq_id", unique=True),
    )

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    session_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("training_sessions.id"), index=True)
    model_id: Mapped[str | None] = mapped_column(String(200))
    seq_id: Mapped[int | None] = mapped_column(Integer)
    operation: Mapped[str] = mapped_column(String(50))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    request_object_key: Mapped[str | None] = mapped_column(String(1024))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    result_object_key: Mapped[str | None] = mapped_column(String(1024))
    error: Mapped[str | None] = mapped_column(Text)
    error_category: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = created_column()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The request itself when small; a large one is in the object store (request_object_key).
    request: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The worker process running it (`<node>/<pid>`), so that a request whose worker died fails.
    worker_id: Mapped[str | None] = mapped_column(String(200))


class TinkerCheckpoint(Base):
    """A saved training state (`kind` training), sampler weights (`kind` sampler) or external
    weights (`kind` external: PEFT files to download) of a Tinker model, addressed as
    `tinker://<model_id>/weights/<name>`, `.../sampler_weights/<name>` or `.../external_weights/<name>`.
    Sampler weights are also an adapter version (`adapter_version_id`). A `public` checkpoint
    can be read (listed, loaded, sampled, downloaded) by every organization; only its own
    organization can change or delete it."""

    __tablename__ = "tinker_checkpoints"
    __table_args__ = (
        one_of("kind", TINKER_CHECKPOINT_KINDS),
        UniqueConstraint("model_id", "kind", "name"),
    )

    id: Mapped[str] = id_column()
    organization_id: Mapped[str] = organization_column()
    model_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("training_sessions.id"))
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(200))
    object_key: Mapped[str] = mapped_column(String(1024))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    adapter_version_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("adapter_versions.id"))
    user_metadata: Mapped[dict[str, Any]] = mapped_column(default=dict)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    public: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # A `copy_weights` copy of another organization's published checkpoint: that checkpoint's id
    # (no foreign key: the copy is ended with it, but retention may delete it first). The copy
    # stands only while that publication does, and its holder cannot publish it.
    origin_checkpoint_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), index=True)
    created_at: Mapped[datetime] = created_column()

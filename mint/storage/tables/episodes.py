"""Episodes: the turns of one agent's task, recorded token-exact from a deployment's serving
path, and the reward given to it afterwards. Online RL trains from them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mint.storage.tables.base import ID_LENGTH, Base, created_column, organization_column, utcnow


class Episode(Base):
    """One episode of an agent harness on a deployment: the client's key for it (`key`, unique in
    the organization), the task it belongs to (episodes sharing a task form an RL group), its
    turns' count, and its reward once given. Deleted once `expires_at` passes, with its turns."""

    __tablename__ = "episodes"
    __table_args__ = (
        UniqueConstraint("organization_id", "key"),
        Index("ix_episodes_deployment_rewarded", "deployment_id", "rewarded_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    organization_id: Mapped[str] = organization_column()
    deployment_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("deployments.id"))
    key: Mapped[str] = mapped_column(String(128))
    task: Mapped[str | None] = mapped_column(String(128))
    turn_count: Mapped[int] = mapped_column(Integer, default=0)
    reward: Mapped[float | None] = mapped_column(Float)
    turn_scores: Mapped[list[Any] | None] = mapped_column(JSON)
    label: Mapped[str | None] = mapped_column(String(100))
    comment: Mapped[str | None] = mapped_column(Text)
    rewarded_by: Mapped[str | None] = mapped_column(String(200))
    rewarded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Bytes of its turns (and reward) as JSON: what it counts against the capture storage quota.
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = created_column()
    last_turn_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class EpisodeTurn(Base):
    """One request of an episode, as the serving engine saw it: the messages the harness sent
    (the tool results of the previous turn among them), the prompt's token ids as the engine
    rendered them, the ids it sampled with their logprobs, the version that sampled them, and
    the assistant message (tool calls parsed) it answered. Its id is the completion's."""

    __tablename__ = "episode_turns"
    __table_args__ = (Index("ix_episode_turns_episode_created", "episode_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    organization_id: Mapped[str] = organization_column()
    episode_id: Mapped[str] = mapped_column(String(64), ForeignKey("episodes.id"))
    revision: Mapped[int] = mapped_column(Integer)
    model_ref: Mapped[str] = mapped_column(String(300))  # the version that sampled it
    request: Mapped[dict[str, Any]] = mapped_column(default=dict)  # messages, tools, sampling
    response: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the assistant message, finish reason
    prompt_token_ids: Mapped[list[Any]] = mapped_column(JSON, default=list)
    token_ids: Mapped[list[Any]] = mapped_column(JSON, default=list)
    logprobs: Mapped[list[Any]] = mapped_column(JSON, default=list)
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = created_column()

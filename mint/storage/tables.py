"""SQLAlchemy 2.0 tables: the whole data model of DESIGN.md section 4.

Conventions:
- Primary keys are short prefixed strings (`org_...`, `ftjob_...`) made by `new_id`, so ids
  say what they name in logs and URLs, and never reveal counts.
- Every tenant resource carries `organization_id`; queries filter on it (see
  `mint.storage.queries`). A row of another organization is a 404, never a 403.
- Timestamps are timezone-aware UTC.
- Enumerations are stored as short strings with a CHECK constraint, so that adding a
  value is a plain migration on SQLite and PostgreSQL alike.
- Free-form but validated documents (specs, metrics, reports) are JSON columns.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID_LENGTH = 40
ROLES = ("admin", "developer", "viewer")
DATASET_KINDS = ("chat", "preference", "prompts")
DATASET_STATUSES = ("validating", "ready", "invalid")
EVAL_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
JOB_METHODS = ("sft", "dpo", "rl")
JOB_STATUSES = ("validating_files", "queued", "running", "succeeded", "failed", "cancelled")
EVENT_LEVELS = ("info", "warning", "error")
EVENT_TYPES = ("message", "metrics")
ADAPTER_VERSION_STATUSES = ("validating", "ready", "invalid", "withdrawn", "deleted")
DEPLOYMENT_KINDS = ("single", "mixture")
DEPLOYMENT_STATUSES = ("active", "withdrawn")
REVISION_ACTIONS = ("create", "promote", "rollback", "withdraw", "update")
SESSION_KINDS = ("training", "sampling")
SESSION_STATUSES = ("active", "closed")
FUTURE_STATUSES = ("pending", "running", "succeeded", "failed", "cancelled")
TINKER_SESSION_STATUSES = ("active", "finished")
AUTOTUNE_STATUSES = ("queued", "running", "succeeded", "stopped", "failed", "cancelled")
TINKER_CHECKPOINT_KINDS = ("training", "sampler", "external")
USAGE_KINDS = ("trained", "sampled", "served", "device_seconds")
VERSION_KINDS = ("lora", "full")
WEBHOOK_DELIVERY_STATUSES = ("pending", "succeeded", "failed")


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """`moment` as an aware UTC datetime: SQLite hands back naive values for aware columns."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def new_id(prefix: str) -> str:
    """A random, URL-safe id that names its kind, e.g. `ftjob_3pX...`."""
    return f"{prefix}_{secrets.token_urlsafe(16).replace('-', 'x').replace('_', 'z')}"


def _one_of(column: str, values: tuple[str, ...]) -> CheckConstraint:
    allowed = ", ".join(f"'{v}'" for v in values)
    return CheckConstraint(f"{column} IN ({allowed})", name=f"{column}_allowed")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


def _id() -> Mapped[str]:
    return mapped_column(String(ID_LENGTH), primary_key=True)


def _org() -> Mapped[str]:
    return mapped_column(String(ID_LENGTH), ForeignKey("organizations.id"), index=True)


def _created() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), default=utcnow)


# --- tenancy and access -------------------------------------------------------------------


class Organization(Base):
    __tablename__ = "organizations"

    id: Mapped[str] = _id()
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = _created()
    # Quotas set by an operator (`mint admin orgs quota`); None: the platform default (MINT_QUOTA_*).
    quota_tinker_sessions: Mapped[int | None] = mapped_column(Integer)
    quota_tinker_models: Mapped[int | None] = mapped_column(Integer)
    quota_jobs: Mapped[int | None] = mapped_column(Integer)
    quota_eval_runs: Mapped[int | None] = mapped_column(Integer)
    quota_capture_storage_mib: Mapped[int | None] = mapped_column(Integer)
    # Spend limits the organization's admins set (`PATCH /v1/organization/spend_limits`); None: no limit.
    spend_limit_month_usd: Mapped[float | None] = mapped_column(Float)
    spend_limit_job_usd: Mapped[float | None] = mapped_column(Float)


class ApiKey(Base):
    """An API key. Only its sha256 is stored; `prefix` is what lists show."""

    __tablename__ = "api_keys"
    __table_args__ = (_one_of("role", ROLES),)

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(32))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = _created()
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_by_key_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))


class AuditLog(Base):
    """Who did what to which resource: keys, deployments, rollbacks, admin actions."""

    __tablename__ = "audit_log"

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
    actor_key_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(100))
    resource_type: Mapped[str] = mapped_column(String(50))
    resource_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = _created()


class UsageRecord(Base):
    """Tokens trained, sampled or served, per organization, for billing and quotas; for
    `device_seconds` (full-parameter training, priced per GPU-hour) `tokens` holds seconds."""

    __tablename__ = "usage_records"
    __table_args__ = (_one_of("kind", USAGE_KINDS), Index("ix_usage_org_created", "organization_id", "created_at"))

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("organizations.id"))
    kind: Mapped[str] = mapped_column(String(16))
    tokens: Mapped[int] = mapped_column(BigInteger)
    base_model: Mapped[str] = mapped_column(String(100))
    model_ref: Mapped[str] = mapped_column(String(300))
    resource_type: Mapped[str | None] = mapped_column(String(50))
    resource_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    # The tokens' price when they were used: a later change of the price table rewrites no bill.
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    created_at: Mapped[datetime] = _created()


# --- platform-wide ------------------------------------------------------------------------


class BaseModelRow(Base):
    """A base model the platform can train and serve, synced from `configs/models/*.yaml`."""

    __tablename__ = "base_models"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    architecture: Mapped[str] = mapped_column(String(100))
    moe: Mapped[bool] = mapped_column(Boolean, default=False)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class Price(Base):
    """What a base costs, per million tokens trained, sampled and served, and per GPU-hour of
    full-parameter training. Operators set a row per base (`mint admin prices set`); a base
    without one is priced at the platform's defaults (`mint.services.billing.prices.DEFAULT_PRICES`)."""

    __tablename__ = "prices"

    base_model: Mapped[str] = mapped_column(String(100), ForeignKey("base_models.name"), primary_key=True)
    usd_per_million_trained: Mapped[float] = mapped_column(Float)
    usd_per_million_sampled: Mapped[float] = mapped_column(Float)
    usd_per_million_served: Mapped[float] = mapped_column(Float)
    usd_per_gpu_hour: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Worker(Base):
    """A live Celery worker process, as it last reported itself (broker-independent view)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    base_model: Mapped[str | None] = mapped_column(String(100))
    queues: Mapped[list[Any]] = mapped_column(default=list)
    started_at: Mapped[datetime] = _created()
    last_seen_at: Mapped[datetime] = _created()


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
    started_at: Mapped[datetime] = _created()
    last_seen_at: Mapped[datetime] = _created()


# --- data ---------------------------------------------------------------------------------


class Dataset(Base):
    """An uploaded or mined JSONL dataset, validated row by row before it is `ready`."""

    __tablename__ = "datasets"
    __table_args__ = (
        _one_of("kind", DATASET_KINDS),
        _one_of("status", DATASET_STATUSES),
        UniqueConstraint("organization_id", "sha256", "kind"),
    )

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
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
    created_at: Mapped[datetime] = _created()


# --- evals --------------------------------------------------------------------------------


class Benchmark(Base):
    __tablename__ = "benchmarks"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = _created()


class BenchmarkVersion(Base):
    """An immutable set of tasks and a grader; `locked_at` is set by the first eval using it."""

    __tablename__ = "benchmark_versions"
    __table_args__ = (UniqueConstraint("benchmark_id", "version"),)

    id: Mapped[str] = _id()
    benchmark_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("benchmarks.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    object_key: Mapped[str] = mapped_column(String(1024))
    sha256: Mapped[str] = mapped_column(String(64))
    task_count: Mapped[int] = mapped_column(Integer)
    splits: Mapped[dict[str, Any]] = mapped_column(default=dict)
    grader: Mapped[dict[str, Any]] = mapped_column(default=dict)
    locked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _created()


class EvalRun(Base):
    """One benchmark version evaluated against one model reference."""

    __tablename__ = "eval_runs"
    __table_args__ = (_one_of("status", EVAL_STATUSES),)

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
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
    created_at: Mapped[datetime] = _created()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Trajectory(Base):
    """Everything one task did in one eval run: messages, tool calls, output, grade and cost."""

    __tablename__ = "trajectories"
    __table_args__ = (
        UniqueConstraint("eval_run_id", "task_id"),
        Index("ix_trajectories_run_passed", "eval_run_id", "passed"),
    )

    id: Mapped[str] = _id()
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
    created_at: Mapped[datetime] = _created()


# --- training -----------------------------------------------------------------------------


class TrainingJob(Base):
    """A fine-tuning job. `spec` is validated at creation (its plan again by the worker); the row is the truth."""

    __tablename__ = "training_jobs"
    __table_args__ = (
        _one_of("method", JOB_METHODS),
        _one_of("status", JOB_STATUSES),
        UniqueConstraint("organization_id", "idempotency_key"),
        Index("ix_training_jobs_status", "status"),
    )

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
    base_model: Mapped[str] = mapped_column(String(100), ForeignKey("base_models.name"))
    method: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(20), default="validating_files")
    training_dataset_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("datasets.id"))
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
    created_at: Mapped[datetime] = _created()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class JobEvent(Base):
    """A message or a metrics point of a job; the integer id orders them for `after` paging."""

    __tablename__ = "job_events"
    __table_args__ = (_one_of("level", EVENT_LEVELS), _one_of("type", EVENT_TYPES))

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("training_jobs.id"), index=True)
    level: Mapped[str] = mapped_column(String(16), default="info")
    type: Mapped[str] = mapped_column(String(16), default="message")
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = _created()


class Checkpoint(Base):
    """Resumable training state of a job at one step (adapter, optimizer, data position)."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    id: Mapped[str] = _id()
    job_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("training_jobs.id"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    object_key: Mapped[str] = mapped_column(String(1024))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = _created()


class Adapter(Base):
    """A named line of LoRA adapter versions on one base model."""

    __tablename__ = "adapters"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
    name: Mapped[str] = mapped_column(String(200))
    base_model: Mapped[str] = mapped_column(String(100), ForeignKey("base_models.name"))
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = _created()


class AdapterVersion(Base):
    """An immutable trained version in the object store, keyed by its content hash: a PEFT adapter
    (`kind` lora), or a full-parameter job's whole transformers checkpoint (`kind` full, rank 0)."""

    __tablename__ = "adapter_versions"
    __table_args__ = (
        _one_of("status", ADAPTER_VERSION_STATUSES),
        _one_of("kind", VERSION_KINDS),
        UniqueConstraint("adapter_id", "version"),
    )

    id: Mapped[str] = _id()
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
    created_at: Mapped[datetime] = _created()


# --- serving ------------------------------------------------------------------------------


class Deployment(Base):
    """A name that serves one adapter version (single) or routes among several (mixture)."""

    __tablename__ = "deployments"
    __table_args__ = (
        _one_of("kind", DEPLOYMENT_KINDS),
        _one_of("status", DEPLOYMENT_STATUSES),
        UniqueConstraint("organization_id", "name"),
    )

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16), default="single")
    base_model: Mapped[str] = mapped_column(String(100), ForeignKey("base_models.name"))
    status: Mapped[str] = mapped_column(String(16), default="active")
    current_revision: Mapped[int] = mapped_column(Integer, default=0)
    gate: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Production capture, opt-in: the share of requests recorded (0: none) and for how long.
    capture_rate: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    capture_retention_days: Mapped[int] = mapped_column(Integer, default=30, server_default="30")
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class Capture(Base):
    """One request a deployment served, recorded because its deployment captures traffic: what
    was asked, what was answered and by which version, tokens and latency. Its id is the
    completion's (`chatcmpl-...`), so a client's answer finds its record; it is deleted once
    `expires_at` passes (with its feedback)."""

    __tablename__ = "captures"
    __table_args__ = (Index("ix_captures_deployment_created", "deployment_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    organization_id: Mapped[str] = _org()
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
    created_at: Mapped[datetime] = _created()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class Feedback(Base):
    """What someone said about a captured answer: a score, a label, a comment, and perhaps the
    answer it should have been (`correction`: an assistant message, or the text of a completion)."""

    __tablename__ = "feedback"

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
    capture_id: Mapped[str] = mapped_column(String(64), ForeignKey("captures.id"), index=True)
    score: Mapped[float | None] = mapped_column(Float)
    label: Mapped[str | None] = mapped_column(String(100))
    comment: Mapped[str | None] = mapped_column(Text)
    correction: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Bytes of it as JSON: what it counts against the capture storage quota.
    stored_bytes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = _created()


class DeploymentRevision(Base):
    """One state of a deployment; promote, rollback and withdraw each add a revision."""

    __tablename__ = "deployment_revisions"
    __table_args__ = (_one_of("action", REVISION_ACTIONS), UniqueConstraint("deployment_id", "revision"))

    id: Mapped[str] = _id()
    deployment_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("deployments.id"), index=True)
    revision: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(16))
    adapter_version_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("adapter_versions.id"))
    routing: Mapped[dict[str, Any]] = mapped_column(default=dict)
    gate_verdict: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    reason: Mapped[str] = mapped_column(Text, default="")
    created_by_key_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    created_at: Mapped[datetime] = _created()


# --- Tinker primitives --------------------------------------------------------------------


class TinkerSession(Base):
    """A Tinker client session (one `ServiceClient`): the container of its models and samplers."""

    __tablename__ = "tinker_sessions"
    __table_args__ = (
        _one_of("status", TINKER_SESSION_STATUSES),
        Index("ix_tinker_sessions_org_project", "organization_id", "project"),
    )

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
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
    created_at: Mapped[datetime] = _created()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class TrainingSession(Base):
    """A Tinker-style session: LoRA training or sampling clients on one resident base.

    Its id is the Tinker model id (`<session>:train:<n>`) or sampler id (`<session>:sample:<n>`).
    """

    __tablename__ = "training_sessions"
    __table_args__ = (_one_of("kind", SESSION_KINDS), _one_of("status", SESSION_STATUSES))

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
    base_model: Mapped[str] = mapped_column(String(100), ForeignKey("base_models.name"))
    kind: Mapped[str] = mapped_column(String(16), default="training")
    status: Mapped[str] = mapped_column(String(16), default="active")
    lora: Mapped[dict[str, Any]] = mapped_column(default=dict)
    tags: Mapped[dict[str, Any]] = mapped_column(default=dict)
    next_seq_id: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _created()
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
        _one_of("status", FUTURE_STATUSES),
        # One request per seq_id of a model (samplers' requests have none).
        Index("ix_futures_model_seq", "model_id", "seq_id", unique=True),
    )

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
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
    created_at: Mapped[datetime] = _created()
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
        _one_of("kind", TINKER_CHECKPOINT_KINDS),
        UniqueConstraint("model_id", "kind", "name"),
    )

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
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
    created_at: Mapped[datetime] = _created()


# --- auto mode ---------------------------------------------------------------------------------


class AutotuneRun(Base):
    """An auto run: a goal and a budget on one base and benchmark; its trials are ordinary jobs
    and eval runs. `state` holds where the run is (phase, the base's eval runs, the mined
    datasets, the best trial, the result), `decisions` every choice with its reason."""

    __tablename__ = "autotune_runs"
    __table_args__ = (_one_of("status", AUTOTUNE_STATUSES),)

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
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
    created_at: Mapped[datetime] = _created()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AutotuneTrial(Base):
    """One trial of an auto run: the parameters the search chose, its job and its dev eval run."""

    __tablename__ = "autotune_trials"
    __table_args__ = (UniqueConstraint("run_id", "number"),)

    id: Mapped[str] = _id()
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
    created_at: Mapped[datetime] = _created()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


# --- webhooks -----------------------------------------------------------------------------


class Webhook(Base):
    """An endpoint of an organization that receives signed events of the types it subscribes to.

    `secret` is kept as it is (Standard Webhooks form, `whsec_<base64>`), not hashed: Mint signs
    every delivery with it. It is shown once, at create and at rotate."""

    __tablename__ = "webhooks"

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
    url: Mapped[str] = mapped_column(String(2000))
    description: Mapped[str] = mapped_column(Text, default="")
    event_types: Mapped[list[Any]] = mapped_column(default=list)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    secret: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class WebhookDelivery(Base):
    """One event for one endpoint (the outbox): written in the transaction of the change it
    reports, then sent, retried with backoff until `max_attempts`. `attempt_log` holds every
    attempt: when, HTTP status, a response excerpt or the error, and how long it took."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        _one_of("status", WEBHOOK_DELIVERY_STATUSES),
        Index("ix_webhook_deliveries_status_due", "status", "next_attempt_at"),
    )

    id: Mapped[str] = _id()
    organization_id: Mapped[str] = _org()
    webhook_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("webhooks.id"), index=True)
    # The event's id (`evt_...`): the `webhook-id` header, the same on every attempt and
    # redelivery, so that receivers can tell a repeat from a new event.
    event_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    event_type: Mapped[str] = mapped_column(String(100))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # When the next attempt is due; while an attempt runs, when it counts as lost (its worker
    # died) so that the resend sweep picks the delivery up again.
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    attempt_log: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime] = _created()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

"""Per-organization quotas: how much work one organization may hold at once, so that it cannot
starve the others (a worker holds a bounded number of LoRA sessions for every organization).

Five quotas, each counted from the rows that are the truth:
- `tinker_sessions`: live Tinker sessions (`tinker_sessions.status == "active"`);
- `tinker_models`: live Tinker training models over all those sessions (`training_sessions`
  of kind `training`, active): each holds a LoRA slot (weights and optimizer state) on a
  worker of its base, so counting sessions alone let one session fill every slot of a base;
- `jobs`: fine-tuning jobs validating, queued or running;
- `eval_runs`: eval runs queued or running;
- `capture_storage_mib`: MiB of captured completions and their feedback kept (the sum of their
  `stored_bytes`, each row's size as JSON). Captures are written by the API's capture writer,
  which drops those of an organization past this quota (`room`, checked per batch without the
  lock: replicas writing at once may pass it by a batch each); feedback, written by any key of
  the organization (viewers too), is refused past it (`hold` with the feedback's size). Space
  comes back as captures pass their deployment's retention and are deleted with their feedback.

An organization's row may set each (`mint admin orgs quota`); a null is the platform default
from the settings (`MINT_QUOTA_*`). `hold` is called by the use cases that create such work,
inside the transaction that inserts it: it locks the organization's row first, so two creates
of one organization at once are serialized and cannot both pass the count (PostgreSQL: `SELECT
... FOR UPDATE`; SQLite: a no-op write, which takes SQLite's one write lock until the commit).

A base's slots are shared fairly besides (`hold_base_slot`): whatever its quota, one
organization's Tinker models never take the last `MINT_TINKER_RESERVED_SLOTS` slots of a
worker of the base (`MINT_WORKER_MAX_SESSIONS` each), which stay for other organizations and
for fine-tuning jobs, so another tenant's job never waits on one tenant's models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from mint.config import MAX_QUOTA, MAX_STORAGE_QUOTA_MIB, Settings
from mint.errors import InvalidRequest, PermissionDenied, QuotaExceeded
from mint.schemas.auth import QuotaKind, QuotaPublic
from mint.services.audit import record_audit
from mint.services.principal import Principal
from mint.services.workers import workers_of_base
from mint.storage.tables import (
    Capture,
    Episode,
    EpisodeTurn,
    EvalRun,
    Feedback,
    Organization,
    TinkerSession,
    TrainingJob,
    TrainingSession,
)

# Work of an organization ends as its jobs and runs finish and its sessions are finished or
# expire; clients that retry a 429 (the Tinker and OpenAI SDKs do) try again after this.
QUOTA_RETRY_AFTER_S = 10
# Stored captures free their space only as they pass their retention (days): a client told to
# retry sooner would only be refused again, and the SDK raises at once rather than wait an hour.
STORAGE_RETRY_AFTER_S = 3600
MiB = 1024 * 1024


@dataclass(frozen=True)
class QuotaDefaults:
    """The platform's quotas, for organizations whose row sets none."""

    tinker_sessions: int
    tinker_models: int
    jobs: int
    eval_runs: int
    # A base's slots per worker, and how many of them one organization's models leave to others.
    slots_per_worker: int = 64
    reserved_slots: int = 8
    capture_storage_mib: int = 10 * 1024

    @classmethod
    def of(cls, settings: Settings) -> QuotaDefaults:
        return cls(
            settings.quota_tinker_sessions,
            settings.quota_tinker_models,
            settings.quota_jobs,
            settings.quota_eval_runs,
            slots_per_worker=settings.worker_max_sessions,
            reserved_slots=settings.tinker_reserved_slots,
            capture_storage_mib=settings.quota_capture_storage_mib,
        )


@dataclass(frozen=True)
class QuotaRule:
    """What one quota counts, and the words its messages use. A quota counts rows (`model` rows
    meeting `active`), one per create."""

    kind: QuotaKind
    description: str
    noun: str  # "live Tinker sessions"
    option: str  # the `mint admin orgs quota` option that sets it
    free_one: str  # how the caller frees one
    model: Any
    active: Any  # the SQL condition of a row that counts
    maximum: int = MAX_QUOTA  # the largest value a setting or an operator may give
    retry_after_s: int = QUOTA_RETRY_AFTER_S

    def held(self, session: Session, organization_id: str) -> int:
        """What the organization holds now, in the units `hold` adds (rows here)."""
        query = select(func.count()).select_from(self.model).where(self.model.organization_id == organization_id)
        return int(session.execute(query.where(self.active)).scalar_one())

    def used(self, session: Session, organization_id: str) -> int:
        """What the organization holds now, in the quota's own unit (as `quotas_of` shows it)."""
        return self.held(session, organization_id)

    def capacity(self, limit: int) -> int:
        """A quota of `limit`, in the units `held` counts."""
        return limit

    def refusal(self, organization: Organization, held: int, adding: int, limit: int) -> QuotaExceeded:
        return QuotaExceeded(
            f"Quota exceeded: organization {organization.name!r} has {held} {self.noun}, and its {self.kind} quota "
            f"is {limit}. {self.free_one.capitalize()}, or ask an operator to raise it: "
            f"`mint admin orgs quota {organization.name} {self.option} N`.",
            param=self.kind,
            retry_after_s=self.retry_after_s,
        )


def _sentence(text: str) -> str:
    """`text` with its first letter capitalized and the rest as written (paths and names kept)."""
    return text[:1].upper() + text[1:]


def _size(size_bytes: float) -> str:
    """A size as people read it: bytes, KiB or MiB."""
    if size_bytes < 1024:
        return f"{int(size_bytes)} bytes"
    if size_bytes < MiB:
        return f"{size_bytes / 1024:.1f} KiB"
    return f"{size_bytes / MiB:.1f} MiB"


@dataclass(frozen=True)
class StorageQuotaRule(QuotaRule):
    """A quota of bytes kept: the sum of `stored_bytes` over the rows of `models`, whose limit is
    in MiB; `hold` adds the size of what is about to be written."""

    models: tuple[Any, ...] = ()

    def held(self, session: Session, organization_id: str) -> int:
        total = 0
        for model in self.models:
            query = select(func.coalesce(func.sum(model.stored_bytes), 0)).where(
                model.organization_id == organization_id
            )
            total += int(session.execute(query).scalar_one())
        return total

    def used(self, session: Session, organization_id: str) -> int:
        return math.ceil(self.held(session, organization_id) / MiB)

    def capacity(self, limit: int) -> int:
        return limit * MiB

    def refusal(self, organization: Organization, held: int, adding: int, limit: int) -> QuotaExceeded:
        return QuotaExceeded(
            f"Quota exceeded: organization {organization.name!r} keeps {_size(held)} of {self.noun}, and "
            f"{_size(adding)} more would pass its {self.kind} quota of {limit} MiB. {_sentence(self.free_one)}, "
            f"or ask an operator to raise it: `mint admin orgs quota {organization.name} {self.option} N`.",
            param=self.kind,
            retry_after_s=self.retry_after_s,
        )


RULES: dict[QuotaKind, QuotaRule] = {
    rule.kind: rule
    for rule in (
        QuotaRule(
            "tinker_sessions",
            "Live Tinker sessions (one per ServiceClient)",
            "live Tinker sessions",
            "--tinker-sessions",
            "finish a session (its ServiceClient) first",
            TinkerSession,
            TinkerSession.status == "active",
        ),
        QuotaRule(
            "tinker_models",
            "Live Tinker training models (LoRA slots), over all sessions",
            "live Tinker training models",
            "--tinker-models",
            "unload a model (finish its session) first",
            TrainingSession,
            (TrainingSession.status == "active") & (TrainingSession.kind == "training"),
        ),
        QuotaRule(
            "jobs",
            "Fine-tuning jobs validating, queued or running",
            "fine-tuning jobs queued or running",
            "--jobs",
            "wait for one to finish or cancel one first",
            TrainingJob,
            TrainingJob.status.in_(("validating_files", "queued", "running")),
        ),
        QuotaRule(
            "eval_runs",
            "Eval runs queued or running",
            "eval runs queued or running",
            "--eval-runs",
            "wait for one to finish or cancel one first",
            EvalRun,
            EvalRun.status.in_(("queued", "running")),
        ),
        StorageQuotaRule(
            "capture_storage_mib",
            "MiB of captured completions, their feedback, and episodes' turns kept (deleted after each "
            "deployment's retention)",
            "captured completions, their feedback and episodes' turns",
            "--capture-storage-mib",
            "space comes back as captures pass their deployment's retention and are deleted with their feedback; "
            "lower a deployment's capture rate or retention_days (PATCH /v1/deployments/{id}/capture)",
            Capture,
            None,
            maximum=MAX_STORAGE_QUOTA_MIB,
            retry_after_s=STORAGE_RETRY_AFTER_S,
            models=(Capture, Feedback, Episode, EpisodeTurn),
        ),
    )
}


def _column(kind: QuotaKind) -> str:
    return f"quota_{kind}"


def limit_of(organization: Organization, kind: QuotaKind, defaults: QuotaDefaults) -> tuple[int, bool]:
    """The organization's quota of `kind`, and whether it is the platform default."""
    own: int | None = getattr(organization, _column(kind))
    return (getattr(defaults, kind), True) if own is None else (own, False)


def _lock_organization(session: Session, organization_id: str) -> Organization:
    """The organization's row, locked until the caller's transaction ends."""
    if session.get_bind().dialect.name == "sqlite":
        # SQLite has no row locks and begins a transaction only at the first write: this no-op
        # write takes the database's write lock now, so the count below sees every committed
        # create and no other create commits until this one does.
        session.execute(
            update(Organization)
            .where(Organization.id == organization_id)
            .values(name=Organization.name)
            .execution_options(synchronize_session=False)
        )
    query = select(Organization).where(Organization.id == organization_id).with_for_update()
    return session.execute(query.execution_options(populate_existing=True)).scalar_one()


def hold(
    session: Session, organization_id: str, kind: QuotaKind, defaults: QuotaDefaults, *, adding: int = 1
) -> Organization:
    """Refuse (QuotaExceeded, a 429) a create that would take the organization past its quota of
    `kind`: one more row, or for a storage quota `adding` more bytes. Call it in the transaction
    that then inserts the row; the lock it takes on the organization is held until that
    transaction commits or rolls back. Returns the locked row (so a spend check made next sees
    no concurrent create of the organization)."""
    organization = _lock_organization(session, organization_id)
    limit, _ = limit_of(organization, kind, defaults)
    rule = RULES[kind]
    held = rule.held(session, organization_id)
    if held + adding > rule.capacity(limit):
        raise rule.refusal(organization, held, adding, limit)
    return organization


def room(session: Session, organization_id: str, kind: QuotaKind, defaults: QuotaDefaults) -> int:
    """How much more of `kind` the organization may take now (bytes, for a storage quota), read
    without the lock `hold` takes: for writers that drop what does not fit (capture)."""
    organization = session.get(Organization, organization_id)
    if organization is None:
        return 0
    limit, _ = limit_of(organization, kind, defaults)
    rule = RULES[kind]
    return max(0, rule.capacity(limit) - rule.held(session, organization_id))


def hold_base_slot(session: Session, organization: Organization, base_model: str, defaults: QuotaDefaults) -> None:
    """Refuse (QuotaExceeded, a 429) a new Tinker model that would leave fewer than the reserved
    slots of `base_model` to everyone else: the organization's live models on that base may fill
    the base's slots (each live worker of it holds `slots_per_worker`) but for `reserved_slots`.
    Call it after `hold`, whose lock on the organization serializes its creates."""
    capacity = defaults.slots_per_worker * max(1, workers_of_base(session, base_model))
    share = max(1, capacity - defaults.reserved_slots)
    rule = RULES["tinker_models"]
    held = session.execute(
        select(func.count())
        .select_from(TrainingSession)
        .where(TrainingSession.organization_id == organization.id, TrainingSession.base_model == base_model)
        .where(rule.active)
    ).scalar_one()
    if held >= share:
        raise QuotaExceeded(
            f"Base {base_model!r} is shared: organization {organization.name!r} holds {held} of its {capacity} LoRA "
            f"slots, and the last {defaults.reserved_slots} stay free for other organizations and fine-tuning jobs. "
            f"{rule.free_one.capitalize()}, or ask an operator to add a worker of {base_model!r}.",
            param="base_model",
            retry_after_s=QUOTA_RETRY_AFTER_S,
        )


def quotas_of(session: Session, organization: Organization, defaults: QuotaDefaults) -> list[QuotaPublic]:
    """Every quota of the organization, with what is in use now."""
    lines = []
    for kind, rule in RULES.items():
        limit, is_default = limit_of(organization, kind, defaults)
        lines.append(
            QuotaPublic(
                kind=kind,
                description=rule.description,
                limit=limit,
                used=rule.used(session, organization.id),
                is_default=is_default,
            )
        )
    return lines


def set_quotas(
    session: Session, actor: Principal, organization: Organization, changes: Mapping[QuotaKind, int | None]
) -> None:
    """Set quotas of an organization (None: back to the platform default), audited. Only an
    operator (`mint admin`, with database access) may: a key of the organization, admin or not,
    cannot raise its own share of the platform."""
    if actor.key_id is not None:
        raise PermissionDenied(
            "Quotas are set by the platform's operators with `mint admin orgs quota`, not with an API key."
        )
    changed: dict[str, dict[str, int | None]] = {}
    for kind, value in changes.items():
        if kind not in RULES:
            raise InvalidRequest(f"Unknown quota {kind!r}; use one of {', '.join(RULES)}.", param="kind")
        maximum = RULES[kind].maximum
        if value is not None and not 0 <= value <= maximum:
            raise InvalidRequest(f"A {kind} quota is a number from 0 to {maximum}, not {value}.", param=kind)
        before = getattr(organization, _column(kind))
        if before != value:
            setattr(organization, _column(kind), value)
            changed[kind] = {"from": before, "to": value}
    if changed:
        record_audit(session, actor, "organization.quota", "organization", organization.id, {"changes": changed})

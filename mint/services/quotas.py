"""Per-organization quotas: how much work one organization may hold at once, so that it cannot
starve the others (a worker holds a bounded number of LoRA sessions for every organization).

Four quotas, each counted from the rows that are the truth:
- `tinker_sessions`: live Tinker sessions (`tinker_sessions.status == "active"`);
- `tinker_models`: live Tinker training models over all those sessions (`training_sessions`
  of kind `training`, active): each holds a LoRA slot (weights and optimizer state) on a
  worker of its base, so counting sessions alone let one session fill every slot of a base;
- `jobs`: fine-tuning jobs validating, queued or running;
- `eval_runs`: eval runs queued or running.

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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from mint.config import MAX_QUOTA, Settings
from mint.errors import InvalidRequest, PermissionDenied, QuotaExceeded
from mint.schemas.auth import QuotaKind, QuotaPublic
from mint.services.audit import record_audit
from mint.services.principal import Principal
from mint.services.workers import workers_of_base
from mint.storage.tables import EvalRun, Organization, TinkerSession, TrainingJob, TrainingSession

# Work of an organization ends as its jobs and runs finish and its sessions are finished or
# expire; clients that retry a 429 (the Tinker and OpenAI SDKs do) try again after this.
QUOTA_RETRY_AFTER_S = 10


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

    @classmethod
    def of(cls, settings: Settings) -> QuotaDefaults:
        return cls(
            settings.quota_tinker_sessions,
            settings.quota_tinker_models,
            settings.quota_jobs,
            settings.quota_eval_runs,
            slots_per_worker=settings.worker_max_sessions,
            reserved_slots=settings.tinker_reserved_slots,
        )


@dataclass(frozen=True)
class QuotaRule:
    """What one quota counts, and the words its messages use."""

    kind: QuotaKind
    description: str
    noun: str  # "live Tinker sessions"
    option: str  # the `mint admin orgs quota` option that sets it
    free_one: str  # how the caller frees one
    model: Any
    active: Any  # the SQL condition of a row that counts

    def used(self, session: Session, organization_id: str) -> int:
        query = select(func.count()).select_from(self.model).where(self.model.organization_id == organization_id)
        return int(session.execute(query.where(self.active)).scalar_one())


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


def hold(session: Session, organization_id: str, kind: QuotaKind, defaults: QuotaDefaults) -> Organization:
    """Refuse (QuotaExceeded, a 429) a create that would take the organization past its quota of
    `kind`. Call it in the transaction that then inserts the row; the lock it takes on the
    organization is held until that transaction commits or rolls back. Returns the locked row
    (so a spend check made next sees no concurrent create of the organization)."""
    organization = _lock_organization(session, organization_id)
    limit, _ = limit_of(organization, kind, defaults)
    rule = RULES[kind]
    used = rule.used(session, organization_id)
    if used >= limit:
        raise QuotaExceeded(
            f"Quota exceeded: organization {organization.name!r} has {used} {rule.noun}, and its {kind} quota "
            f"is {limit}. {rule.free_one.capitalize()}, or ask an operator to raise it: "
            f"`mint admin orgs quota {organization.name} {rule.option} N`.",
            param=kind,
            retry_after_s=QUOTA_RETRY_AFTER_S,
        )
    return organization


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
        if value is not None and not 0 <= value <= MAX_QUOTA:
            raise InvalidRequest(f"A {kind} quota is a number from 0 to {MAX_QUOTA}, not {value}.", param=kind)
        before = getattr(organization, _column(kind))
        if before != value:
            setattr(organization, _column(kind), value)
            changed[kind] = {"from": before, "to": value}
    if changed:
        record_audit(session, actor, "organization.quota", "organization", organization.id, {"changes": changed})

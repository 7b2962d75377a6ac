"""Spend limits of an organization: per calendar month (UTC) and per job, plus a job's own
`budget_usd`.

They are enforced twice (and a month whose limit is spent also refuses new eval runs and Tinker
sessions, `check_month_open`; serving is never cut off by a limit):
- **at create** (`check_job_create`): a job whose estimate passes its allowance is refused with
  `SpendLimitExceeded` (a 402 that gives the estimate, the limit and what is left), and nothing
  is recorded;
- **while running** (`job_allowance`, read by the worker every step): a job whose next step
  would take its cost past the allowance checkpoints and stops with `budget_exhausted`.

A job's allowance is the least of its `budget_usd`, the organization's per-job limit, and what
the month's limit leaves once everything else the organization spent this month is counted.
The month's spend is the cost of its usage records (priced when used); a running job's own
usage so far is taken out of it, since its allowance covers that job entirely.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.errors import InvalidRequest, SpendLimitExceeded
from mint.schemas.job_spec import JobSpec
from mint.services.audit import record_audit
from mint.services.billing.prices import spent_since
from mint.services.principal import Principal
from mint.storage.tables import Organization, TrainingJob, utcnow

MAX_LIMIT_USD = 1e9
LIMIT_FIELDS = ("month_usd", "job_usd")


def month_start(now: datetime | None = None) -> datetime:
    now = now or utcnow()
    return datetime(now.year, now.month, 1, tzinfo=UTC)


@dataclass(frozen=True)
class SpendStatus:
    """An organization's limits and its spend this month."""

    month_usd: float | None
    job_usd: float | None
    spent_this_month_usd: float
    month_started_at: datetime


def status_of(session: Session, organization: Organization) -> SpendStatus:
    start = month_start()
    return SpendStatus(
        month_usd=organization.spend_limit_month_usd,
        job_usd=organization.spend_limit_job_usd,
        spent_this_month_usd=spent_since(session, organization.id, start),
        month_started_at=start,
    )


def set_limits(
    session: Session, actor: Principal, organization: Organization, changes: dict[str, float | None]
) -> None:
    """Set the organization's spend limits (None: no limit), audited. Its admin keys may (the
    limits protect the organization from itself), and so may operators."""
    actor.require("admin")
    changed: dict[str, dict[str, float | None]] = {}
    for name, value in changes.items():
        if name not in LIMIT_FIELDS:
            raise InvalidRequest(f"unknown spend limit {name!r}; use one of {', '.join(LIMIT_FIELDS)}", param=name)
        if value is not None and not 0 <= value <= MAX_LIMIT_USD:
            raise InvalidRequest(f"a spend limit is USD from 0 to {MAX_LIMIT_USD:g}, or null for none", param=name)
        column = f"spend_limit_{name}"
        before = getattr(organization, column)
        if before != value:
            setattr(organization, column, value)
            changed[name] = {"from": before, "to": value}
    if changed:
        record_audit(session, actor, "organization.spend_limits", "organization", organization.id, {"changes": changed})


@dataclass(frozen=True)
class Allowance:
    """The most a job may cost, and which limit sets it."""

    usd: float
    source: str  # "the job's budget_usd" | "the per-job spend limit" | "the monthly spend limit"


def _allowance(status: SpendStatus, budget_usd: float | None, own_spend: float = 0.0) -> Allowance | None:
    """The least of the limits; `own_spend` is month spend that counts towards this job itself
    (its billed usage while it runs; minus the other jobs' commitments at create)."""
    candidates = []
    if budget_usd is not None:
        candidates.append(Allowance(budget_usd, "the job's budget_usd"))
    if status.job_usd is not None:
        candidates.append(Allowance(status.job_usd, "the organization's per-job spend limit"))
    if status.month_usd is not None:
        left = status.month_usd - (status.spent_this_month_usd - own_spend)
        candidates.append(Allowance(max(left, 0.0), "what the organization's monthly spend limit leaves"))
    return min(candidates, key=lambda allowance: allowance.usd) if candidates else None


def _committed(session: Session, organization_id: str) -> float:
    """What the organization's queued and running jobs are still expected to cost: their
    estimates less what they have cost so far."""
    query = select(TrainingJob).where(
        TrainingJob.organization_id == organization_id,
        TrainingJob.status.in_(("validating_files", "queued", "running")),
    )
    return sum(
        max(_estimated_usd(JobSpec.model_validate(job.spec)) - job.cost_usd, 0.0)
        for job in session.execute(query).scalars()
    )


def _estimated_usd(spec: JobSpec) -> float:
    """What a job was estimated to cost at create; 0 for a job stored without an estimate."""
    return spec.estimate.cost_usd if spec.estimate is not None else 0.0


def allowance_at_create(session: Session, organization: Organization, budget_usd: float | None) -> Allowance | None:
    """The most a new job may be estimated at: its budget, the per-job limit, and what the
    month's limit leaves after this month's spend and the organization's unfinished jobs."""
    status = status_of(session, organization)
    committed = _committed(session, organization.id) if status.month_usd is not None else 0.0
    return _allowance(status, budget_usd, -committed)


def check_job_create(
    session: Session, organization: Organization, estimate_usd: float, budget_usd: float | None
) -> None:
    """Refuse a job whose estimate passes its allowance; call before anything is recorded."""
    allowance = allowance_at_create(session, organization, budget_usd)
    if allowance is None or estimate_usd <= allowance.usd:
        return
    status = status_of(session, organization)
    month = (
        f" This month the organization has spent ${status.spent_this_month_usd:.4f} of its "
        f"${status.month_usd:.4f} limit, and its unfinished jobs are estimated at "
        f"${_committed(session, organization.id):.4f} more."
        if status.month_usd is not None
        else ""
    )
    raise SpendLimitExceeded(
        f"This job is estimated at ${estimate_usd:.4f}, more than the ${allowance.usd:.4f} that {allowance.source} "
        f"allows.{month} Train fewer steps or a smaller batch (POST /v1/fine_tuning/jobs/estimate prices a "
        "request), or have an admin of the organization raise the limit: PATCH /v1/organization/spend_limits.",
        param="budget_usd" if allowance.source.startswith("the job's") else "spend_limits",
    )


def check_month_open(session: Session, organization: Organization, what: str) -> None:
    """Refuse new work (`what`: an eval run, a Tinker session) once the organization has spent
    its monthly limit; jobs are checked against their estimate instead (`check_job_create`)."""
    status = status_of(session, organization)
    if status.month_usd is None or status.spent_this_month_usd < status.month_usd:
        return
    raise SpendLimitExceeded(
        f"The organization has spent ${status.spent_this_month_usd:.4f} this month, its whole ${status.month_usd:.4f} "
        f"monthly spend limit, so no new {what} can start until the month ends or an admin raises the limit: "
        "PATCH /v1/organization/spend_limits.",
        param="spend_limits",
    )


def job_allowance(session: Session, job: TrainingJob, billed_usd: float) -> Allowance | None:
    """The running job's allowance now (limits may change while it runs); `billed_usd` is the
    cost of its usage records so far, part of the month's spend that counts towards itself."""
    organization = session.get(Organization, job.organization_id)
    assert organization is not None
    budget_usd = JobSpec.model_validate(job.spec).budget_usd
    return _allowance(status_of(session, organization), budget_usd, billed_usd)

"""Fine-tuning jobs, as the API sees them: create, get, list and cancel. Their neighbours in
this package: the request's checks (`checks`) and plans (`plans`), the job's events (`events`),
queue message (`messages`), checkpoints (`checkpoints`) and versions (`versions`), and how a job
is shown (`views`).

The row is the truth (DESIGN.md section 2). Each status change has one owner:
- the API: `validating_files -> queued` (files checked at creation) and `queued -> cancelled`;
- the worker that claims the job: `queued -> running -> succeeded | failed | cancelled`;
- the reconciler: `running -> queued` when the worker's lease ran out (it died).
A job is committed before its message is sent, so a worker never looks for a row that is
not there, and a message lost between the two is re-sent by the reconciler.

`Idempotency-Key`: a create retried with the same key returns the first job; the same key
with another body is a conflict.

Warm starts and stages. `from_adapter` names an adapter version of the organization on the
same base; the job trains that adapter further (its rank, alpha and targets; a `lora` that
says otherwise is refused), and the version it makes records it as its parent. `stages` chain
methods in one job: each stage is resolved into its own typed plan (`checks`: its file
checked against its method), and runs from the previous stage's version, registering its own. The
row keeps the first stage's method, plan and file in its usual columns, and every stage in
its spec's `stages` (`JobSpec`); progress counts the steps of all stages.
"""

from __future__ import annotations

import hashlib
import json

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from mint.errors import Conflict
from mint.schemas.fine_tuning import FineTuningJobCreate
from mint.schemas.job_spec import FromAdapter, JobSpec, StoredEstimate, StoredStage
from mint.services.billing import spend
from mint.services.billing.quotas import QuotaDefaults, hold
from mint.services.dispatch import Dispatch
from mint.services.jobs.checks import check_job
from mint.services.jobs.events import emit_event
from mint.services.jobs.messages import mark_queued, send_job
from mint.services.principal import Principal
from mint.services.webhooks import events as webhooks
from mint.storage.queries import PageResult, get_owned, insert_or_first, owned_by, paginate, rowcount
from mint.storage.tables import TrainingJob, new_id, utcnow


def _request_hash(body: FineTuningJobCreate) -> str:
    return hashlib.sha256(json.dumps(body.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def _existing(session: Session, organization_id: str, key: str, request_hash: str) -> TrainingJob | None:
    job = session.execute(
        select(TrainingJob).where(TrainingJob.organization_id == organization_id, TrainingJob.idempotency_key == key)
    ).scalar_one_or_none()
    if job is not None and JobSpec.model_validate(job.spec).request_sha256 != request_hash:
        raise Conflict(
            f"Idempotency-Key {key!r} was used for another request; use a new key for a new job",
            param="Idempotency-Key",
        )
    return job


def create_job(
    session: Session,
    principal: Principal,
    body: FineTuningJobCreate,
    *,
    send: Dispatch,
    quotas: QuotaDefaults,
    idempotency_key: str | None = None,
) -> TrainingJob:
    """Check the request and its files, record the job (queued) and send it to its base's queue.
    An organization at its jobs quota is refused (QuotaExceeded), and a job whose estimate
    passes a spend limit or its own budget (SpendLimitExceeded); either way nothing is recorded."""
    request_hash = _request_hash(body)
    if idempotency_key is not None:
        existing = _existing(session, principal.organization_id, idempotency_key, request_hash)
        if existing is not None:
            return existing
    checked = check_job(session, principal.organization_id, body)
    base, stages, warm, lora, seed = checked.base, checked.stages, checked.warm, checked.lora, checked.seed
    chained = body.stages is not None
    first = stages[0]
    job = TrainingJob(
        id=new_id("ftjob"),
        organization_id=principal.organization_id,
        base_model=base.name,
        method=first.kind,
        status="validating_files",
        training_dataset_id=first.training.id if first.training is not None else None,
        validation_dataset_id=first.validation_file,
        suffix=body.suffix,
        seed=seed,
        idempotency_key=idempotency_key,
    )
    stored_plans = [stage.plan.model_dump(mode="json") for stage in stages]
    spec = JobSpec(
        request=body.model_dump(mode="json", exclude_none=True),
        request_sha256=request_hash,
        plan=stored_plans[0],
        training_type=body.training_type,
        lora=lora,
        adapter_name=body.suffix or f"ft-{job.id.removeprefix('ftjob_')}",
        metadata=body.metadata or {},
    )
    if warm is not None:
        spec.from_adapter = FromAdapter(ref=warm["ref"], adapter_version_id=warm["adapter_version_id"])
    if chained:
        spec.stages = [
            StoredStage(plan=plan, training_file=stage.training.id, validation_file=stage.validation_file)  # type: ignore[union-attr]
            for stage, plan in zip(stages, stored_plans, strict=True)
        ]
    spec.estimate = StoredEstimate.model_validate(
        {
            **checked.estimate.public(),  # the keys of PUBLIC_ESTIMATE
            "raw_trained_tokens": checked.estimate.raw_trained_tokens,
            "raw_sampled_tokens": checked.estimate.raw_sampled_tokens,
            "prices": checked.estimate.prices,
        }
    )
    job.spec = spec.stored()
    job.total_steps = sum(stage.plan.steps for stage in stages)
    organization = hold(session, principal.organization_id, "jobs", quotas)
    spend.check_job_create(session, organization, checked.estimate.cost_usd, body.budget_usd)

    def retried_meanwhile() -> TrainingJob | None:
        if idempotency_key is None:
            return None
        return _existing(session, principal.organization_id, idempotency_key, request_hash)

    recorded = insert_or_first(session, job, retried_meanwhile)
    if recorded is not job:  # the same request, retried while this one ran, was recorded first
        return recorded
    for number, stage in enumerate(stages, start=1):
        training = stage.training
        if training is None:  # online RL: no file, the deployment's episodes
            assert body.method is not None and body.method.online_rl is not None
            source = body.method.online_rl.deployment
            emit_event(session, job.id, f"Training from the live episodes of deployment {source}")
            continue
        where = f"Stage {number}/{len(stages)} ({stage.kind}): v" if chained else "V"
        emit_event(
            session,
            job.id,
            f"{where}alidating training file: {training.id} ({training.row_count} {training.kind} rows)",
        )
    if spec.from_adapter is not None:
        warm_start = spec.from_adapter.model_dump(mode="json")
        emit_event(session, job.id, f"Warm start from {spec.from_adapter.ref}", data={"from_adapter": warm_start})
    planned = {"plan": stored_plans[0]} if not chained else {"stages": stored_plans}
    checked_what = "Deployment checked" if first.training is None else "Files validated"
    emit_event(session, job.id, f"{checked_what}; {job.total_steps} optimizer steps planned", data=planned)
    mark_queued(session, job, reason="Job enqueued")
    session.commit()
    send_job(job, send)
    return job


def get_job(session: Session, organization_id: str, job_id: str) -> TrainingJob:
    return get_owned(session, TrainingJob, job_id, organization_id=organization_id, noun="fine-tuning job")


def cancel_job(session: Session, principal: Principal, job_id: str, send: Dispatch | None = None) -> TrainingJob:
    """A queued job is cancelled at once; a running one stops after its current optimizer step
    (its worker then reports it). `send` sends the webhook deliveries of a cancel at once."""
    job = get_job(session, principal.organization_id, job_id)
    if job.status in ("succeeded", "failed", "cancelled"):
        raise Conflict(f"job {job.id} already {job.status}; only queued or running jobs can be cancelled")
    now = utcnow()
    cancelled = rowcount(
        session.execute(
            update(TrainingJob)
            .where(TrainingJob.id == job.id, TrainingJob.status.in_(("validating_files", "queued")))
            .values(status="cancelled", cancel_requested_at=now, finished_at=now)
        )
    )
    if cancelled:
        emit_event(session, job.id, "Job cancelled before it started")
    else:
        session.execute(update(TrainingJob).where(TrainingJob.id == job.id).values(cancel_requested_at=now))
        emit_event(session, job.id, "Cancellation requested; the job stops after its current step")
    session.flush()
    session.refresh(job)
    if cancelled:
        webhooks.job_event(session, job, send)
    return job


def list_all_jobs(session: Session, *, status: str | None = None, limit: int = 50) -> list[TrainingJob]:
    """The newest jobs of every organization, for operators (`mint admin jobs list`)."""
    query = select(TrainingJob).order_by(TrainingJob.created_at.desc()).limit(limit)
    if status is not None:
        query = query.where(TrainingJob.status == status)
    return list(session.execute(query).scalars())


def list_jobs(session: Session, organization_id: str, *, after: str | None, limit: int) -> PageResult[TrainingJob]:
    """One page of the organization's jobs, newest first."""
    return paginate(session, owned_by(TrainingJob, organization_id), TrainingJob, after=after, limit=limit)

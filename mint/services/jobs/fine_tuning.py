"""Fine-tuning jobs, as the API sees them: create, read, cancel, events and checkpoints.

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
methods in one job: each stage is resolved into its own typed plan here (its file checked
against its method), and runs from the previous stage's version, registering its own. The
row keeps the first stage's method, plan and file in its usual columns, and every stage in
its spec's `stages` (`JobSpec`); progress counts the steps of all stages.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest, MintError
from mint.evals.agent_environments import check_environment_spec
from mint.evals.graders import reward_spec
from mint.schemas.base_models import BaseModelSpec
from mint.schemas.fine_tuning import FineTuningJobCreate, Method, StageCreate, SupervisedMethod
from mint.schemas.job_spec import FromAdapter, JobSpec, StoredEstimate, StoredStage
from mint.schemas.plans import TrainingPlan, parse_plan
from mint.services.billing import prices as pricing
from mint.services.billing import spend
from mint.services.billing.quotas import QuotaDefaults, hold
from mint.services.catalog import model_ref_of, model_ref_of_id, resolve_version_ref
from mint.services.datasets import KIND_OF_METHOD, get_dataset, require_kind
from mint.services.dispatch import Dispatch
from mint.services.leases import gave_up
from mint.services.models.adapters import adapter_for_base
from mint.services.principal import Principal
from mint.services.webhooks import events as webhooks
from mint.storage.queries import PageResult, get_owned, insert_or_first, owned_by, paginate, rowcount
from mint.storage.tables import (
    Adapter,
    AdapterVersion,
    BaseModelRow,
    Checkpoint,
    Dataset,
    JobEvent,
    TrainingJob,
    new_id,
    utcnow,
)
from mint.trainer.types import LoraOptions

log = logging.getLogger(__name__)

RUN_JOB_TASK = "mint.jobs.run"
METHOD_OF_TYPE = {"supervised": "sft", "dpo": "dpo", "reinforcement": "rl"}
TYPE_OF_METHOD = {method: kind for kind, method in METHOD_OF_TYPE.items()}
# Defaults an `auto` hyperparameter takes.
DEFAULT_EPOCHS = 3
DEFAULT_BATCH = {"sft": 8, "dpo": 4, "rl": 4}
DEFAULT_LEARNING_RATE = {"sft": 4e-4, "dpo": 1e-4, "rl": 1e-4}
DEFAULT_BETA = 0.1
DEFAULT_GROUP_SIZE = 4
CHECKPOINTS_PER_JOB = 5


def emit_event(
    session: Session,
    job_id: str,
    message: str,
    *,
    level: str = "info",
    type: str = "message",
    data: dict[str, Any] | None = None,
) -> JobEvent:
    event = JobEvent(job_id=job_id, level=level, type=type, message=message, data=data or {})
    session.add(event)
    return event


def _request_hash(body: FineTuningJobCreate) -> str:
    return hashlib.sha256(json.dumps(body.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def _checked(method: Method, param: str) -> Method:
    if method.type == "reinforcement" and (
        method.reinforcement is None
        or (method.reinforcement.grader is None and method.reinforcement.environment is None)
    ):
        raise InvalidRequest(
            f"{param}.reinforcement.grader is required for reinforcement jobs, "
            '{"type": "exact", "config": {}} for instance, '
            f"unless {param}.reinforcement.environment names an environment that gives rewards, e.g. "
            '{"name": "account_deletion"}',
            param=f"{param}.reinforcement.grader",
        )
    return method


def _method_of(body: FineTuningJobCreate) -> Method:
    method = body.method or Method(type="supervised")
    if body.hyperparameters is not None and method.type == "supervised" and method.supervised is None:
        method = Method(type="supervised", supervised=SupervisedMethod(hyperparameters=body.hyperparameters))
    return _checked(method, "method")


# A stage's fields that, when unset, take the job's.
INHERITED = ("training_file", "validation_file", "steps", "learning_rate", "checkpoint_interval")


def stage_requests(body: FineTuningJobCreate) -> list[StageCreate]:
    """The job's stages, each with the job's values where it gives none; a job without
    `stages` is one stage of its `method`."""
    inherited = {field: getattr(body, field) for field in INHERITED}
    if body.stages is None:
        return [StageCreate(method=_method_of(body), **inherited)]
    if body.method is not None or body.hyperparameters is not None:
        raise InvalidRequest(
            "give either `method` (one stage) or `stages` (a chain), not both; put each stage's method in its stage",
            param="stages",
        )
    stages = []
    for index, stage in enumerate(body.stages):
        _checked(stage.method, f"stages[{index}].method")
        unset = {field: value for field, value in inherited.items() if getattr(stage, field) is None}
        stages.append(stage.model_copy(update=unset))
    return stages


def _resolve(value: Any, default: Any) -> Any:
    return default if value == "auto" else value


class Schedule(Protocol):
    """The schedule fields a job or one of its stages gives."""

    steps: int | None
    learning_rate: float | None
    checkpoint_interval: int | None


def resolve_plan(body: Schedule, method: Method, rows: int) -> TrainingPlan:
    """A stage's typed plan: `auto` values filled in, steps counted, every number checked.

    A plan the checks refuse (a non-finite or out-of-range value the request's fields led to,
    such as a NaN multiplier or more epochs than `MAX_STEPS` steps) is an `InvalidRequest`
    naming the plan's field.
    """
    kind = METHOD_OF_TYPE[method.type]
    section = getattr(method, method.type)
    hyper = section.hyperparameters if section is not None else None
    batch = min(_resolve(getattr(hyper, "batch_size", "auto"), DEFAULT_BATCH[kind]), rows)
    epochs = _resolve(getattr(hyper, "n_epochs", "auto"), DEFAULT_EPOCHS)
    multiplier = _resolve(getattr(hyper, "learning_rate_multiplier", "auto"), 1.0)
    steps = body.steps or epochs * math.ceil(rows / batch)
    plan: dict[str, Any] = {
        "method": kind,
        "batch_size": batch,
        "n_epochs": epochs if body.steps is None else steps * batch / rows,
        "learning_rate_multiplier": multiplier,
        "learning_rate": body.learning_rate or DEFAULT_LEARNING_RATE[kind] * multiplier,
        "steps": steps,
        "checkpoint_interval": body.checkpoint_interval or max(1, steps // CHECKPOINTS_PER_JOB),
    }
    if kind == "dpo":
        plan["beta"] = _resolve(getattr(hyper, "beta", "auto"), DEFAULT_BETA)
    if kind == "rl":
        assert method.reinforcement is not None
        rl = method.reinforcement.hyperparameters
        plan |= {
            "group_size": _resolve(rl.group_size, DEFAULT_GROUP_SIZE),
            "max_tokens": rl.max_tokens,
            "temperature": rl.temperature,
            "kl_beta": rl.kl_beta,
            "max_steps_without_signal": _resolve(rl.max_steps_without_signal, None),
            "loss_fn": rl.loss_fn,
            "loss_fn_config": rl.loss_fn_config,
            "max_turns": rl.max_turns,
            "max_steps_off_policy": rl.max_steps_off_policy,
        }
        if method.reinforcement.grader is not None:
            plan["grader"] = reward_spec(method.reinforcement.grader).model_dump()
        if method.reinforcement.environment is not None:
            environment = method.reinforcement.environment.model_dump()
            plan["environment"] = check_environment_spec(environment, "method.reinforcement.environment")
    return parse_plan(plan)


def _check_lora(body: FineTuningJobCreate, seed: int) -> dict[str, Any]:
    try:
        options = LoraOptions.model_validate({**body.lora.model_dump(exclude_none=True), "seed": seed})
    except ValidationError as exc:
        raise InvalidRequest(f"lora: {exc.errors()[0]['msg']}", param="lora") from None
    return options.model_dump(exclude_none=True)


def _base_model(session: Session, name: str) -> BaseModelRow:
    base = session.get(BaseModelRow, name)
    if base is None or not base.enabled:
        raise InvalidRequest(f"no enabled base model {name!r}; list them at /v1/base_models", param="model")
    return base


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


def _warm_start(session: Session, organization_id: str, body: FineTuningJobCreate, base: str) -> dict[str, Any]:
    """The adapter version `from_adapter` names, checked: the organization's, ready, on the
    job's base, and not contradicted by the request's `lora` (a warm start trains the
    adapter it starts from, at its rank, alpha and targets)."""
    assert body.from_adapter is not None
    adapter, version = resolve_version_ref(session, organization_id, body.from_adapter, param="from_adapter")
    ref = model_ref_of(adapter, version)
    if version.base_model != base:
        raise Conflict(
            f"from_adapter {ref} was trained on base {version.base_model!r}, not {base!r}; a warm start continues "
            f"on the adapter's own base (model: {version.base_model!r})",
            param="from_adapter",
        )
    if version.kind != body.training_type:
        fix = (
            "train it further with training_type 'full'"
            if version.kind == "full"
            else "a full-parameter job starts from the base or from a full version"
        )
        raise InvalidRequest(
            f"from_adapter {ref} is a {'whole model (full-parameter)' if version.kind == 'full' else 'LoRA adapter'}"
            f" version, and this job's training_type is {body.training_type!r}; {fix}",
            param="from_adapter",
        )
    given = body.lora.model_dump(include=body.lora.model_fields_set)
    same = {"rank": version.rank, "alpha": version.alpha}
    clash = sorted(field for field, value in given.items() if field not in same or value != same[field])
    if clash:
        raise InvalidRequest(
            f"lora.{clash[0]}: a job warm-started from {ref} trains that adapter as it is (rank {version.rank}, "
            f"alpha {version.alpha:g}, its own targets); omit `lora`, or start from scratch without from_adapter",
            param="lora",
        )
    return {"ref": ref, "adapter_version_id": version.id, "rank": version.rank, "alpha": version.alpha}


@dataclass(frozen=True)
class CheckedStage:
    """A stage as create_job checked it: its method, files and plan."""

    kind: str
    training: Dataset
    validation_file: str | None
    plan: TrainingPlan


def _check_stage(session: Session, organization_id: str, stage: StageCreate, index: int, chained: bool) -> CheckedStage:
    """Resolve one stage into its plan, with its files checked against its method."""
    prefix = f"stages[{index}]." if chained else ""
    kind = METHOD_OF_TYPE[stage.method.type]
    if stage.training_file is None:
        raise InvalidRequest(
            f"{prefix}training_file is required: give the stage's dataset, or the job's `training_file`",
            param=f"{prefix}training_file",
        )
    training = get_dataset(session, organization_id, stage.training_file)
    require_kind(training, KIND_OF_METHOD[kind], f"{prefix}training_file")
    if stage.validation_file is not None:
        validation = get_dataset(session, organization_id, stage.validation_file)
        require_kind(validation, training.kind, f"{prefix}validation_file")
    try:
        plan = resolve_plan(stage, stage.method, training.row_count)
    except MintError as exc:
        if not chained:
            raise
        raise type(exc)(f"stages[{index}]: {exc.message}", param=f"{prefix}{exc.param or 'method'}") from None
    return CheckedStage(kind=kind, training=training, validation_file=stage.validation_file, plan=plan)


def _check_full_parameter(stages: Sequence[CheckedStage], chained: bool) -> None:
    """Full-parameter training runs supervised stages only: DPO and RL score against a frozen
    reference (and RL samples from the policy), which would be a second whole copy of the base."""
    for index, stage in enumerate(stages):
        if stage.kind != "sft":
            where = f"stages[{index}].method" if chained else "method"
            raise InvalidRequest(
                f"{where}: training_type 'full' trains supervised stages only, and this one is {stage.kind!r}; "
                "DPO and RL need a frozen reference copy of the base beside the trained one. Train it with "
                "training_type 'lora', or make the job supervised",
                param=where,
            )


@dataclass(frozen=True)
class CheckedJob:
    """A create request as checked: its base, stages, warm start, LoRA options and estimate."""

    base: BaseModelRow
    stages: list[CheckedStage]
    warm: dict[str, Any] | None
    lora: dict[str, Any]
    seed: int
    estimate: pricing.JobEstimate


def check_job(session: Session, organization_id: str, body: FineTuningJobCreate) -> CheckedJob:
    """Check a create request (base, files, plans, warm start) and estimate what it will cost;
    records nothing. Both `create_job` and the estimate route use it."""
    base = _base_model(session, body.model)
    if body.suffix is not None:
        adapter_for_base(session, organization_id=organization_id, name=body.suffix, base_model=base.name)
    requests = stage_requests(body)
    chained = body.stages is not None
    seed = body.seed if body.seed is not None else int.from_bytes(uuid.uuid4().bytes[:3])
    full = body.training_type == "full"
    if full and body.lora.model_fields_set:
        raise InvalidRequest(
            "lora: a full-parameter job (training_type 'full') trains every weight, with no adapter; omit `lora`",
            param="lora",
        )
    warm = _warm_start(session, organization_id, body, base.name) if body.from_adapter else None
    if full:
        lora = {}
    elif warm is None:
        lora = _check_lora(body, seed)
    else:
        lora = {"rank": warm["rank"], "alpha": warm["alpha"], "seed": seed}
    BaseModelSpec.model_validate(base.spec)  # the registry entry the worker will load
    stages = [_check_stage(session, organization_id, stage, index, chained) for index, stage in enumerate(requests)]
    if full:
        _check_full_parameter(stages, chained)
    work = [pricing.stage_work(stage.plan, stage.training) for stage in stages]
    estimate = pricing.estimate_stages(session, base.name, work, training_type=body.training_type)
    return CheckedJob(base=base, stages=stages, warm=warm, lora=lora, seed=seed, estimate=estimate)


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
        training_dataset_id=first.training.id,
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
            StoredStage(plan=plan, training_file=stage.training.id, validation_file=stage.validation_file)
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
    emit_event(session, job.id, f"Files validated; {job.total_steps} optimizer steps planned", data=planned)
    mark_queued(session, job, reason="Job enqueued")
    session.commit()
    send_job(job, send)
    return job


def mark_queued(session: Session, job: TrainingJob, *, reason: str) -> None:
    """Give the job a new message id and queue it; the caller commits, then sends."""
    job.status = "queued"
    job.task_id = f"{job.id}:{uuid.uuid4().hex[:12]}"
    job.enqueued_at = utcnow()
    job.worker_id = None
    job.heartbeat_at = None
    emit_event(session, job.id, reason, data={"task_id": job.task_id})


def give_up(session: Session, job: TrainingJob, last_error: str, send: Dispatch | None = None) -> None:
    """Fail a job that has had all its attempts, with its last error; the caller commits (and
    `send` then sends the webhook deliveries of its failure)."""
    message = gave_up(job.attempts, last_error)
    job.status, job.finished_at = "failed", utcnow()
    job.worker_id, job.heartbeat_at = None, None
    job.error = {"code": "max_attempts_exceeded", "message": message, "param": None}
    emit_event(session, job.id, f"Job failed: {message}", level="error")
    webhooks.job_event(session, job, send)


def send_job(job: TrainingJob, send: Dispatch, *, countdown_s: float | None = None) -> None:
    """Publish the job's message (to run after `countdown_s`). A failure is left to the
    reconciler: the row is committed."""
    try:
        send(RUN_JOB_TASK, args=[job.id], task_id=job.task_id, base_model=job.base_model, countdown_s=countdown_s)
    except Exception:  # noqa: BLE001 - the broker may be down; the reconciler re-sends queued jobs
        log.warning("could not send job %s now; the reconciler will", job.id, exc_info=True)


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


def list_events(session: Session, job: TrainingJob, *, after: str | None, limit: int) -> tuple[list[JobEvent], bool]:
    """Events newest first, as OpenAI lists them; `after` is an event id from a previous page."""
    query = select(JobEvent).where(JobEvent.job_id == job.id)
    if after is not None:
        if not after.isdigit():
            raise InvalidRequest(
                f"Unknown cursor {after!r}: pass the last event id of the previous page.", param="after"
            )
        query = query.where(JobEvent.id < int(after))
    rows = list(session.execute(query.order_by(JobEvent.id.desc()).limit(limit + 1)).scalars())
    return rows[:limit], len(rows) > limit


def list_checkpoints(session: Session, job: TrainingJob) -> list[Checkpoint]:
    return list(
        session.execute(
            select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step.desc())
        ).scalars()
    )


# The RL plan's own knobs, shown with the job's hyperparameters (null: the platform's default).
RL_HYPERPARAMETERS = (
    "group_size",
    "max_tokens",
    "temperature",
    "kl_beta",
    "max_steps_without_signal",
    "max_turns",
    "max_steps_off_policy",
)


def method_view(kind: str, plan: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """OpenAI's `method` object of a plan, and the plan's common hyperparameters."""
    hyperparameters = {key: plan[key] for key in ("batch_size", "learning_rate_multiplier", "n_epochs") if key in plan}
    method_type = TYPE_OF_METHOD[kind]
    extra = {key: plan[key] for key in ("beta", *RL_HYPERPARAMETERS) if key in plan}
    method: dict[str, Any] = {"type": method_type, method_type: {"hyperparameters": hyperparameters | extra}}
    if kind == "rl":
        method[method_type]["grader"] = plan.get("grader")
        method[method_type]["environment"] = plan.get("environment")
    return method, hyperparameters


# A stage's version: (adapter version id, `adapter@version`), by stage number (from 1).
StageVersions = Mapping[int, tuple[str, str]]


def _stages_view(job: TrainingJob, stages: Sequence[StoredStage], versions: StageVersions) -> list[dict[str, Any]]:
    """Each stage of a chained job (`stages`, its spec's) with its status, progress and the version it made."""
    views: list[dict[str, Any]] = []
    offset, ended = 0, job.status in ("succeeded", "failed", "cancelled")
    current = next((number for number in range(1, len(stages) + 1) if number not in versions), None)
    for number, stage in enumerate(stages, start=1):
        plan = stage.plan
        steps = int(plan["steps"])
        if number in versions:
            status = "succeeded"
        elif number == current:
            status = "queued" if job.status == "validating_files" else job.status
        else:
            status = "skipped" if ended else "pending"
        version_id, ref = versions.get(number, (None, None))
        views.append(
            {
                "stage": number,
                "method": method_view(plan["method"], plan)[0],
                "training_file": stage.training_file,
                "validation_file": stage.validation_file,
                "status": status,
                "total_steps": steps,
                "completed_steps": min(steps, max(0, job.completed_steps - offset)),
                "adapter_version_id": version_id,
                "fine_tuned_model": ref,
            }
        )
        offset += steps
    return views


def _estimated_finish(job: TrainingJob, estimate: StoredEstimate | None) -> int | None:
    """OpenAI's `estimated_finish` (unix seconds) of a running job: its start plus the estimate."""
    if job.status != "running" or job.started_at is None or estimate is None:
        return None
    return int(job.started_at.timestamp() + estimate.seconds)


def job_view(
    job: TrainingJob, fine_tuned_model: str | None, stage_versions: StageVersions | None = None
) -> dict[str, Any]:
    """The job in OpenAI's shape (see `mint.schemas.fine_tuning.FineTuningJob`); a chained
    job lists its stages, with the versions of those that succeeded (`stage_versions`)."""
    spec = JobSpec.model_validate(job.spec)
    method, hyperparameters = method_view(job.method, spec.plan)
    error = job.error
    return {
        "id": job.id,
        "created_at": job.created_at,
        "finished_at": job.finished_at,
        "started_at": job.started_at,
        "model": job.base_model,
        "fine_tuned_model": fine_tuned_model,
        "organization_id": job.organization_id,
        "status": job.status,
        "training_file": job.training_dataset_id,
        "validation_file": job.validation_dataset_id,
        "hyperparameters": hyperparameters,
        "method": method,
        "seed": job.seed,
        "suffix": job.suffix,
        "metadata": spec.metadata or None,
        "trained_tokens": job.trained_tokens if job.status == "succeeded" else None,
        "estimate": spec.estimate.public() if spec.estimate is not None else None,
        "cost_usd": round(job.cost_usd, 6),
        "budget_usd": spec.budget_usd,
        "estimated_finish": _estimated_finish(job, spec.estimate),
        "error": error,
        "training_type": spec.training_type,
        "lora": spec.lora,
        "total_steps": job.total_steps,
        "completed_steps": job.completed_steps,
        "attempts": job.attempts,
        "steps_redone": job.steps_redone,
        "adapter_version_id": job.result_adapter_version_id,
        "from_adapter": spec.from_adapter.ref if spec.from_adapter is not None else None,
        "stages": _stages_view(job, spec.stages, stage_versions or {}) if spec.stages is not None else None,
    }


def fine_tuned_model_of(session: Session, job: TrainingJob) -> str | None:
    """The model reference (`adapter@version`) a succeeded job produced."""
    if job.result_adapter_version_id is None:
        return None
    if session.get(AdapterVersion, job.result_adapter_version_id) is None:
        return None
    return model_ref_of_id(session, job.result_adapter_version_id)


def stage_versions_of(session: Session, job: TrainingJob) -> dict[int, tuple[str, str]]:
    """The versions a job's stages registered so far, by stage number (from 1); a job without
    stages registers its one version as stage 1."""
    rows = session.execute(
        select(AdapterVersion, Adapter)
        .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
        .where(AdapterVersion.training_job_id == job.id)
    ).all()
    return {
        int(version.metrics.get("stage", 1)): (version.id, model_ref_of(adapter, version)) for version, adapter in rows
    }


def list_all_jobs(session: Session, *, status: str | None = None, limit: int = 50) -> list[TrainingJob]:
    """The newest jobs of every organization, for operators (`mint admin jobs list`)."""
    query = select(TrainingJob).order_by(TrainingJob.created_at.desc()).limit(limit)
    if status is not None:
        query = query.where(TrainingJob.status == status)
    return list(session.execute(query).scalars())


def list_jobs(session: Session, organization_id: str, *, after: str | None, limit: int) -> PageResult[TrainingJob]:
    """One page of the organization's jobs, newest first."""
    return paginate(session, owned_by(TrainingJob, organization_id), TrainingJob, after=after, limit=limit)

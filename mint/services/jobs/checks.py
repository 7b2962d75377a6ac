"""A create request as checked before anything is recorded: its base, its stages (each one's
files checked against its method and resolved into its plan), its warm start (`from_adapter`:
the organization's ready version on the same base, not contradicted by `lora`), its LoRA options
and what it will cost. `create_job` and the estimate route (and autotune's trials) share it, so
an estimate refuses what a create would.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest, MintError
from mint.evals.graders import GraderSpec
from mint.schemas.base_models import BaseModelSpec
from mint.schemas.fine_tuning import FineTuningJobCreate, Method, StageCreate, SupervisedMethod
from mint.schemas.plans import TrainingPlan
from mint.services.billing import prices as pricing
from mint.services.catalog import current_revision, get_deployment, model_ref_of, resolve_version_ref
from mint.services.datasets import KIND_OF_METHOD, get_dataset, require_kind
from mint.services.evals.reward_endpoints import check_environment, check_graders
from mint.services.jobs.plans import METHOD_OF_TYPE, resolve_online_plan, resolve_plan
from mint.services.models.adapters import adapter_for_base
from mint.storage.tables import Adapter, AdapterVersion, BaseModelRow, Dataset, Deployment
from mint.trainer.types import LoraOptions


def _checked(method: Method, param: str) -> Method:
    if method.type == "online_rl" and method.online_rl is None:
        raise InvalidRequest(
            f"{param}.online_rl.deployment is required: the deployment whose live episodes the job learns from",
            param=f"{param}.online_rl.deployment",
        )
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
        if stage.method.type == "online_rl":
            raise InvalidRequest(
                f"stages[{index}].method: online RL learns from a deployment's live episodes as they arrive and "
                "cannot be a stage of a chain; train the chain, deploy its version, then start an online RL job",
                param=f"stages[{index}].method",
            )
        unset = {field: value for field, value in inherited.items() if getattr(stage, field) is None}
        stages.append(stage.model_copy(update=unset))
    return stages


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
    training: Dataset | None  # None: an online RL stage, which learns from a deployment's episodes
    validation_file: str | None
    plan: TrainingPlan


def _check_stage(session: Session, organization_id: str, stage: StageCreate, index: int, chained: bool) -> CheckedStage:
    """Resolve one stage into its plan, with its files checked against its method."""
    prefix = f"stages[{index}]." if chained else ""
    kind = METHOD_OF_TYPE[stage.method.type]
    if kind == "online_rl":
        assert stage.method.online_rl is not None
        if stage.training_file is not None or stage.validation_file is not None:
            raise InvalidRequest(
                "an online RL job learns from its deployment's live episodes, not from a file: omit training_file "
                "and validation_file",
                param="training_file",
            )
        deployment, _ = live_deployment(session, organization_id, stage.method.online_rl.deployment)
        plan = resolve_online_plan(stage, stage.method, deployment.id)
        return CheckedStage(kind=kind, training=None, validation_file=None, plan=plan)
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
    grader = getattr(plan, "grader", None)
    if grader is not None:  # a remote grader's endpoint must exist now, not score 0 at every step
        spec = GraderSpec.model_validate(grader.model_dump())
        check_graders(session, organization_id, [spec], param=f"{prefix}method.reinforcement.grader")
    environment = getattr(plan, "environment", None)
    if environment is not None:  # so must a remote environment's server
        param = f"{prefix}method.reinforcement.environment"
        check_environment(session, organization_id, environment.model_dump(), param=param)
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


def live_deployment(session: Session, organization_id: str, name: str) -> tuple[Deployment, AdapterVersion]:
    """The deployment an online RL job learns from, and the LoRA version it serves (what the job
    starts from): active, serving one adapter version, and recording its episodes' tokens."""
    param = "method.online_rl.deployment"
    deployment = get_deployment(session, organization_id, name)
    if deployment.status != "active" or deployment.kind != "single":
        raise Conflict(
            f"deployment {deployment.name!r} is {'withdrawn' if deployment.status != 'active' else 'a mixture'}; "
            "online RL trains the one adapter version an active single deployment serves",
            param=param,
        )
    if not deployment.capture_tokens or deployment.capture_rate <= 0:
        raise Conflict(
            f"deployment {deployment.name!r} records no episodes: turn on token capture first "
            f'(PATCH /v1/deployments/{deployment.id}/capture {{"rate": 1, "tokens": true}}) so that its '
            "episodes are kept token-exact",
            param=param,
        )
    revision = current_revision(session, deployment)
    version = session.get(AdapterVersion, revision.adapter_version_id) if revision.adapter_version_id else None
    if version is None or version.kind != "lora":
        raise Conflict(
            f"deployment {deployment.name!r} does not serve a LoRA adapter version; online RL trains the adapter "
            "it serves: promote one first",
            param=param,
        )
    return deployment, version


def _online_warm_start(session: Session, organization_id: str, body: FineTuningJobCreate, base: str) -> dict[str, Any]:
    """An online RL job starts from the version its deployment serves now (on the job's base)."""
    assert body.method is not None and body.method.online_rl is not None
    if body.from_adapter is not None:
        raise InvalidRequest(
            "an online RL job starts from the version its deployment serves; omit from_adapter", param="from_adapter"
        )
    if body.training_type != "lora" or body.lora.model_fields_set:
        raise InvalidRequest(
            "an online RL job trains the LoRA adapter its deployment serves, as it is: omit training_type and lora",
            param="lora" if body.lora.model_fields_set else "training_type",
        )
    deployment, version = live_deployment(session, organization_id, body.method.online_rl.deployment)
    if deployment.base_model != base:
        raise Conflict(
            f"deployment {deployment.name!r} serves base {deployment.base_model!r}, not {base!r}: give that model",
            param="model",
        )
    adapter = session.get(Adapter, version.adapter_id)
    assert adapter is not None
    ref = model_ref_of(adapter, version)
    return {"ref": ref, "adapter_version_id": version.id, "rank": version.rank, "alpha": version.alpha}


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
    online = body.method is not None and body.method.type == "online_rl" and body.stages is None
    if online:
        warm: dict[str, Any] | None = _online_warm_start(session, organization_id, body, base.name)
    else:
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

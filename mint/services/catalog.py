"""The shared read layer: the rows one use case reads of another's, in one place.

Use cases borrow each other's lookups: serving resolves a model reference an adapter or a
Tinker checkpoint names, an eval measures what a deployment serves now, a deployment's gate
reads eval runs, captures find their deployment. Reading them here, never through the use
case that writes them, keeps the services' imports pointing down (no module needs one above
it to read a row) and gives every reader the same rules: which checkpoints an organization
may read, which version `adapter` alone names, which revision is current.

Everything here reads; nothing writes, commits or sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest, NotFound, did_you_mean
from mint.evals.compare import RunOutcomes, TaskOutcome
from mint.schemas.tinker import TINKER_SCHEME, TinkerPath
from mint.storage.queries import get_owned
from mint.storage.tables import (
    Adapter,
    AdapterVersion,
    BaseModelRow,
    Deployment,
    DeploymentRevision,
    EvalRun,
    TinkerCheckpoint,
    Trajectory,
)

# ---- model references: bases, adapter versions, named sampler weights ----------------------


@dataclass(frozen=True)
class ResolvedModel:
    """What a model reference names: a base, and the adapter version on it (None: the base itself)."""

    ref: str
    base_model: str
    adapter_version: AdapterVersion | None


def resolve_model_ref(session: Session, organization_id: str, ref: str) -> ResolvedModel:
    """`base`, `adapter@version`, `adapter` (its newest ready version) or named Tinker sampler
    weights (`tinker://<model_id>/sampler_weights/<name>`, the organization's or published) -> ResolvedModel."""
    if ref.startswith(TINKER_SCHEME):
        return _resolve_sampler_weights(session, organization_id, ref)
    if "@" not in ref:
        base = session.get(BaseModelRow, ref)
        if base is not None:
            if not base.enabled:
                raise InvalidRequest(f"base model {ref!r} is disabled on this platform", param="model")
            return ResolvedModel(ref=ref, base_model=base.name, adapter_version=None)
    bases = session.execute(select(BaseModelRow.name).where(BaseModelRow.enabled.is_(True))).scalars()
    adapter, row = resolve_version_ref(
        session,
        organization_id,
        ref,
        param="model",
        unknown="no base model or adapter named {name!r}{suggestion}; list them at /v1/base_models and /v1/adapters",
        also=list(bases),
    )
    return ResolvedModel(ref=model_ref_of(adapter, row), base_model=adapter.base_model, adapter_version=row)


def resolve_version_ref(
    session: Session,
    organization_id: str,
    ref: str,
    *,
    param: str,
    unknown: str = "no adapter named {name!r} in this organization{suggestion}; list them at /v1/adapters",
    also: Sequence[str] = (),
) -> tuple[Adapter, AdapterVersion]:
    """The adapter and ready version that `adapter@version` (or `adapter`: its newest ready
    version) names in the organization; NotFound (`unknown`, formatted with the name and the
    nearest names among the organization's adapters and `also`) or InvalidRequest naming
    `param` otherwise."""
    name, _, version_text = ref.partition("@")
    adapter = adapter_named(session, organization_id, name)
    if adapter is None:
        adapters = session.execute(select(Adapter.name).where(Adapter.organization_id == organization_id)).scalars()
        raise NotFound(unknown.format(name=name, suggestion=did_you_mean(name, [*adapters, *also])), param=param)
    query = select(AdapterVersion).where(AdapterVersion.adapter_id == adapter.id, AdapterVersion.status == "ready")
    if version_text:
        if not version_text.isdigit():
            raise InvalidRequest(f"{ref!r}: the version after '@' must be a number, e.g. {name}@1", param=param)
        query = query.where(AdapterVersion.version == int(version_text))
    row = session.execute(query.order_by(AdapterVersion.version.desc()).limit(1)).scalar_one_or_none()
    if row is None:
        raise NotFound(f"adapter {name!r} has no ready version {version_text or ''}".rstrip(), param=param)
    return adapter, row


def adapter_named(session: Session, organization_id: str, name: str) -> Adapter | None:
    """The organization's adapter named `name`, or None."""
    return session.execute(
        select(Adapter).where(Adapter.organization_id == organization_id, Adapter.name == name)
    ).scalar_one_or_none()


def model_ref_of(adapter: Adapter, version: AdapterVersion) -> str:
    """The reference `adapter@version` that names a version."""
    return f"{adapter.name}@{version.version}"


def model_ref_of_id(session: Session, version_id: str) -> str:
    """`adapter@version` of a version id (the id itself if the version is gone)."""
    version = session.get(AdapterVersion, version_id)
    adapter = session.get(Adapter, version.adapter_id) if version is not None else None
    return model_ref_of(adapter, version) if adapter is not None and version is not None else version_id


def _resolve_sampler_weights(session: Session, organization_id: str, ref: str) -> ResolvedModel:
    """Named sampler weights are an adapter version (`save_weights_for_sampler` registers them)."""
    try:
        path = TinkerPath.parse(ref)
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message, param="model") from None
    if path.kind != "sampler":
        raise InvalidRequest(
            f"{path} is not sampler weights; serve tinker://<model_id>/sampler_weights/<name> "
            "(save_weights_for_sampler with a name)",
            param="model",
        )
    checkpoint = readable_checkpoint(session, organization_id, path, param="model")
    version = session.get(AdapterVersion, checkpoint.adapter_version_id) if checkpoint.adapter_version_id else None
    if version is None or version.status != "ready":
        raise NotFound(f"the sampler weights {path} are no longer available", param="model")
    adapter = session.get(Adapter, version.adapter_id)
    assert adapter is not None
    return ResolvedModel(ref=ref, base_model=adapter.base_model, adapter_version=version)


# ---- Tinker checkpoints an organization may read ----------------------------------------------


def checkpoint_at(session: Session, path: TinkerPath) -> TinkerCheckpoint | None:
    """The checkpoint at a `tinker://` path, whoever owns it."""
    return session.execute(
        select(TinkerCheckpoint).where(
            TinkerCheckpoint.model_id == path.model_id,
            TinkerCheckpoint.kind == path.kind,
            TinkerCheckpoint.name == path.name,
        )
    ).scalar_one_or_none()


def readable_checkpoint(
    session: Session, organization_id: str, path: TinkerPath, *, param: str = "path"
) -> TinkerCheckpoint:
    """The checkpoint at a `tinker://` path if this organization may read it: its own, or
    published; and, for a copy of another organization's weights, only while they are published."""
    row = checkpoint_at(session, path)
    if row is None or not (row.organization_id == organization_id or row.public):
        raise NotFound(f"no checkpoint {path} in this organization, nor published", param=param)
    if not origin_stands(session, row):
        raise NotFound(
            f"{path} is a copy of weights another organization published, and they are no longer published; "
            "the copy has ended (delete it)",
            param=param,
        )
    return row


def origin_stands(session: Session, row: TinkerCheckpoint) -> bool:
    """Whether the publication a copy of another organization's weights stands on is still up
    (always, for an organization's own weights)."""
    if row.origin_checkpoint_id is None:
        return True
    origin = session.get(TinkerCheckpoint, row.origin_checkpoint_id)
    return origin is not None and origin.public


# ---- deployments and their current revision --------------------------------------------------


def get_deployment(session: Session, organization_id: str, deployment_id: str) -> Deployment:
    """By id or by name, in the caller's organization."""
    row = session.get(Deployment, deployment_id)
    if row is None or row.organization_id != organization_id:
        row = session.execute(
            select(Deployment).where(Deployment.organization_id == organization_id, Deployment.name == deployment_id)
        ).scalar_one_or_none()
    if row is None:
        names = session.execute(select(Deployment.name).where(Deployment.organization_id == organization_id)).scalars()
        raise NotFound(
            f"No deployment {deployment_id!r} in this organization{did_you_mean(deployment_id, names)}; "
            "create one with POST /v1/deployments",
            param="deployment_id",
        )
    return row


def current_revision(session: Session, deployment: Deployment) -> DeploymentRevision:
    """The revision a deployment serves now."""
    revision = session.execute(
        select(DeploymentRevision).where(
            DeploymentRevision.deployment_id == deployment.id,
            DeploymentRevision.revision == deployment.current_revision,
        )
    ).scalar_one()
    return revision


def deployment_of_model(
    session: Session, organization_id: str, name: str
) -> tuple[Deployment, DeploymentRevision] | None:
    """The deployment named `name` and its current revision, if `name` names one."""
    deployment = session.execute(
        select(Deployment).where(Deployment.organization_id == organization_id, Deployment.name == name)
    ).scalar_one_or_none()
    if deployment is None:
        return None
    if deployment.status != "active":
        raise Conflict(f"deployment {name!r} is withdrawn; promote a version to serve it again", param="model")
    return deployment, current_revision(session, deployment)


# ---- eval runs and their outcomes ------------------------------------------------------------


def get_eval_run(session: Session, organization_id: str, eval_id: str, *, param: str = "id") -> EvalRun:
    """The organization's eval run `eval_id`; NotFound naming `param` otherwise."""
    try:
        return get_owned(session, EvalRun, eval_id, organization_id=organization_id, noun="eval run")
    except NotFound as exc:
        raise NotFound(exc.message, param=param) from None


def succeeded_run(run: EvalRun, param: str) -> EvalRun:
    """`run`, if it succeeded: only a finished run's trajectories can be compared or gated."""
    if run.status != "succeeded":
        raise Conflict(f"eval run {run.id} is {run.status}; use runs that have succeeded", param=param)
    return run


def run_outcomes(session: Session, run: EvalRun) -> RunOutcomes:
    """A run's per-task outcomes, in the order they were recorded: what comparisons and gates read."""
    rows = session.execute(
        select(
            Trajectory.task_id,
            Trajectory.passed,
            Trajectory.score,
            Trajectory.steps,
            Trajectory.tokens_in,
            Trajectory.tokens_out,
            Trajectory.latency_ms,
        )
        .where(Trajectory.eval_run_id == run.id)
        .order_by(Trajectory.created_at, Trajectory.id)
    ).all()
    return RunOutcomes(
        run_id=run.id,
        benchmark_version_id=run.benchmark_version_id,
        outcomes=[TaskOutcome(*row) for row in rows],
    )

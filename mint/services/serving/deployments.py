"""Deployments: a stable name that serves one adapter version, or a mixture routed among several.

Every change is a new revision (create, promote, rollback, withdraw) and an audit-log entry;
the deployment row points at its current revision. A request resolves the deployment once,
to the revision current at that moment, so it is served wholly by one version however many
promotions happen while it streams.

A deployment may carry a gate (`mint.evals.gates.GateSpec`): a promotion needs a succeeded
eval run of the candidate on the gate's benchmark, and, when a version is or was in
production, its run on the same benchmark version: a withdrawn deployment is compared with
the version it served last, so withdrawing does not lift the gate's regression checks. The
verdict and its numbers are kept in the revision; every refusal is kept in the audit log. A
verdict warns (and only warns) of each judge of the benchmark version whose agreement with the
experts' reviews is low (`mint.services.agreement.judge_warnings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest
from mint.evals.gates import GateSpec, GateVerdict, evaluate_gate
from mint.services import catalog
from mint.services.agreement import judge_warnings
from mint.services.audit import record_audit
from mint.services.catalog import ResolvedModel, model_ref_of_id, resolve_model_ref
from mint.services.dispatch import Dispatch
from mint.services.models.adapters import require_lora
from mint.services.principal import Principal
from mint.services.webhooks import events
from mint.serving.mixture import MixtureSpec
from mint.storage.queries import PageResult, get_owned, owned_by, paginate
from mint.storage.tables import (
    AdapterVersion,
    Benchmark,
    BenchmarkVersion,
    Deployment,
    DeploymentRevision,
    EvalRun,
    new_id,
    utcnow,
)


class GateRefused(Conflict):
    """A promotion the deployment's gate refused; `verdict` holds the numbers."""

    def __init__(self, message: str, verdict: dict[str, Any]) -> None:
        super().__init__(message, param="model")
        self.verdict = verdict


@dataclass(frozen=True)
class Target:
    """What a revision serves: one adapter version (single) or a mixture of them."""

    base_model: str
    adapter_version_id: str | None
    routing: dict[str, Any]


def _resolve_adapter(session: Session, organization_id: str, ref: str, param: str) -> ResolvedModel:
    resolved = resolve_model_ref(session, organization_id, ref)
    if resolved.adapter_version is None:
        raise InvalidRequest(f"{ref!r} is a base model; deploy an adapter version such as name@1", param=param)
    require_lora(resolved.adapter_version, resolved.ref, param=param)
    return resolved


def resolve_target(
    session: Session, organization_id: str, *, model: str | None, mixture: dict[str, Any] | None
) -> Target:
    """Check what a create or promote names: `model` (an adapter version) or a `mixture` spec."""
    if (model is None) == (mixture is None):
        raise InvalidRequest("give either `model` (an adapter version, e.g. name@1) or `mixture`", param="model")
    if model is not None:
        resolved = _resolve_adapter(session, organization_id, model, "model")
        assert resolved.adapter_version is not None
        return Target(resolved.base_model, resolved.adapter_version.id, {"model": resolved.ref})
    spec = MixtureSpec.model_validate(mixture)
    refs = sorted({*spec.adapters, *_router_models(spec)})
    resolved_refs = {ref: _resolve_adapter(session, organization_id, ref, "mixture.adapters") for ref in refs}
    bases = {resolved.base_model for resolved in resolved_refs.values()}
    if len(bases) != 1:
        raise InvalidRequest(
            f"a mixture serves adapters of one base model; these span {', '.join(sorted(bases))}",
            param="mixture.adapters",
        )
    versions = {ref: resolved.adapter_version.id for ref, resolved in resolved_refs.items() if resolved.adapter_version}
    return Target(bases.pop(), None, {"mixture": spec.model_dump(mode="json"), "versions": versions})


def _router_models(spec: MixtureSpec) -> list[str]:
    router = getattr(spec.policy, "router", None)
    return [router] if isinstance(router, str) else []


def list_deployments(
    session: Session, organization_id: str, *, after: str | None, limit: int
) -> PageResult[Deployment]:
    """One page of the organization's deployments, newest first."""
    return paginate(session, owned_by(Deployment, organization_id), Deployment, after=after, limit=limit)


def revisions(session: Session, deployment: Deployment) -> list[DeploymentRevision]:
    return list(
        session.execute(
            select(DeploymentRevision)
            .where(DeploymentRevision.deployment_id == deployment.id)
            .order_by(DeploymentRevision.revision.desc())
        ).scalars()
    )


def _add_revision(
    session: Session,
    principal: Principal,
    deployment: Deployment,
    action: str,
    target: Target | None,
    *,
    reason: str,
    verdict: dict[str, Any] | None = None,
    send: Dispatch | None = None,
) -> DeploymentRevision:
    """Add the deployment's next revision, its audit entry, and its webhook event (promote,
    rollback, withdraw), all in the caller's transaction; `send` sends the event once it commits."""
    revision = DeploymentRevision(
        id=new_id("deprev"),
        deployment_id=deployment.id,
        revision=deployment.current_revision + 1,
        action=action,
        adapter_version_id=target.adapter_version_id if target else None,
        routing=target.routing if target else {},
        gate_verdict=verdict,
        reason=reason,
        created_by_key_id=principal.key_id,
    )
    session.add(revision)
    deployment.current_revision = revision.revision
    deployment.updated_at = utcnow()
    session.flush()
    record_audit(
        session,
        principal,
        f"deployment.{action}",
        "deployment",
        deployment.id,
        {"revision": revision.revision, "routing": revision.routing, "reason": reason, "gate": verdict},
    )
    events.deployment_event(session, deployment, revision, send)
    return revision


def _last_in_production(session: Session, deployment: Deployment) -> Target | None:
    """What the deployment serves, or served last before it was withdrawn.

    A gate compares with it whatever the history: withdrawing a deployment does not reset
    its baseline to "nothing in production".
    """
    for revision in revisions(session, deployment):
        if revision.action != "withdraw" and (revision.adapter_version_id is not None or revision.routing):
            return Target(deployment.base_model, revision.adapter_version_id, revision.routing)
    return None


def _serves_the_same(a: Target, b: Target) -> bool:
    if a.adapter_version_id is not None or b.adapter_version_id is not None:
        return a.adapter_version_id == b.adapter_version_id
    return a.routing.get("mixture") == b.routing.get("mixture") and set(a.routing.get("versions", {})) == set(
        b.routing.get("versions", {})
    )


def _newest_run_of(
    session: Session, organization_id: str, target: Target, benchmark_version_id: str | None, benchmark: str
) -> EvalRun | None:
    """The newest succeeded run on the gate's benchmark of what `target` serves: its adapter
    version, or, for a mixture, a run of a deployment that served this very mixture (the same
    policy and versions, e.g. a staging deployment), which pinned both in its config."""
    query = (
        select(EvalRun)
        .join(BenchmarkVersion, BenchmarkVersion.id == EvalRun.benchmark_version_id)
        .join(Benchmark, Benchmark.id == BenchmarkVersion.benchmark_id)
        .where(
            EvalRun.organization_id == organization_id,
            EvalRun.status == "succeeded",
            Benchmark.name == benchmark,
            EvalRun.adapter_version_id == target.adapter_version_id
            if target.adapter_version_id is not None
            else EvalRun.adapter_version_id.is_(None),
        )
        .order_by(EvalRun.created_at.desc())
    )
    if benchmark_version_id is not None:
        query = query.where(EvalRun.benchmark_version_id == benchmark_version_id)
    if target.adapter_version_id is not None:
        return session.execute(query.limit(1)).scalar_one_or_none()
    for run in session.execute(query).scalars():
        pinned = (run.config.get("deployment") or {}).get("mixture")
        if pinned and _serves_the_same(
            target, Target(target.base_model, None, {"mixture": pinned["spec"], "versions": pinned["versions"]})
        ):
            return run
    return None


def _refuse(
    session: Session,
    principal: Principal,
    deployment: Deployment,
    error: Conflict,
    record: dict[str, Any] | None,
    record_refusal: bool,
) -> NoReturn:
    """Keep a refused promotion in the audit log (committed before the error is raised), then raise it."""
    if record_refusal:
        record_audit(
            session,
            principal,
            "deployment.gate_refused",
            "deployment",
            deployment.id,
            {"gate": record, "reason": error.message},
        )
        session.commit()
    raise error


def _verdict(
    session: Session, organization_id: str, spec: GateSpec, *, candidate_id: str, production_id: str | None
) -> GateVerdict:
    """A deployment gate's verdict for a candidate's run against production's run (None: nothing in production)."""
    candidate = catalog.get_eval_run(session, organization_id, candidate_id, param="candidate")
    catalog.succeeded_run(candidate, "candidate")
    production = None
    if production_id is not None:
        production = catalog.get_eval_run(session, organization_id, production_id, param="production")
        catalog.succeeded_run(production, "production")
    verdict = evaluate_gate(
        spec,
        benchmark_name=str(candidate.config.get("benchmark_name", "")),
        candidate=catalog.run_outcomes(session, candidate),
        production=catalog.run_outcomes(session, production) if production is not None else None,
    )
    verdict.warnings = judge_warnings(session, organization_id, candidate.benchmark_version_id)
    return verdict


def _gate(
    session: Session,
    principal: Principal,
    deployment: Deployment,
    target: Target,
    production: Target | None,
    *,
    record_refusal: bool = True,
) -> dict[str, Any] | None:
    """The gate's verdict on promoting `target` over the `production` version; raises GateRefused.

    A refused promotion of an existing deployment is kept in the audit log (committed before
    the error); a refused creation leaves nothing behind.
    """
    if deployment.gate is None:
        return None
    spec = GateSpec.model_validate(deployment.gate)
    organization_id = deployment.organization_id
    candidate = _newest_run_of(session, organization_id, target, None, spec.benchmark)
    if candidate is None:
        what = target.routing.get("model") or "this mixture"
        how = (
            "run POST /v1/evals first"
            if target.adapter_version_id is not None
            else "deploy the same mixture under another name (a staging deployment), evaluate it with POST /v1/evals, "
            "then promote it here"
        )
        missing = Conflict(f"the gate needs an eval of {what} on benchmark {spec.benchmark!r}: {how}", param="model")
        _refuse(session, principal, deployment, missing, None, record_refusal)
    baseline = None
    if production is not None and not _serves_the_same(production, target):
        baseline = _newest_run_of(session, organization_id, production, candidate.benchmark_version_id, spec.benchmark)
        if baseline is None:
            missing = Conflict(
                f"the gate compares with the version last in production, which has no eval on the same version of "
                f"{spec.benchmark!r}: evaluate it on that benchmark version first",
                param="model",
            )
            _refuse(session, principal, deployment, missing, None, record_refusal)
    verdict = _verdict(
        session, organization_id, spec, candidate_id=candidate.id, production_id=baseline.id if baseline else None
    )
    record = verdict.model_dump(mode="json")
    if not verdict.passed:
        refused = GateRefused(f"the gate refused the promotion: {verdict.reason}", record)
        _refuse(session, principal, deployment, refused, record, record_refusal)
    return record


def create_deployment(
    session: Session,
    principal: Principal,
    *,
    name: str,
    model: str | None,
    mixture: dict[str, Any] | None,
    gate: dict[str, Any] | None,
    reason: str,
) -> Deployment:
    exists = session.execute(
        select(Deployment).where(Deployment.organization_id == principal.organization_id, Deployment.name == name)
    ).scalar_one_or_none()
    if exists is not None:
        raise Conflict(f"a deployment named {name!r} already exists; promote a new version to it", param="name")
    target = resolve_target(session, principal.organization_id, model=model, mixture=mixture)
    if gate is not None:
        gate = GateSpec.model_validate(gate).model_dump(mode="json")
    deployment = Deployment(
        id=new_id("deploy"),
        organization_id=principal.organization_id,
        name=name,
        kind="single" if model is not None else "mixture",
        base_model=target.base_model,
        status="active",
        current_revision=0,
        gate=gate,
    )
    verdict = _gate(session, principal, deployment, target, production=None, record_refusal=False)
    session.add(deployment)
    session.flush()
    _add_revision(session, principal, deployment, "create", target, reason=reason, verdict=verdict)
    return deployment


def promote(
    session: Session,
    principal: Principal,
    deployment_id: str,
    *,
    model: str | None,
    mixture: dict[str, Any] | None,
    reason: str,
    send: Dispatch | None = None,
) -> Deployment:
    deployment = catalog.get_deployment(session, principal.organization_id, deployment_id)
    target = resolve_target(session, principal.organization_id, model=model, mixture=mixture)
    if target.base_model != deployment.base_model:
        raise InvalidRequest(
            f"deployment {deployment.name!r} serves base {deployment.base_model!r}; "
            f"{model or 'the mixture'} is on {target.base_model!r}",
            param="model",
        )
    if (deployment.kind == "single") != (model is not None):
        raise InvalidRequest(f"deployment {deployment.name!r} is a {deployment.kind} deployment", param="model")
    verdict = _gate(session, principal, deployment, target, production=_last_in_production(session, deployment))
    deployment.status = "active"
    _add_revision(session, principal, deployment, "promote", target, reason=reason, verdict=verdict, send=send)
    return deployment


def rollback(
    session: Session,
    principal: Principal,
    deployment_id: str,
    *,
    to_revision: int | None,
    reason: str,
    send: Dispatch | None = None,
) -> Deployment:
    """Serve again what an earlier revision served (by default the one before the current)."""
    deployment = catalog.get_deployment(session, principal.organization_id, deployment_id)
    history = {revision.revision: revision for revision in revisions(session, deployment)}
    wanted = to_revision if to_revision is not None else deployment.current_revision - 1
    earlier = history.get(wanted)
    if earlier is None or wanted >= deployment.current_revision or earlier.action == "withdraw":
        raise Conflict(
            f"deployment {deployment.name!r} has no earlier revision {wanted} that served a version to roll back to",
            param="to_revision",
        )
    target = Target(deployment.base_model, earlier.adapter_version_id, dict(earlier.routing))
    if target.adapter_version_id is not None:
        version = session.get(AdapterVersion, target.adapter_version_id)
        if version is None or version.status != "ready":
            raise Conflict(f"revision {wanted} serves a version that was withdrawn", param="to_revision")
        require_lora(version, model_ref_of_id(session, version.id), param="to_revision")
    deployment.status = "active"
    reason = reason or f"rollback to revision {wanted}"
    _add_revision(session, principal, deployment, "rollback", target, reason=reason, send=send)
    return deployment


def withdraw(
    session: Session, principal: Principal, deployment_id: str, *, reason: str, send: Dispatch | None = None
) -> Deployment:
    """Stop serving: requests to the deployment are refused until a version is promoted again."""
    deployment = catalog.get_deployment(session, principal.organization_id, deployment_id)
    if deployment.status == "withdrawn":
        raise Conflict(f"deployment {deployment.name!r} is already withdrawn", param="deployment_id")
    deployment.status = "withdrawn"
    _add_revision(session, principal, deployment, "withdraw", None, reason=reason, send=send)
    return deployment


def owned(session: Session, organization_id: str, deployment_id: str) -> Deployment:
    return get_owned(session, Deployment, deployment_id, organization_id=organization_id, noun="deployment")

"""Deployments: create, promote a version, roll back, withdraw, and the revision history.

Every change is a revision and an audit-log entry. Send the deployment's name as `model`
to `/v1/chat/completions`; each response names the adapter version that served it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks
from fastapi.responses import JSONResponse

from mint.api.deps import CurrentPrincipal, OptionalDispatchDep, SessionDep, SettingsDep
from mint.api.pagination import After, Limit, id_path, page_from
from mint.api.routes.captures import with_feedback
from mint.schemas.captures import CapturePublic, CaptureSettings, CaptureUpdate
from mint.schemas.common import Page
from mint.schemas.deployments import (
    DeploymentCreate,
    DeploymentPublic,
    PromoteRequest,
    RevisionPublic,
    RollbackRequest,
    WithdrawRequest,
)
from mint.services import catalog
from mint.services.serving import captures, deployments, inference, node_client
from mint.services.serving.nodes import live_addresses
from mint.storage.tables import Deployment

router = APIRouter(prefix="/v1/deployments", tags=["deployments"])

DeploymentId = Annotated[str, id_path("The deployment's id (`deploy_...`) or name.")]


def _prefetch_later(session: SessionDep, settings: SettingsDep, deployment: Deployment, tasks: BackgroundTasks) -> None:
    """After the response: hint the base's serving nodes to warm what the deployment now serves."""
    if deployment.status != "active":
        return
    adapters = inference.deployment_adapters(session, deployment)
    nodes = live_addresses(session, deployment.base_model, settings.shared_node_token)
    if nodes:
        tasks.add_task(node_client.prefetch_on_nodes, nodes, adapters)


def _public(session: SessionDep, deployment: Deployment) -> DeploymentPublic:
    wire = DeploymentPublic.model_validate(deployment)
    serving = RevisionPublic.model_validate(catalog.current_revision(session, deployment))
    capture = CaptureSettings(
        rate=deployment.capture_rate,
        retention_days=deployment.capture_retention_days,
        tokens=bool(deployment.capture_tokens),
    )
    return wire.model_copy(update={"serving": serving, "capture": capture})


@router.post("", response_model=DeploymentPublic, status_code=201)
def create_deployment(
    body: DeploymentCreate,
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
    tasks: BackgroundTasks,
) -> DeploymentPublic:
    """Serve an adapter version (or a mixture) under a stable name; revision 1."""
    deployment = deployments.create_deployment(
        session, principal, name=body.name, model=body.model, mixture=body.mixture, gate=body.gate, reason=body.reason
    )
    _prefetch_later(session, settings, deployment, tasks)
    return _public(session, deployment)


@router.get("", response_model=Page[DeploymentPublic])
def list_deployments(
    session: SessionDep, principal: CurrentPrincipal, after: After = None, limit: Limit = 20
) -> Page[DeploymentPublic]:
    result = deployments.list_deployments(session, principal.organization_id, after=after, limit=limit)
    return page_from([_public(session, row) for row in result.rows], result.has_more, DeploymentPublic)


@router.get("/{deployment_id}", response_model=DeploymentPublic)
def get_deployment(deployment_id: DeploymentId, session: SessionDep, principal: CurrentPrincipal) -> DeploymentPublic:
    return _public(session, catalog.get_deployment(session, principal.organization_id, deployment_id))


@router.get("/{deployment_id}/revisions", response_model=list[RevisionPublic])
def list_revisions(
    deployment_id: DeploymentId, session: SessionDep, principal: CurrentPrincipal
) -> list[RevisionPublic]:
    """Every revision, newest first: what served, why, and the gate's verdict."""
    deployment = catalog.get_deployment(session, principal.organization_id, deployment_id)
    return [RevisionPublic.model_validate(row) for row in deployments.revisions(session, deployment)]


@router.post(
    "/{deployment_id}/promote",
    response_model=DeploymentPublic,
    responses={409: {"description": "The gate refused the promotion; `error.verdict` holds its numbers."}},
)
def promote(
    deployment_id: DeploymentId,
    body: PromoteRequest,
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
    tasks: BackgroundTasks,
    send: OptionalDispatchDep,
) -> DeploymentPublic | JSONResponse:
    """Serve another version; a gated deployment first checks the candidate's eval against production's."""
    try:
        deployment = deployments.promote(
            session, principal, deployment_id, model=body.model, mixture=body.mixture, reason=body.reason, send=send
        )
    except deployments.GateRefused as refused:
        error = {"type": refused.type, "message": refused.message, "param": refused.param, "verdict": refused.verdict}
        return JSONResponse({"error": error}, status_code=409)
    _prefetch_later(session, settings, deployment, tasks)
    return _public(session, deployment)


@router.post("/{deployment_id}/rollback", response_model=DeploymentPublic)
def rollback(
    deployment_id: DeploymentId,
    body: RollbackRequest,
    session: SessionDep,
    principal: CurrentPrincipal,
    send: OptionalDispatchDep,
) -> DeploymentPublic:
    """Serve again what an earlier revision served (the previous one by default)."""
    deployment = deployments.rollback(
        session, principal, deployment_id, to_revision=body.to_revision, reason=body.reason, send=send
    )
    return _public(session, deployment)


@router.post("/{deployment_id}/withdraw", response_model=DeploymentPublic)
def withdraw(
    deployment_id: DeploymentId,
    body: WithdrawRequest,
    session: SessionDep,
    principal: CurrentPrincipal,
    send: OptionalDispatchDep,
) -> DeploymentPublic:
    """Stop serving until a version is promoted again."""
    deployment = deployments.withdraw(session, principal, deployment_id, reason=body.reason, send=send)
    return _public(session, deployment)


@router.patch("/{deployment_id}/capture", response_model=DeploymentPublic)
def set_capture(
    deployment_id: DeploymentId, body: CaptureUpdate, session: SessionDep, principal: CurrentPrincipal
) -> DeploymentPublic:
    """Record a share of the requests this deployment serves (`rate`, 0 to stop), each kept for
    `retention_days`; with `tokens`, the turns of episodes a client marks (header X-Mint-Episode)
    are recorded token-exact, for online RL (`/v1/episodes`); audited. Capture is written behind
    the request path: it never slows or fails a request. Find a capture by its completion's id
    at `/v1/captures/{id}`."""
    deployment = catalog.get_deployment(session, principal.organization_id, deployment_id)
    captures.set_capture(
        session, principal, deployment, rate=body.rate, retention_days=body.retention_days, tokens=body.tokens
    )
    return _public(session, deployment)


@router.get("/{deployment_id}/captures", response_model=Page[CapturePublic])
def list_captures(
    deployment_id: DeploymentId,
    session: SessionDep,
    principal: CurrentPrincipal,
    after: After = None,
    limit: Limit = 20,
) -> Page[CapturePublic]:
    """The requests this deployment captured, newest first, each with its feedback."""
    result = captures.list_captures(session, principal.organization_id, deployment_id, after=after, limit=limit)
    return page_from(with_feedback(session, result.rows), result.has_more, CapturePublic)

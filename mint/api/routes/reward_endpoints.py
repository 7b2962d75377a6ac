"""Reward endpoints: the servers a team hosts that `remote` graders call to score outputs.

Mint POSTs `{"type": "reward.request", "items": [...]}` to the endpoint's URL, signed as
webhooks are (`webhook-id`, `webhook-timestamp`, `webhook-signature`, Standard Webhooks), and
reads `{"rewards": [...]}` back; verify a request with the secret shown at create or rotate,
e.g. `standardwebhooks.Webhook(secret).verify(body, headers)`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from mint.api.deps import CurrentPrincipal, SessionDep, SettingsDep
from mint.api.pagination import After, Limit, id_path, page_of
from mint.schemas.common import Page
from mint.schemas.reward_endpoints import (
    RewardEndpointCreate,
    RewardEndpointPublic,
    RewardEndpointUpdate,
    RewardEndpointWithSecret,
)
from mint.services.evals import reward_endpoints
from mint.storage.tables import RewardEndpoint

router = APIRouter(prefix="/v1/reward_endpoints", tags=["reward_endpoints"])

EndpointRef = Annotated[str, id_path("The reward endpoint's id (`rwe_...`) or name.")]


def _with_secret(endpoint: RewardEndpoint) -> RewardEndpointWithSecret:
    return RewardEndpointWithSecret.model_validate(
        {**RewardEndpointPublic.model_validate(endpoint).model_dump(), "secret": endpoint.secret}
    )


@router.post("", response_model=RewardEndpointWithSecret, status_code=201)
def create_reward_endpoint(
    body: RewardEndpointCreate, session: SessionDep, principal: CurrentPrincipal, settings: SettingsDep
) -> RewardEndpointWithSecret:
    """Add a reward endpoint under a name graders use. The signing secret is in this response
    only. Its host must resolve to public addresses (unless the operator allows private networks)."""
    endpoint = reward_endpoints.create_endpoint(
        session,
        principal,
        name=body.name,
        url=body.url,
        description=body.description,
        allow_private=settings.webhook_allow_private_networks,
    )
    return _with_secret(endpoint)


@router.get("", response_model=Page[RewardEndpointPublic])
def list_reward_endpoints(
    session: SessionDep, principal: CurrentPrincipal, after: After = None, limit: Limit = 20
) -> Page[RewardEndpointPublic]:
    """This organization's reward endpoints, newest first, never their secrets."""
    result = reward_endpoints.list_endpoints(session, principal.organization_id, after=after, limit=limit)
    return page_of(result, RewardEndpointPublic)


@router.get("/{endpoint_id}", response_model=RewardEndpointPublic)
def get_reward_endpoint(endpoint_id: EndpointRef, session: SessionDep, principal: CurrentPrincipal) -> RewardEndpoint:
    return reward_endpoints.get_endpoint(session, principal.organization_id, endpoint_id)


@router.patch("/{endpoint_id}", response_model=RewardEndpointPublic)
def update_reward_endpoint(
    endpoint_id: EndpointRef,
    body: RewardEndpointUpdate,
    session: SessionDep,
    principal: CurrentPrincipal,
    settings: SettingsDep,
) -> RewardEndpoint:
    """Change the URL or the description; the rest stays."""
    return reward_endpoints.update_endpoint(
        session,
        principal,
        endpoint_id,
        url=body.url,
        description=body.description,
        allow_private=settings.webhook_allow_private_networks,
    )


@router.delete("/{endpoint_id}", response_model=RewardEndpointPublic)
def delete_reward_endpoint(
    endpoint_id: EndpointRef, session: SessionDep, principal: CurrentPrincipal
) -> RewardEndpointPublic:
    """Remove the endpoint: `remote` graders naming it score 0 from now on, saying why."""
    return RewardEndpointPublic.model_validate(reward_endpoints.delete_endpoint(session, principal, endpoint_id))


@router.post("/{endpoint_id}/rotate_secret", response_model=RewardEndpointWithSecret)
def rotate_secret(
    endpoint_id: EndpointRef, session: SessionDep, principal: CurrentPrincipal
) -> RewardEndpointWithSecret:
    """A new signing secret, at once: requests from now on are signed with it only."""
    return _with_secret(reward_endpoints.rotate_secret(session, principal, endpoint_id))

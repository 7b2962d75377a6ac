"""API keys of the caller's organization. Creating and revoking need an admin key."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from mint.api.deps import CurrentPrincipal, SessionDep
from mint.api.pagination import After, Limit, id_path, page_of
from mint.schemas.auth import ApiKeyCreate, ApiKeyCreated, ApiKeyPublic
from mint.schemas.common import Page
from mint.services import auth
from mint.storage.tables import ApiKey

router = APIRouter(prefix="/v1/api_keys", tags=["api keys"])

KeyId = Annotated[str, id_path("The key's id, e.g. `key_...`.")]


@router.post("", response_model=ApiKeyCreated, status_code=201)
def create_api_key(body: ApiKeyCreate, session: SessionDep, principal: CurrentPrincipal) -> ApiKeyCreated:
    """Create a key in this organization. The secret is in this response only."""
    key, secret = auth.create_api_key(
        session, principal, name=body.name, role=body.role, expires_in_days=body.expires_in_days
    )
    return ApiKeyCreated.model_validate({**ApiKeyPublic.model_validate(key).model_dump(), "key": secret})


@router.get("", response_model=Page[ApiKeyPublic])
def list_api_keys(
    session: SessionDep,
    principal: CurrentPrincipal,
    after: After = None,
    limit: Limit = 20,
) -> Page[ApiKeyPublic]:
    """Keys of this organization, newest first, with their prefix, never the secret."""
    result = auth.list_api_keys(session, principal.organization_id, after=after, limit=limit)
    return page_of(result, ApiKeyPublic)


@router.get("/{key_id}", response_model=ApiKeyPublic)
def get_api_key(key_id: KeyId, session: SessionDep, principal: CurrentPrincipal) -> ApiKey:
    return auth.get_api_key(session, principal, key_id)


@router.delete("/{key_id}", response_model=ApiKeyPublic)
def revoke_api_key(key_id: KeyId, session: SessionDep, principal: CurrentPrincipal) -> ApiKey:
    """Revoke a key at once; it is kept (revoked) for the audit trail."""
    return auth.revoke_api_key(session, principal, key_id)

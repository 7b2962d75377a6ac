"""Request dependencies as `Annotated` aliases: the settings, a database session, the caller,
and the way to send work to the workers.

Authorization that holds for every route lives here, once: a viewer key can only read.
Finer rules (admin-only operations) are checked by the services.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import ConfigurationError, PermissionDenied
from mint.services.auth import authenticate
from mint.services.billing.quotas import QuotaDefaults
from mint.services.dispatch import Dispatch
from mint.services.principal import Principal
from mint.storage.db import session_scope

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The writes a viewer key may make, by method and route template: feedback on what a deployment
# answered, the reward of an episode and an expert's review (the people who read answers are the
# ones who can judge them), and revoking itself.
VIEWER_WRITES = frozenset(
    {
        ("POST", "/v1/captures/{completion_id}/feedback"),
        ("POST", "/v1/episodes/{episode_id}/reward"),
        ("POST", "/v1/reviews/items/{item_id}/reviews"),
        ("DELETE", "/api/v1/auth/apikey/me"),
    }
)
# Where the request gate (mint.api.gate) leaves the principal it authenticated from the
# headers, before any body was read; `get_principal` takes it from there.
PRINCIPAL_SCOPE_KEY = "mint.principal"


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


def get_quota_defaults(settings: SettingsDep) -> QuotaDefaults:
    """The platform's quotas, for organizations that have none of their own."""
    return QuotaDefaults.of(settings)


QuotasDep = Annotated[QuotaDefaults, Depends(get_quota_defaults)]


def get_db(settings: SettingsDep) -> Iterator[Session]:
    """A session committed when the route returns (before the response is sent)."""
    with session_scope(settings.database) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_db, scope="function")]


def bearer_or_api_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The presented secret: `Authorization: Bearer <key>` (OpenAI clients) or
    `X-API-Key: <key>` (the Tinker SDK)."""
    if authorization:
        scheme, _, token = authorization.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else authorization.strip()
    return x_api_key.strip() if x_api_key else None


def check_method_allowed(principal: Principal, method: str, route: str | None) -> None:
    """A viewer key can only read, give feedback on a captured answer, reward an episode, review an
    item of a review queue, and revoke itself (`VIEWER_WRITES`)."""
    if principal.role == "viewer" and method not in READ_METHODS and (method, route) not in VIEWER_WRITES:
        raise PermissionDenied("Viewer keys can only read; use a developer or admin key to make changes.")


def get_principal(
    request: Request,
    session: SessionDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
    x_api_key: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    principal: Principal | None = request.scope.get(PRINCIPAL_SCOPE_KEY)
    if principal is None:  # an app without the gate in front
        principal = authenticate(session, bearer_or_api_key(authorization, x_api_key))
    check_method_allowed(principal, request.method, _route_template(request))
    return principal


def _route_template(request: Request) -> str | None:
    route = request.scope.get("route")
    return getattr(route, "path", None)


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]


def get_dispatch(request: Request) -> Dispatch:
    """The `Dispatch` the app was created with (`create_app(settings, dispatch=...)`)."""
    dispatch: Dispatch | None = request.app.state.dispatch
    if dispatch is None:
        raise ConfigurationError(
            "this API app was created without a Dispatch, so it cannot send work to the workers; "
            "create it with create_app(settings, dispatch=...) as `mint api` does (Celery's)"
        )
    return dispatch


DispatchDep = Annotated[Dispatch, Depends(get_dispatch)]


def get_dispatch_if_any(request: Request) -> Dispatch | None:
    """The app's `Dispatch`, or None: for routes whose messages can wait for beat's sweep
    (webhook deliveries of a change), so they work in an app made without one."""
    dispatch: Dispatch | None = request.app.state.dispatch
    return dispatch


OptionalDispatchDep = Annotated[Dispatch | None, Depends(get_dispatch_if_any)]


def get_principal_briefly(
    request: Request,
    settings: SettingsDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
    x_api_key: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    """The caller, authenticated in a session of its own, closed before the route runs: for
    routes that then wait long on something else (inference waits on a serving node) and
    must not hold a pooled database connection meanwhile. Behind the gate, which checked the
    key already, no session is opened at all."""
    principal: Principal | None = request.scope.get(PRINCIPAL_SCOPE_KEY)
    if principal is not None:
        check_method_allowed(principal, request.method, _route_template(request))
        return principal
    with session_scope(settings.database) as session:
        return get_principal(request, session, authorization, x_api_key)


BriefPrincipal = Annotated[Principal, Depends(get_principal_briefly)]
# The dependencies that make a route need a key: the request gate checks the key of every
# route that depends on one of them before any body is read.
PRINCIPAL_DEPENDENCIES = frozenset({get_principal, get_principal_briefly})

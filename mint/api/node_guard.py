"""The credential check of a serving node's app: only the API (and `mint admin`) may call it.

A node samples any adapter by its hash and pins or evicts cache entries on request, so every
route but the open probes requires `Authorization: Bearer <the node's token>` (the shared
MINT_NODE_TOKEN, or the token the node issued itself and recorded in its serving_nodes row).
This pure ASGI middleware answers 401 from the headers alone, before any body is read, and
denies by default: a route added to the node later, an unknown path and the framework's own
pages (`/docs`, `/openapi.json`) are covered without naming them. Tokens are compared in
constant time, and neither the expected nor the presented one is ever logged.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from mint.api.errors import mint_error_response
from mint.errors import Unauthenticated

# Probes that stay open: they say that the node is up, and count cache hits per tier, nothing more.
OPEN_PATHS = frozenset({"/healthz", "/metrics"})


def presented_token(scope: Scope) -> str | None:
    """The token of the request's `Authorization: Bearer <token>` header, if it has one."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


class NodeCredentialGuard:
    """Refuse (401) every request but the open probes that lacks the node's token."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()

    def allows(self, scope: Scope) -> bool:
        if scope["path"] in OPEN_PATHS:
            return True
        presented = presented_token(scope)
        # compare_digest takes time independent of where the bytes differ.
        return presented is not None and hmac.compare_digest(presented.encode(), self._token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.allows(scope):
            refused = Unauthenticated(
                "this serving node answers only the Mint API: send `Authorization: Bearer <node token>` "
                "(MINT_NODE_TOKEN, or the token the node recorded in its serving_nodes row)"
            )
            await mint_error_response(refused)(scope, receive, send)
            return
        await self.app(scope, receive, send)

"""The request gate: the key is checked from the headers before any body is read, and bodies
are size-limited while they stream in.

FastAPI reads (or spools to disk) a request's body before a route's dependencies run, so the
key check of `mint.api.deps.get_principal` alone would come after the body: a client with no
key could make the API read and parse megabytes, and malformed JSON would get a 422 before
the 401. This pure ASGI middleware runs first. For a route that needs a key it authenticates
the headers (`Authorization: Bearer` or `X-API-Key`) in a short database session, counts the
request against the key's and its organization's rate limits (`mint.api.rate_limit`: 429 with `Retry-After` when over)
and leaves the principal in the ASGI scope, where `get_principal` takes it; a missing or
refused key, or one over its limit, is answered at once, without reading the body. Then every
request's body is counted as it is received: a declared `Content-Length` over the route's
limit is refused up front, a chunked body the moment it passes the limit (413, naming the
limit), and the app, which may still be reading, sees the client disconnect and its own
answer is dropped.

The gate matches the request against the app's own routes, so what needs a key is exactly
the routes that depend on a principal (`deps.PRINCIPAL_DEPENDENCIES`; the health probes,
`/docs`, `/openapi.json` and the dashboard's static files do not); an unknown path goes on
to the router's 404.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.routing import APIRoute, iter_route_contexts
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mint.api.deps import PRINCIPAL_DEPENDENCIES, PRINCIPAL_SCOPE_KEY, bearer_or_api_key, check_method_allowed
from mint.api.errors import mint_error_response
from mint.api.metrics import ROUTE_TEMPLATE_SCOPE_KEY
from mint.api.rate_limit import RateLimiter
from mint.config import Settings
from mint.errors import InvalidRequest, MintError, PayloadTooLarge
from mint.schemas.evals import MAX_CONTENT_CHARS
from mint.services.auth import authenticate
from mint.services.principal import Principal
from mint.storage.db import session_scope

MiB = 1024 * 1024
# Room for the multipart envelope (boundaries, part headers, the form fields) around a file.
MULTIPART_OVERHEAD_BYTES = 64 * 1024
# Benchmark tasks travel as a JSON string of at most MAX_CONTENT_CHARS characters: at most 4
# bytes each in UTF-8, plus the rest of the body.
BENCHMARK_BODY_BYTES = 4 * MAX_CONTENT_CHARS + MiB


def route_body_limits(settings: Settings) -> dict[str, int]:
    """The routes whose bodies may exceed `settings.max_request_bytes`, by route template.
    The services check the sizes of what they store themselves (dataset files against
    `max_upload_bytes`); these limits stop the body that carries it."""
    upload = settings.max_upload_bytes + MULTIPART_OVERHEAD_BYTES
    return {
        "/v1/datasets": upload,
        "/v1/files": upload,
        "/v1/adapters": upload,
        "/v1/benchmarks": BENCHMARK_BODY_BYTES,
        "/v1/benchmarks/{benchmark_id}/versions": BENCHMARK_BODY_BYTES,
        "/api/v1/forward_backward": settings.tinker_max_body_bytes,
    }


def format_bytes(size_bytes: int) -> str:
    if size_bytes % MiB == 0:
        return f"{size_bytes // MiB} MiB"
    if size_bytes > MiB:
        return f"{size_bytes} bytes ({size_bytes / MiB:.1f} MiB)"
    return f"{size_bytes} bytes"


@dataclass(frozen=True)
class GatedRoute:
    """One route of the app, as the gate sees it."""

    template: str
    methods: frozenset[str] | None  # None: any method (a mount)
    needs_key: bool
    matches: Callable[[str], Any]


def _depends_on_principal(route: BaseRoute) -> bool:
    if not isinstance(route, APIRoute):
        return False
    pending = list(route.dependant.dependencies)
    while pending:
        dependency = pending.pop()
        if dependency.call in PRINCIPAL_DEPENDENCIES:
            return True
        pending.extend(dependency.dependencies)
    return False


def gated_routes(routes: Sequence[BaseRoute]) -> list[GatedRoute]:
    """The app's routes in the router's order, each with whether it needs a key."""
    table = []
    for context in iter_route_contexts(routes):
        path = context.path
        if path is None:
            continue
        methods = frozenset(context.methods) if context.methods else None
        regex, _, _ = compile_path(path)
        table.append(GatedRoute(path, methods, _depends_on_principal(context.original_route), regex.match))
    return table


def route_path(scope: Scope) -> str:
    """The path the router matches: the request's path below the app's `root_path`."""
    path, root_path = scope["path"], scope.get("root_path", "")
    if root_path and path.startswith(root_path) and path[len(root_path) :].startswith("/"):
        return str(path[len(root_path) :])
    return str(path)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def declared_length(scope: Scope) -> int | None:
    """The `Content-Length` the client declared, if any."""
    value = _header(scope, b"content-length")
    if value is None:
        return None
    if not value.strip().isdigit():
        raise InvalidRequest(f"Content-Length must be a number of bytes, not {value!r}.")
    return int(value)


def too_large(limit_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body over {format_bytes(limit_bytes)}; send a smaller body "
        "(split the data into several requests or files)"
    )


class RequestGate:
    """ASGI middleware: the key from the headers first, then a size limit on the body."""

    def __init__(self, app: ASGIApp, *, settings: Settings, routes: Callable[[], Sequence[BaseRoute]]) -> None:
        self.app = app
        self.settings = settings
        self._routes = routes
        self._table: list[GatedRoute] | None = None
        self._limits = route_body_limits(settings)
        self._rate_limiter = RateLimiter.from_settings(settings)

    def match(self, scope: Scope) -> GatedRoute | None:
        """The route the router will run for this request (a route of another method: none)."""
        if self._table is None:  # built on the first request, when every router is included
            self._table = gated_routes(self._routes())
        path = route_path(scope)
        for route in self._table:
            if route.matches(path) and (route.methods is None or scope["method"] in route.methods):
                return route
        return None

    def limit_for(self, route: GatedRoute | None) -> int:
        default = self.settings.max_request_bytes
        return self._limits.get(route.template, default) if route else default

    def _authenticate(self, scope: Scope, route: GatedRoute) -> Principal:
        secret = bearer_or_api_key(_header(scope, b"authorization"), _header(scope, b"x-api-key"))
        with session_scope(self.settings.database) as session:
            principal = authenticate(session, secret)
        check_method_allowed(principal, scope["method"], route.template)
        if self._rate_limiter is not None and principal.key_id is not None:
            self._rate_limiter.hit(principal.key_id, principal.organization_id)
        return principal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self.match(scope)
        limit_bytes = self.limit_for(route)
        try:
            if route is not None:
                scope[ROUTE_TEMPLATE_SCOPE_KEY] = route.template
                if route.needs_key:
                    scope[PRINCIPAL_SCOPE_KEY] = await run_in_threadpool(self._authenticate, scope, route)
            declared = declared_length(scope)
            if declared is not None and declared > limit_bytes:
                raise too_large(limit_bytes)
        except MintError as error:
            await mint_error_response(error)(scope, receive, send)
            return
        meter = _BodyMeter(limit_bytes, scope, receive, send)
        try:
            await self.app(scope, meter.receive, meter.send)
        except Exception:
            if not meter.refused:
                raise
            # The 413 is sent; what the app raised on seeing the body cut off is no error.


class _BodyMeter:
    """Counts the bytes of `http.request` messages; past the limit, answers 413 itself and
    tells the app the client left, dropping whatever the app answers after that."""

    def __init__(self, limit_bytes: int, scope: Scope, receive: Receive, send: Send) -> None:
        self.limit_bytes = limit_bytes
        self.received_bytes = 0
        self.refused = False
        self.response_started = False
        self._scope, self._receive, self._send = scope, receive, send

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received_bytes += len(message.get("body", b""))
            if self.received_bytes > self.limit_bytes:
                self.refused = True
                if not self.response_started:
                    await mint_error_response(too_large(self.limit_bytes))(self._scope, self._receive, self._send)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        if message["type"] == "http.response.start":
            self.response_started = True
        await self._send(message)

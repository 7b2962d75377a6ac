"""Prometheus metrics of the API process, defined once at import (the registry is global)."""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUESTS = Counter("mint_http_requests_total", "HTTP requests handled", ["method", "route", "status"])
CAPTURES_WRITTEN = Counter("mint_captures_written_total", "Served requests captured for their deployment")
CAPTURES_DROPPED = Counter(
    "mint_captures_dropped_total", "Captures dropped because the writer fell behind (the requests were served)"
)
LATENCY = Histogram("mint_http_request_duration_seconds", "HTTP request latency", ["method", "route"])

# Labels come from closed sets, so that no client can add label values (and time series) by
# inventing methods or paths: any other method counts as `other`, any path no route serves
# as `unmatched`.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER_METHOD = "other"
UNMATCHED_ROUTE = "unmatched"
# Set by the request gate (mint.api.gate) for the requests it answers before the router runs.
ROUTE_TEMPLATE_SCOPE_KEY = "mint.route_template"


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else OTHER_METHOD


def route_label(scope: Scope) -> str:
    """The template of the route that served the request (`/v1/files/{dataset_id}`)."""
    route = scope.get("route")
    template = getattr(route, "path", None) or scope.get(ROUTE_TEMPLATE_SCOPE_KEY)
    return str(template) if template else UNMATCHED_ROUTE


class RequestMetrics:
    """ASGI middleware: count and time every request by method and route template; a request
    that fails with an unhandled error counts as a 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_note_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note_status)
        finally:
            method, template = method_label(scope["method"]), route_label(scope)
            LATENCY.labels(method, template).observe(time.perf_counter() - started)
            REQUESTS.labels(method, template, str(status)).inc()

"""Prometheus metrics of the API process, defined once at import (the registry is global)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import Request, Response
from prometheus_client import Counter, Histogram

REQUESTS = Counter("mint_http_requests_total", "HTTP requests handled", ["method", "route", "status"])
LATENCY = Histogram("mint_http_request_duration_seconds", "HTTP request latency", ["method", "route"])


async def record_request_metrics(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Middleware: count and time every request by its route template (bounded labels)."""
    started = time.perf_counter()
    response = await call_next(request)
    route = request.scope.get("route")
    template = getattr(route, "path", "unmatched")
    LATENCY.labels(request.method, template).observe(time.perf_counter() - started)
    REQUESTS.labels(request.method, template, str(response.status_code)).inc()
    return response

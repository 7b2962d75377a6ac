"""One log line per request, under the request's id (`mint.tracing`).

The id is the client's `X-Request-Id` when well formed, else a new one; the answer carries it in
its own `X-Request-Id`, and everything the request does (its log lines, the queue messages and
serving-node calls it makes) works under it. The line names the route's path without its query
string (download URLs carry their credential there), the status and the time taken. It stands in
for the server's access log.
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mint import tracing

log = logging.getLogger("mint.api.requests")


class RequestLog:
    """ASGI middleware: the request's id, in its context and its answer, and its log line."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(tracing.HEADER.lower().encode())
        request_id = tracing.accepted(sent.decode("latin-1") if sent is not None else None)
        token = tracing.begin(request_id)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed_ms = (time.perf_counter() - started) * 1000
            log.info("%s %s %d %.0f ms", scope.get("method", "-"), scope.get("path", "-"), status, elapsed_ms)
            tracing.end(token)

"""The request gate: the key is checked from the headers before any body is read, and bodies
are size-limited while they stream in (413 naming the limit)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from mint.api.app import create_app
from mint.config import Settings
from tests.conftest import Tenant

MiB = 1024 * 1024


class CountingBody:
    """A request body of `chunks` chunks that records how many were read."""

    def __init__(self, chunks: int, chunk_bytes: int = 64 * 1024) -> None:
        self.chunks, self.chunk_bytes, self.read = chunks, chunk_bytes, 0

    def __iter__(self) -> Iterator[bytes]:
        for _ in range(self.chunks):
            self.read += 1
            yield b"x" * self.chunk_bytes


def call_asgi(app: FastAPI, path: str, headers: dict[str, str], body: CountingBody) -> tuple[int, dict[str, Any]]:
    """POST `body` to `app` chunk by chunk (a chunked upload, no Content-Length), as a server
    would hand it over; returns the status and the JSON answer."""
    chunks = iter(body)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        chunk = next(chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(name.lower().encode(), value.encode()) for name, value in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    asyncio.run(app(scope, receive, send))
    starts = [message for message in sent if message["type"] == "http.response.start"]
    assert len(starts) == 1, sent
    body_bytes = b"".join(message.get("body", b"") for message in sent if message["type"] == "http.response.body")
    return starts[0]["status"], json.loads(body_bytes)


def test_no_key_and_malformed_json_gets_401_not_422(client: TestClient) -> None:
    response = client.post("/v1/api_keys", content=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 401, response.text
    assert response.json()["error"]["type"] == "authentication_error"
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_no_key_is_refused_before_the_body_is_read(client: TestClient) -> None:
    for path, content_type in (
        ("/v1/datasets", "multipart/form-data; boundary=x"),
        ("/api/v1/forward_backward", "application/x-protobuf"),
        ("/v1/chat/completions", "application/json"),
    ):
        body = CountingBody(chunks=48)  # 3 MiB
        response = client.post(path, content=iter(body), headers={"Content-Type": content_type})
        assert response.status_code == 401, (path, response.text)
        assert body.read <= 1, f"{path}: {body.read} chunks read before the 401"


def test_viewer_key_is_refused_a_write_before_the_body_is_read(client: TestClient, tenant: Tenant) -> None:
    body = CountingBody(chunks=16)
    response = client.post("/v1/api_keys", content=iter(body), headers=tenant.headers("viewer"))
    assert response.status_code == 403 and body.read <= 1


def test_chunked_tinker_body_over_the_limit_gets_413_while_streaming(prepared: Settings, tenant: Tenant) -> None:
    app = create_app(prepared.model_copy(update={"tinker_max_body_bytes": 1 * MiB}))
    headers = {**tenant.headers("developer"), "Content-Type": "application/x-protobuf"}
    body = CountingBody(chunks=128)  # 8 MiB, 64 KiB at a time
    status, answer = call_asgi(app, "/api/v1/forward_backward", headers, body)
    assert status == 413, answer
    assert answer["error"]["type"] == "payload_too_large_error"
    assert "request body over 1 MiB" in answer["error"]["message"]
    assert body.read == 17, "the body is read up to the limit, no further"


def test_json_body_over_the_default_limit_gets_413(client: TestClient, tenant: Tenant) -> None:
    big = json.dumps({"name": "x" * (17 * MiB)}).encode()
    declared = client.post(
        "/v1/api_keys", content=big, headers={**tenant.headers(), "Content-Type": "application/json"}
    )
    assert declared.status_code == 413, declared.text
    assert "request body over 16 MiB" in declared.json()["error"]["message"]
    chunked = client.post("/v1/api_keys", content=iter([big[: 8 * MiB], big[8 * MiB :]]), headers=tenant.headers())
    assert chunked.status_code == 413 and "16 MiB" in chunked.json()["error"]["message"]


def test_small_limit_applies_to_every_route_and_uploads_get_theirs(prepared: Settings, tenant: Tenant) -> None:
    small = create_app(prepared.model_copy(update={"max_request_bytes": 1024}))
    with TestClient(small) as client:
        refused = client.post("/v1/api_keys", json={"name": "k" * 2000}, headers=tenant.headers())
        assert refused.status_code == 413 and "request body over 1024 bytes" in refused.json()["error"]["message"]
        row = {"messages": [{"role": "user", "content": "hi" * 600}, {"role": "assistant", "content": "hello"}]}
        upload = client.post(
            "/v1/datasets",
            headers=tenant.headers(),
            files={"file": ("chat.jsonl", (json.dumps(row) + "\n").encode(), "application/jsonl")},
        )
        assert upload.status_code == 201, upload.text
        assert client.get("/healthz").status_code == 200


def test_principal_is_authenticated_once(client: TestClient, tenant: Tenant, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from mint.api import deps, gate

    calls: list[str] = []
    real = gate.authenticate

    def counting(session, secret):  # type: ignore[no-untyped-def]
        calls.append("gate")
        return real(session, secret)

    monkeypatch.setattr(gate, "authenticate", counting)
    monkeypatch.setattr(deps, "authenticate", lambda *_: calls.append("route"))
    assert client.get("/v1/organization", headers=tenant.headers()).status_code == 200
    assert calls == ["gate"]


def test_only_probes_docs_the_dashboard_and_signed_downloads_need_no_key(app: FastAPI) -> None:
    from mint.api.gate import gated_routes

    public = {route.template for route in gated_routes(app.routes) if not route.needs_key}
    assert public == {
        "/api/v1/signed/{object_key:path}",  # the signed URL is the credential (signed_urls)
        "/healthz",
        "/readyz",
        "/metrics",
        "/api/v1/healthz",
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/docs/assets/{name}",
        "/ui",
        "/ui/",
        "/ui/{name}",
    }


def test_every_route_with_its_own_body_limit_exists(app: FastAPI, prepared: Settings) -> None:
    from mint.api.gate import gated_routes, route_body_limits

    templates = {route.template for route in gated_routes(app.routes)}
    assert set(route_body_limits(prepared)) <= templates

"""Download URLs that carry no key (`external_weights_urls`, `trace_export`), over real HTTP.

A URL's host comes from settings, never from the request's `Host` header; it stops working as
soon as the key it was issued to is revoked, or the publication it read through is withdrawn,
whatever its expiry says; what it stands on cannot be edited out of it; and its signature never
reaches the access log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient

from mint.config import Settings
from mint.services.tinker import signed_urls
from mint.storage.keys import EXTERNAL_FILES
from tests.conftest import Tenant, free_port
from tests.tinker_rows import saved_checkpoint


def checkpoint_route(path: str, suffix: str = "") -> str:
    """The checkpoint routes' address of `tinker://<model>/<segment>/<name>`, plus `suffix`."""
    model_id, checkpoint_id = path.removeprefix("tinker://").split("/", 1)
    return f"/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id}{suffix}"


def weights_urls(client: TestClient, key: str, path: str, **headers: str) -> dict[str, str]:
    response = client.get(checkpoint_route(path, "/external_weights_urls"), headers={"X-API-Key": key, **headers})
    assert response.status_code == 200, response.text
    urls: dict[str, str] = response.json()["urls"]
    assert set(urls) == set(EXTERNAL_FILES)
    return urls


def fetch(client: TestClient, url: str) -> httpx.Response:
    """A URL fetched with no key (the test client answers for any host)."""
    return client.get(url)


def edited(url: str, **changes: str | None) -> str:
    """`url` with query parameters replaced (None: removed)."""
    parts = urlsplit(url)
    query = {name: values[0] for name, values in parse_qs(parts.query).items()}
    for name, value in changes.items():
        if value is None:
            query.pop(name, None)
        else:
            query[name] = value
    return parts._replace(query=urlencode(query)).geturl()


@contextmanager
def app_with(settings: Settings, **changes: Any) -> Iterator[TestClient]:
    """The API on `settings` with `changes`, in process."""
    from mint.api.app import create_app

    with TestClient(create_app(settings.model_copy(update=changes)), raise_server_exceptions=False) as client:
        yield client


def test_download_urls_take_their_host_from_settings_never_from_the_host_header(
    client: TestClient, app: FastAPI, prepared: Settings, tenant: Tenant
) -> None:
    export = saved_checkpoint(prepared, tenant, name="hosted")
    key = tenant.keys["developer"]
    base = signed_urls.public_base_url(app.state.settings)
    urls = weights_urls(client, key, export, host="evil.example")
    for name, url in urls.items():
        assert url.startswith(f"{base}{signed_urls.SIGNED_ROUTE}") and "evil.example" not in url, url
        assert fetch(client, url).content == name.encode()
    session_id = client.post("/api/v1/create_session", headers={"X-API-Key": key}, json={}).json()["session_id"]
    trace = client.get(
        f"/api/v1/sessions/{session_id}/trace_export", headers={"X-API-Key": key, "Host": "evil.example"}
    )
    assert trace.status_code == 200, trace.text
    assert trace.json()["url"].startswith(base) and "evil.example" not in trace.json()["url"]
    assert "traceEvents" in fetch(client, trace.json()["url"]).json()

    # MINT_PUBLIC_URL names the host; unset, an API bound to loopback names its own address.
    with app_with(prepared, public_url="https://mint.example.com/") as public:
        for url in weights_urls(public, key, export, host="evil.example").values():
            assert url.startswith(f"https://mint.example.com{signed_urls.SIGNED_ROUTE}"), url
    with app_with(prepared, public_url=None, api_host="127.0.0.1", api_port=8123) as loopback:
        for url in weights_urls(loopback, key, export, host="evil.example").values():
            assert url.startswith(f"http://127.0.0.1:8123{signed_urls.SIGNED_ROUTE}"), url
    # Bound to every address, the API cannot tell where clients reach it: it refuses to sign.
    with app_with(prepared, public_url=None, api_host="0.0.0.0") as exposed:
        refused = exposed.get(checkpoint_route(export, "/external_weights_urls"), headers={"X-API-Key": key})
        assert refused.status_code == 503, refused.text
        assert "MINT_PUBLIC_URL" in refused.json()["error"]["message"]


def test_presigned_store_urls_only_when_asked_for(prepared: Settings, tenant: Tenant, backend: str) -> None:
    export = saved_checkpoint(prepared, tenant, name="presigned")
    with app_with(prepared, presigned_url_s=60) as presigning:
        url = weights_urls(presigning, tenant.keys["developer"], export)["adapter_config.json"]
    if backend == "services":  # S3 signs its own, for 60 s; the client fetches from the bucket
        assert signed_urls.SIGNED_ROUTE not in url and "Signature=" in url
        assert httpx.get(url).content == b"adapter_config.json"
    else:  # a folder has no URLs of its own
        assert signed_urls.SIGNED_ROUTE in url


def test_unpublishing_ends_the_download_urls_another_organization_was_given(
    client: TestClient, prepared: Settings, tenant: Tenant, other_tenant: Tenant
) -> None:
    owner, reader = tenant.keys["developer"], other_tenant.keys["developer"]
    export = saved_checkpoint(prepared, tenant, name="lent")
    assert (
        client.get(checkpoint_route(export, "/external_weights_urls"), headers={"X-API-Key": reader}).status_code == 404
    )
    published = client.post(checkpoint_route(export, "/publish"), headers={"X-API-Key": owner})
    assert published.status_code == 200 and published.json()["public"] is True
    theirs = weights_urls(client, reader, export)
    mine = weights_urls(client, owner, export)
    assert "publication=" in theirs["adapter_config.json"] and "publication=" not in mine["adapter_config.json"]
    assert fetch(client, theirs["adapter_config.json"]).status_code == 200

    assert client.delete(checkpoint_route(export, "/publish"), headers={"X-API-Key": owner}).status_code == 200
    for url in theirs.values():
        ended = fetch(client, url)
        assert ended.status_code == 404
        assert "no longer published" in ended.json()["error"]["message"]
    assert fetch(client, mine["adapter_model.safetensors"]).content == b"adapter_model.safetensors"

    # The grant is signed with the rest: a URL cannot drop its publication, nor move to another key.
    for forged in (
        edited(theirs["adapter_config.json"], publication=None),
        edited(mine["adapter_config.json"], key_id=other_tenant.key_ids["developer"]),
    ):
        refused = fetch(client, forged)
        assert refused.status_code == 404 and "invalid or has expired" in refused.json()["error"]["message"]


def test_revoking_a_key_ends_the_download_urls_it_was_given(
    client: TestClient, prepared: Settings, tenant: Tenant
) -> None:
    export = saved_checkpoint(prepared, tenant, name="revoked")
    viewer, developer = tenant.keys["viewer"], tenant.keys["developer"]
    by_viewer = weights_urls(client, viewer, export)
    by_developer = weights_urls(client, developer, export)
    session_id = client.post("/api/v1/create_session", headers={"X-API-Key": developer}, json={}).json()["session_id"]
    trace = client.get(f"/api/v1/sessions/{session_id}/trace_export", headers={"X-API-Key": developer}).json()["url"]
    assert fetch(client, by_viewer["adapter_config.json"]).status_code == 200
    assert fetch(client, trace).status_code == 200

    # `tinker auth logout`: the viewer key revokes itself; an admin revokes the developer key.
    assert client.delete("/api/v1/auth/apikey/me", headers={"X-API-Key": viewer}).status_code == 200
    for url in by_viewer.values():
        ended = fetch(client, url)
        assert ended.status_code == 404 and "revoked or expired" in ended.json()["error"]["message"]
    assert fetch(client, by_developer["adapter_config.json"]).status_code == 200
    revoked = client.delete(f"/v1/api_keys/{tenant.key_ids['developer']}", headers=tenant.headers("admin"))
    assert revoked.status_code == 200, revoked.text
    for url in (*by_developer.values(), trace):
        assert fetch(client, url).status_code == 404


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def logged_uvicorn_loggers() -> Iterator[None]:
    """Put uvicorn's loggers back as they were after a server that configured them for itself."""
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "uvicorn.access")]
    saved = [(logger.level, list(logger.handlers), logger.propagate, list(logger.filters)) for logger in loggers]
    try:
        yield
    finally:
        for logger, (level, handlers, propagate, filters) in zip(loggers, saved, strict=True):
            logger.setLevel(level)
            logger.handlers[:] = handlers
            logger.propagate = propagate
            logger.filters[:] = filters


def test_signatures_never_reach_the_access_log(
    app: FastAPI, client: TestClient, prepared: Settings, tenant: Tenant
) -> None:
    import uvicorn

    export = saved_checkpoint(prepared, tenant, name="logged")
    url = weights_urls(client, tenant.keys["developer"], export)["adapter_config.json"]
    signature = parse_qs(urlsplit(url).query)[signed_urls.SIGNATURE_PARAM][0]
    with logged_uvicorn_loggers():
        # As `mint api` runs: the app first (create_app installs the filter), then uvicorn, whose
        # logging set-up replaces the access logger's handlers, with its access log on.
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="info"))
        records = Records()
        logging.getLogger("uvicorn.access").addHandler(records)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            while not server.started:
                assert thread.is_alive(), "the API server did not start"
                time.sleep(0.05)
            local = urlsplit(url)._replace(scheme="http", netloc=f"127.0.0.1:{port}").geturl()
            assert httpx.get(local, timeout=60).content == b"adapter_config.json"
            assert httpx.get(edited(local, expires="1"), timeout=60).status_code == 404
        finally:
            server.should_exit = True
            thread.join(timeout=30)
    lines = [line for line in records.lines if signed_urls.SIGNED_ROUTE in line]
    assert len(lines) == 2, records.lines
    for line in lines:
        assert signature not in line and f"{signed_urls.SIGNATURE_PARAM}={signed_urls.REDACTED}" in line, line


def test_the_redactor_covers_every_signature_parameter() -> None:
    line = "GET /api/v1/signed/a/b.json?key_id=key_1&expires=9&signature=abcdef HTTP/1.1"
    assert signed_urls.redact_signatures(line) == line.replace("abcdef", signed_urls.REDACTED)
    s3 = "https://bucket.s3/x?X-Amz-Credential=c&X-Amz-Signature=0123&X-Amz-Expires=60"
    assert signed_urls.redact_signatures(s3) == s3.replace("0123", signed_urls.REDACTED)
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s"', ("ip", "GET", line), None)
    assert signed_urls.SignatureRedactor().filter(record) and "abcdef" not in record.getMessage()

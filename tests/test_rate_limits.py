"""Per-key rate limits (MINT_RATE_LIMIT, a `limits` string): a key over its limit gets 429
with `Retry-After`, before its body is read; other keys, and routes that need no key, are not
affected. The count is on Redis on the services backend (shared by every API replica) and in
the process's memory on the embedded one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

from mint.api.app import create_app
from mint.api.rate_limit import KEY_PREFIX, KeyRateLimiter
from mint.config import Settings
from mint.errors import RateLimited
from tests.conftest import Tenant, free_port

LIMIT = "3/minute"


def limited_app(settings: Settings, rate: str = LIMIT) -> FastAPI:
    return create_app(settings.model_copy(update={"rate_limit": rate}))


@pytest.fixture
def limited(prepared: Settings) -> Iterator[TestClient]:
    with TestClient(limited_app(prepared), raise_server_exceptions=False) as client:
        yield client


def read(client: TestClient, tenant: Tenant, role: str = "developer") -> Any:
    return client.get("/v1/organization", headers=tenant.headers(role))


def test_a_key_over_its_limit_gets_429_with_retry_after_and_other_keys_do_not(
    limited: TestClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    for _ in range(3):
        assert read(limited, tenant).status_code == 200
    refused = read(limited, tenant)
    assert refused.status_code == 429, refused.text
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert "3 requests per minute" in error["message"] and "Retry after" in error["message"]
    # Refused at the gate, before the body: malformed JSON gets the 429, not a 422.
    body = limited.post(
        "/v1/fine_tuning/jobs",
        headers={**tenant.headers("developer"), "Content-Type": "application/json"},
        content=b"{not json",
    )
    assert body.status_code == 429, body.text
    # Another key of the same organization, and a key of another one, have their own counts.
    assert read(limited, tenant, "viewer").status_code == 200
    assert read(limited, other_tenant).status_code == 200


def test_routes_that_need_no_key_are_not_limited(prepared: Settings, tenant: Tenant) -> None:
    with TestClient(limited_app(prepared, "1/minute"), raise_server_exceptions=False) as client:
        assert read(client, tenant).status_code == 200
        assert read(client, tenant).status_code == 429
        for path in ("/healthz", "/metrics", "/docs", "/openapi.json"):
            for _ in range(3):
                response = client.get(path, headers=tenant.headers("developer"))
                assert response.status_code == 200, (path, response.status_code)


def test_the_count_lives_on_redis_with_services_and_in_memory_embedded(
    backend: str, prepared: Settings, tenant: Tenant
) -> None:
    """Two API replicas: on Redis they share each key's count; embedded, each process counts alone."""
    limiter = KeyRateLimiter.from_settings(prepared.model_copy(update={"rate_limit": LIMIT}))
    assert limiter is not None
    expected = "RedisStorage" if backend == "services" else "MemoryStorage"
    assert type(limiter.storage).__name__ == expected

    with (
        TestClient(limited_app(prepared), raise_server_exceptions=False) as first,
        TestClient(limited_app(prepared), raise_server_exceptions=False) as second,
    ):
        assert [read(first, tenant).status_code for _ in range(2)] == [200, 200]
        answers = [read(second, tenant).status_code for _ in range(3)]
    if backend == "services":
        assert answers == [200, 429, 429]
        import redis

        keys = redis.Redis.from_url(prepared.broker).keys(f"{KEY_PREFIX}*")
        assert any(tenant.key_ids["developer"].encode() in key for key in keys), keys
    else:
        assert answers == [200, 200, 200]


def test_an_empty_setting_disables_the_limit_and_a_bad_one_says_how_to_write_it(prepared: Settings) -> None:
    assert KeyRateLimiter.from_settings(prepared.model_copy(update={"rate_limit": ""})) is None
    for bad in ("lots", "0/minute", "10/fortnight"):
        with pytest.raises(ValidationError, match="600/minute"):
            Settings(rate_limit=bad)
    assert Settings(rate_limit=" 20/second;1200/minute ").rate_limit == "20/second;1200/minute"


@pytest.mark.backend_free
def test_an_unreachable_storage_lets_requests_through() -> None:
    """A Redis outage must not refuse every request: the limit is then not counted."""
    limiter = KeyRateLimiter("1/minute", f"redis://127.0.0.1:{free_port()}/0")
    for _ in range(3):
        limiter.hit("key_1")


@pytest.mark.backend_free
def test_several_windows_each_hold() -> None:
    limiter = KeyRateLimiter("2/second;3/minute", "memory://")
    limiter.hit("key_1")
    limiter.hit("key_1")
    with pytest.raises(RateLimited, match="2 requests per second") as refused:
        limiter.hit("key_1")
    assert refused.value.retry_after_s == 1

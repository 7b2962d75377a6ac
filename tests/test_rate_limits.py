"""Rate limits (`limits` strings): per key (MINT_RATE_LIMIT) and per organization across all
its keys (MINT_ORG_RATE_LIMIT). A key or organization over its limit gets 429 with
`Retry-After`, before its body is read; other keys, other organizations, and routes that need
no key, are not affected. The counts are on Redis on the services backend (shared by every API
replica) and in the process's memory on the embedded one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

from mint.api.app import create_app
from mint.api.rate_limit import KEY_PREFIX, RateLimiter
from mint.config import Settings
from mint.errors import RateLimited
from mint.services import auth
from mint.storage.db import session_scope
from tests.conftest import Tenant, free_port

LIMIT = "3/minute"


def limited_app(settings: Settings, rate: str = LIMIT, org_rate: str = "") -> FastAPI:
    return create_app(settings.model_copy(update={"rate_limit": rate, "org_rate_limit": org_rate}))


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
    limiter = RateLimiter.from_settings(prepared.model_copy(update={"rate_limit": LIMIT}))
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
    unlimited = prepared.model_copy(update={"rate_limit": "", "org_rate_limit": ""})
    assert RateLimiter.from_settings(unlimited) is None
    org_only = RateLimiter.from_settings(unlimited.model_copy(update={"org_rate_limit": "5/minute"}))
    assert org_only is not None and org_only.key_items == [] and len(org_only.org_items) == 1
    for bad in ("lots", "0/minute", "10/fortnight"):
        with pytest.raises(ValidationError, match="MINT_RATE_LIMIT=.*600/minute"):
            Settings(rate_limit=bad)
        with pytest.raises(ValidationError, match="MINT_ORG_RATE_LIMIT=.*600/minute"):
            Settings(org_rate_limit=bad)
    assert Settings(rate_limit=" 20/second;1200/minute ").rate_limit == "20/second;1200/minute"
    assert Settings(org_rate_limit=" 100/second ").org_rate_limit == "100/second"


@pytest.mark.backend_free
def test_an_unreachable_storage_lets_requests_through() -> None:
    """A Redis outage must not refuse every request: the limit is then not counted."""
    limiter = RateLimiter(f"redis://127.0.0.1:{free_port()}/0", key_rate="1/minute", org_rate="1/minute")
    for _ in range(3):
        limiter.hit("key_1", "org_1")


@pytest.mark.backend_free
def test_several_windows_each_hold() -> None:
    limiter = RateLimiter("memory://", key_rate="2/second;3/minute")
    limiter.hit("key_1", "org_1")
    limiter.hit("key_1", "org_1")
    with pytest.raises(RateLimited, match="2 requests per second") as refused:
        limiter.hit("key_1", "org_1")
    assert refused.value.retry_after_s == 1


def test_the_keys_of_one_organization_together_are_held_to_its_limit_and_other_organizations_are_not(
    backend: str, prepared: Settings, tenant: Tenant, other_tenant: Tenant
) -> None:
    """An admin cannot buy more requests with more keys: two keys share the organization's 4
    a minute, then every key of it (a new one too) gets 429 with Retry-After, while another
    organization's keys go on."""
    with TestClient(limited_app(prepared, "", org_rate="4/minute"), raise_server_exceptions=False) as client:
        answers = [read(client, tenant, role).status_code for role in ("developer", "viewer") * 2]
        assert answers == [200] * 4
        for role in ("developer", "viewer"):
            refused = read(client, tenant, role)
            assert refused.status_code == 429, refused.text
            assert 1 <= int(refused.headers["Retry-After"]) <= 60
            error = refused.json()["error"]
            assert error["type"] == "rate_limit_error"
            assert "this organization may make 4 requests per minute" in error["message"], error
            assert "MINT_ORG_RATE_LIMIT" in error["message"]
        with session_scope(prepared.database) as session:
            _, fresh_secret = auth.create_api_key(
                session, auth.operator(tenant.organization_id), name="one more key", role="admin"
            )
        fresh = client.get("/v1/organization", headers={"Authorization": f"Bearer {fresh_secret}"})
        assert fresh.status_code == 429 and "Retry-After" in fresh.headers
        assert [read(client, other_tenant, role).status_code for role in ("developer", "viewer") * 2] == [200] * 4
    if backend == "services":  # counted on Redis, where every API replica sees the count
        import redis

        keys = redis.Redis.from_url(prepared.broker).keys(f"{KEY_PREFIX}*")
        assert any(tenant.organization_id.encode() in key for key in keys), keys


def test_a_key_refused_by_its_own_limit_does_not_use_up_its_organizations(prepared: Settings, tenant: Tenant) -> None:
    """The key's limit is checked first: requests it refuses are not counted against the
    organization, so one runaway key leaves its organization's other keys their share."""
    with TestClient(limited_app(prepared, "2/minute", org_rate="3/minute"), raise_server_exceptions=False) as client:
        assert [read(client, tenant).status_code for _ in range(2)] == [200, 200]
        for _ in range(5):
            refused = read(client, tenant)
            assert refused.status_code == 429 and "this API key may make 2" in refused.json()["error"]["message"]
        assert read(client, tenant, "viewer").status_code == 200  # the organization's third request
        over = read(client, tenant, "viewer")
        assert over.status_code == 429 and "this organization may make 3" in over.json()["error"]["message"]

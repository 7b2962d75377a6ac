"""API keys: shown once, stored hashed, scoped to one organization with a role; revoked
and expired keys refused; viewers read only; admins alone manage keys."""

from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import select

from mint.config import Settings
from mint.services.auth import hash_key
from mint.storage.db import session_scope
from mint.storage.tables import ApiKey, AuditLog, utcnow
from tests.conftest import Tenant


def test_key_works_with_bearer_and_x_api_key_headers(client: TestClient, tenant: Tenant) -> None:
    for headers in (tenant.headers("viewer"), {"X-API-Key": tenant.keys["viewer"]}):
        response = client.get("/v1/organization", headers=headers)
        assert response.status_code == 200, response.text
        assert response.json()["id"] == tenant.organization_id


def test_created_key_is_shown_once_and_stored_as_hash(client: TestClient, tenant: Tenant, prepared: Settings) -> None:
    response = client.post("/v1/api_keys", json={"name": "ci", "role": "developer"}, headers=tenant.headers())
    assert response.status_code == 201, response.text
    created = response.json()
    secret = created["key"]
    assert secret.startswith("tml-") and len(secret) > 40
    assert created["prefix"] == secret[:12]

    listed = client.get("/v1/api_keys", headers=tenant.headers()).json()
    assert secret not in str(listed)
    fetched = client.get(f"/v1/api_keys/{created['id']}", headers=tenant.headers()).json()
    assert "key" not in fetched and fetched["role"] == "developer"
    with session_scope(prepared.database) as session:
        row = session.get(ApiKey, created["id"])
        assert row is not None and row.key_hash == hash_key(secret) and secret not in (row.key_hash, row.prefix)
        actions = session.execute(select(AuditLog.action).where(AuditLog.resource_id == created["id"])).scalars()
        assert "api_key.create" in list(actions)
    assert client.get("/v1/organization", headers={"Authorization": f"Bearer {secret}"}).status_code == 200


def test_revoked_key_gets_401(client: TestClient, tenant: Tenant) -> None:
    victim = tenant.key_ids["developer"]
    assert client.get("/v1/organization", headers=tenant.headers("developer")).status_code == 200
    response = client.delete(f"/v1/api_keys/{victim}", headers=tenant.headers())
    assert response.status_code == 200 and response.json()["revoked_at"] is not None
    refused = client.get("/v1/organization", headers=tenant.headers("developer"))
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    assert "revoked" in refused.json()["error"]["message"]


def test_expired_key_gets_401(client: TestClient, tenant: Tenant, prepared: Settings) -> None:
    with session_scope(prepared.database) as session:
        row = session.get(ApiKey, tenant.key_ids["viewer"])
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=1)
    refused = client.get("/v1/organization", headers=tenant.headers("viewer"))
    assert refused.status_code == 401 and "expired" in refused.json()["error"]["message"]


def test_missing_and_unknown_keys_get_401_with_the_fix(client: TestClient) -> None:
    missing = client.get("/v1/organization")
    assert missing.status_code == 401 and "Authorization: Bearer" in missing.json()["error"]["message"]
    unknown = client.get("/v1/organization", headers={"Authorization": "Bearer tml-not-a-key"})
    assert unknown.status_code == 401 and unknown.json()["error"]["message"].startswith("Unknown API key")


def test_viewer_cannot_write(client: TestClient, tenant: Tenant) -> None:
    response = client.post("/v1/api_keys", json={"name": "x"}, headers=tenant.headers("viewer"))
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "permission_error"


def test_only_admins_manage_keys(client: TestClient, tenant: Tenant) -> None:
    create = client.post("/v1/api_keys", json={"name": "x"}, headers=tenant.headers("developer"))
    assert create.status_code == 403 and "admin" in create.json()["error"]["message"]
    revoke = client.delete(f"/v1/api_keys/{tenant.key_ids['viewer']}", headers=tenant.headers("developer"))
    assert revoke.status_code == 403
    audit = client.get("/v1/audit_log", headers=tenant.headers("developer"))
    assert audit.status_code == 403


def test_malformed_body_gets_422_naming_the_field(client: TestClient, tenant: Tenant) -> None:
    bad_role = client.post("/v1/api_keys", json={"name": "x", "role": "owner"}, headers=tenant.headers())
    assert bad_role.status_code == 422
    assert bad_role.json()["error"]["param"] == "role"
    missing = client.post("/v1/api_keys", json={"role": "viewer"}, headers=tenant.headers())
    assert missing.status_code == 422 and missing.json()["error"]["param"] == "name"
    not_json = client.post(
        "/v1/api_keys", content=b"{not json", headers={**tenant.headers(), "Content-Type": "application/json"}
    )
    assert not_json.status_code == 422 and not_json.json()["error"]["type"] == "invalid_request_error"
    bad_limit = client.get("/v1/api_keys?limit=0", headers=tenant.headers())
    assert bad_limit.status_code == 422 and bad_limit.json()["error"]["param"] == "limit"


def test_key_list_pages_with_cursor(client: TestClient, tenant: Tenant) -> None:
    for index in range(3):
        assert client.post("/v1/api_keys", json={"name": f"k{index}"}, headers=tenant.headers()).status_code == 201
    seen: list[str] = []
    after: str | None = None
    while True:
        params = {"limit": 2, **({"after": after} if after else {})}
        page = client.get("/v1/api_keys", params=params, headers=tenant.headers()).json()
        seen += [key["id"] for key in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert len(seen) == len(set(seen)) == 6  # 3 from the fixture, 3 made here


def test_every_error_has_one_body_shape(client: TestClient, tenant: Tenant) -> None:
    for response in (
        client.get("/no/such/route"),
        client.put("/healthz"),
        client.get("/v1/api_keys/key_missing", headers=tenant.headers()),
        client.get("/v1/organization"),
    ):
        body = response.json()
        assert set(body) == {"error"} and {"type", "message", "param"} == set(body["error"]), body

"""Tenant isolation, checked on every route the app has, found by walking the app's
OpenAPI document (FastAPI builds it from the registered routes), so a route added later is
covered, or this test fails until it says how. Tenant routes must stay in the schema."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Tenant

# Routes open to anyone: health probes for load balancers and Prometheus.
PUBLIC_ROUTES = {"/healthz", "/readyz", "/metrics"}
# Platform-wide catalogues, the same for every organization (read-only for tenants).
GLOBAL_ROUTES = {"/v1/base_models", "/v1/base_models/{name}"}
# Routes about the caller itself; checked to answer with the caller's own organization.
SELF_ROUTES = {
    "/v1/organization",
    "/v1/usage",
    "/v1/audit_log",
    "/v1/api_keys",
    "/v1/benchmarks",
    "/v1/evals",
    "/v1/datasets",
    "/v1/files",
    "/v1/fine_tuning/jobs",
    "/v1/adapters",
    "/v1/deployments",
}
# Routes that name other resources by id in the query or the body, not the path; their
# tenancy (another organization's ids are 404) is checked in tests/evals/test_evals_api.py.
REFERENCE_ROUTES = {"/v1/evals/compare", "/v1/datasets/from-failures"}

# For each path parameter of a tenant route: how to get an id of a resource owned by
# organization A. A later issue that adds a route with a new parameter adds it here.
ResourceMaker = Callable[[TestClient, Tenant], str]


def _benchmark(client: TestClient, owner: Tenant) -> str:
    task = {"id": "t1", "messages": [{"role": "user", "content": "1+1?"}], "reference": "2"}
    body = {"name": f"tenancy-{secrets.token_hex(4)}", "format": "jsonl", "content": json.dumps(task)}
    response = client.post(
        "/v1/benchmarks", headers=owner.headers("developer"), json={**body, "grader": {"type": "numeric"}}
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _eval_run(client: TestClient, owner: Tenant) -> str:
    # On a base whose queue no worker of the suite consumes: the run stays queued.
    body = {"benchmark_id": _benchmark(client, owner), "model": "tiny-qwen3-moe"}
    response = client.post("/v1/evals", headers=owner.headers("developer"), json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _dataset(client: TestClient, owner: Tenant) -> str:
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": secrets.token_hex(4)}]}
    files = {"file": ("d.jsonl", json.dumps(row).encode(), "application/jsonl")}
    response = client.post("/v1/datasets", headers=owner.headers("developer"), files=files)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _job(client: TestClient, owner: Tenant) -> str:
    # On a base whose queue no worker of the suite consumes: the job stays queued.
    body = {"model": "tiny-qwen3-moe", "training_file": _dataset(client, owner), "steps": 1}
    response = client.post("/v1/fine_tuning/jobs", headers=owner.headers("developer"), json=body)
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def _adapter(client: TestClient, owner: Tenant) -> str:
    """An adapter with one version, registered through the service (jobs make them in real use)."""
    from mint.config import get_settings
    from mint.services.adapters import register_version
    from mint.storage.db import session_scope
    from mint.storage.objects import object_store_for

    settings = get_settings()
    with session_scope(settings.database) as session:
        version = register_version(
            session,
            object_store_for(settings),
            organization_id=owner.organization_id,
            name=f"tenancy-{secrets.token_hex(4)}",
            base_model="tiny-glm-moe",
            archive=secrets.token_bytes(64),
            lora={"rank": 1, "alpha": 2.0},
        )
        return version.adapter_id


def _deployment(client: TestClient, owner: Tenant) -> str:
    from mint.config import get_settings
    from mint.storage.db import session_scope
    from mint.storage.tables import Adapter

    adapter_id = _adapter(client, owner)
    with session_scope(get_settings().database) as session:
        name = session.get(Adapter, adapter_id).name  # type: ignore[union-attr]
    body = {"name": f"dep-{secrets.token_hex(4)}", "model": f"{name}@1"}
    response = client.post("/v1/deployments", headers=owner.headers("developer"), json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


RESOURCE_MAKERS: dict[str, ResourceMaker] = {
    "deployment_id": _deployment,
    "key_id": lambda client, owner: owner.key_ids["viewer"],
    "dataset_id": _dataset,
    "job_id": _job,
    "adapter_id": _adapter,
    "version": lambda client, owner: "1",
    "benchmark_id": _benchmark,
    "eval_id": _eval_run,
}


def api_routes(app) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    paths = app.openapi()["paths"]
    return [(method.upper(), path) for path, operations in sorted(paths.items()) for method in sorted(operations)]


def test_every_route_is_classified(app) -> None:  # type: ignore[no-untyped-def]
    for _method, path in api_routes(app):
        params = re.findall(r"{(\w+)}", path)
        if path in PUBLIC_ROUTES | GLOBAL_ROUTES | SELF_ROUTES | REFERENCE_ROUTES:
            continue
        missing = [name for name in params if name not in RESOURCE_MAKERS]
        assert params and not missing, f"{path}: add its parameters to RESOURCE_MAKERS or classify the route"


def test_other_organization_gets_404_on_every_resource_route(
    app, client: TestClient, tenant: Tenant, other_tenant: Tenant
) -> None:  # type: ignore[no-untyped-def]
    checked = 0
    for method, path in api_routes(app):
        params = re.findall(r"{(\w+)}", path)
        if not params or path in GLOBAL_ROUTES:
            continue
        url = path
        for name in params:
            url = url.replace("{" + name + "}", RESOURCE_MAKERS[name](client, tenant))
        owner_sees = client.request(method, url, headers=tenant.headers("admin"), json={})
        intruder = client.request(method, url, headers=other_tenant.headers("admin"), json={})
        assert intruder.status_code == 404, f"{method} {path}: {intruder.status_code} {intruder.text}"
        assert owner_sees.status_code != 404, f"{method} {path} should exist for its owner"
        checked += 1
    assert checked >= 2


def test_lists_show_only_the_callers_resources(client: TestClient, tenant: Tenant, other_tenant: Tenant) -> None:
    for path in sorted(SELF_ROUTES):
        mine = client.get(path, headers=tenant.headers("admin"))
        theirs = client.get(path, headers=other_tenant.headers("admin"))
        assert mine.status_code == theirs.status_code == 200, (path, mine.text, theirs.text)
        assert tenant.organization_id not in theirs.text
        for key_id in tenant.key_ids.values():
            assert key_id not in theirs.text, path


@pytest.mark.parametrize("role", ["admin", "developer", "viewer"])
def test_organization_route_answers_with_the_callers_organization(
    client: TestClient, tenant: Tenant, role: str
) -> None:
    assert client.get("/v1/organization", headers=tenant.headers(role)).json()["id"] == tenant.organization_id

"""Tenant isolation, checked on every route the app has, found by walking the app's
OpenAPI document (FastAPI builds it from the registered routes), so a route added later is
covered, or this test fails until it says how. Tenant routes must stay in the schema."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Tenant, record_capture, record_episode_turn

# Routes open to anyone: health probes for load balancers and Prometheus, and the objects
# behind signed download URLs (exported Tinker weights, session traces), whose URL is the credential (checked in
# tests/tinker_compat/test_checkpoint_lifecycle.py).
PUBLIC_ROUTES = {
    "/healthz",
    "/readyz",
    "/metrics",
    "/api/v1/healthz",
    "/api/v1/signed/{object_key}",
}
# Platform-wide catalogues, the same for every organization (read-only for tenants).
GLOBAL_ROUTES = {
    "/v1/base_models",
    "/v1/base_models/{name}",
    "/api/v1/get_server_capabilities",
    "/api/v1/client/config",
    "/api/v1/client/dynamic_config",
    "/api/v1/tokenizers/{base_model}",
    "/v1/prices",
}
# Routes about the caller itself; checked to answer with the caller's own organization.
SELF_ROUTES = {
    "/v1/organization",
    "/v1/organization/quotas",
    "/v1/organization/spend_limits",
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
    "/v1/models",
    "/api/v1/sessions",
    "/api/v1/training_runs",
    "/api/v1/checkpoints",
    "/api/v1/auth/apikey/me",
    "/v1/autotune",
    "/v1/webhooks",
    "/v1/reward_endpoints",
    "/v1/reviews/queues",
}
# Routes that name other resources by id in the query or the body, not the path; their
# tenancy (another organization's ids are 404) is checked in tests/evals/test_evals_api.py.
# Inference names its model in the body: another organization's adapter or deployment is a 404,
# checked in tests/serving/test_inference_api.py.
# An estimate names its files in the body as a create does: checked in tests/jobs/test_spend.py.
# Mining captures names its deployment in the body: checked in tests/serving/test_inference_api.py.
# Listing episodes names its deployment in the query: checked in tests/serving/test_episodes.py.
REFERENCE_ROUTES = {
    "/v1/episodes",
    "/v1/evals/compare",
    "/v1/datasets/from-failures",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/fine_tuning/jobs/estimate",
    "/v1/datasets/from-captures",
}
# Tinker-compatible routes that name their session, model, sampler, future or checkpoint in the
# body (as the tinker SDK sends them); another organization's are 404, checked with the SDK and
# over HTTP in tests/tinker_compat/test_isolation.py (with the protobuf routes, which are not in the
# OpenAPI document). Session search and copies are checked in tests/tinker_compat/test_projects.py.
TINKER_BODY_ROUTES = {
    f"/api/v1/{name}"
    for name in (
        "create_session",
        "session_heartbeat",
        "telemetry",
        "create_model",
        "get_info",
        "optim_step",
        "save_weights",
        "save_weights_for_sampler",
        "save_weights_external",
        "load_weights",
        "create_sampling_session",
        "asample",
        "cancel_future",
        "weights_info",
        "copy_weights",
        "sessions/search",
    )
}

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
    from mint.services.models.adapters import register_version
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


def _model_ref(client: TestClient, owner: Tenant) -> str:
    """An adapter version of the owner, as a model reference (`name@1`)."""
    from mint.config import get_settings
    from mint.storage.db import session_scope
    from mint.storage.tables import Adapter

    adapter_id = _adapter(client, owner)
    with session_scope(get_settings().database) as session:
        return f"{session.get(Adapter, adapter_id).name}@1"  # type: ignore[union-attr]


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


def _tinker_session(client: TestClient, owner: Tenant) -> str:
    response = client.post("/api/v1/create_session", headers=owner.headers("developer"), json={"tags": []})
    assert response.status_code == 200, response.text
    return str(response.json()["session_id"])


def _tinker_model(client: TestClient, owner: Tenant) -> str:
    """A Tinker training run with a saved state named `tenancy` (see `checkpoint_id` below). On a
    base whose queue no worker of the suite consumes, its creation stays pending."""
    from mint.config import get_settings
    from mint.storage.db import session_scope
    from mint.storage.tables import TinkerCheckpoint, new_id

    body = {"session_id": _tinker_session(client, owner), "model_seq_id": 0, "base_model": "tiny-qwen3-moe"}
    response = client.post("/api/v1/create_model", headers=owner.headers("developer"), json=body)
    assert response.status_code == 200, response.text
    model_id = str(response.json()["model_id"])
    with session_scope(get_settings().database) as session:
        session.add(
            TinkerCheckpoint(
                id=new_id("tkc"),
                organization_id=owner.organization_id,
                model_id=model_id,
                kind="training",
                name="tenancy",
                object_key=f"tinker/checkpoints/tenancy-{secrets.token_hex(4)}.tar",
                sha256="0" * 64,
                size_bytes=0,
            )
        )
    return model_id


def _capture(client: TestClient, owner: Tenant) -> str:
    """A captured completion of one of the owner's deployments."""
    return record_capture(owner, _deployment(client, owner), asked="hi", answered="hello")


def _episode(client: TestClient, owner: Tenant) -> str:
    """A recorded episode of one of the owner's deployments."""
    key = f"tenancy-{secrets.token_hex(4)}"
    record_episode_turn(
        owner, _deployment(client, owner), episode=key, messages=[{"role": "user", "content": "hi"}], answer="hello"
    )
    return key


def _tinker_sampler(client: TestClient, owner: Tenant) -> str:
    body = {"session_id": _tinker_session(client, owner), "sampling_session_seq_id": 0, "base_model": "tiny-glm-moe"}
    response = client.post("/api/v1/create_sampling_session", headers=owner.headers("developer"), json=body)
    assert response.status_code == 200, response.text
    return str(response.json()["sampling_session_id"])


def _autotune_run(client: TestClient, owner: Tenant) -> str:
    # No worker of this module consumes its ticks: the run stays queued.
    body = {"model": "tiny-qwen3-moe", "benchmark_id": _benchmark(client, owner), "target": {"pass_rate": 1.0}}
    response = client.post("/v1/autotune", headers=owner.headers("developer"), json={**body, "budget": {"usd": 1}})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


# The last webhook made for each organization: a delivery route names a webhook and one of its deliveries.
_LAST_WEBHOOK: dict[str, str] = {}


def _webhook(client: TestClient, owner: Tenant) -> str:
    body = {"url": "https://hooks.example.com/mint", "events": ["fine_tuning.job.succeeded"]}
    response = client.post("/v1/webhooks", headers=owner.headers("admin"), json=body)
    assert response.status_code == 201, response.text
    _LAST_WEBHOOK[owner.organization_id] = response.json()["id"]
    return str(response.json()["id"])


def _delivery(client: TestClient, owner: Tenant) -> str:
    webhook_id = _LAST_WEBHOOK[owner.organization_id]
    response = client.post(f"/v1/webhooks/{webhook_id}/test", headers=owner.headers("admin"))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _reward_endpoint(client: TestClient, owner: Tenant) -> str:
    body = {"name": f"reward-{secrets.token_hex(4)}", "url": "https://rewards.example.com/score"}
    response = client.post("/v1/reward_endpoints", headers=owner.headers("admin"), json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _review_queue(client: TestClient, owner: Tenant) -> str:
    """A review queue over one captured completion of one of the owner's deployments."""
    deployment = _deployment(client, owner)
    record_capture(owner, deployment, asked="hi", answered="hello")
    body = {"name": "tenancy", "deployment": deployment}
    response = client.post("/v1/reviews/queues", headers=owner.headers("developer"), json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _review_item(client: TestClient, owner: Tenant) -> str:
    queue_id = _review_queue(client, owner)
    response = client.get(f"/v1/reviews/queues/{queue_id}/items", headers=owner.headers("developer"))
    assert response.status_code == 200, response.text
    return str(response.json()["data"][0]["id"])


RESOURCE_MAKERS: dict[str, ResourceMaker] = {
    "queue_id": _review_queue,
    "item_id": _review_item,
    "endpoint_id": _reward_endpoint,
    "run_id": _autotune_run,
    "webhook_id": _webhook,
    "delivery_id": _delivery,
    "deployment_id": _deployment,
    "completion_id": _capture,
    "episode_id": _episode,
    "key_id": lambda client, owner: owner.key_ids["viewer"],
    "model": lambda client, owner: _model_ref(client, owner),
    "dataset_id": _dataset,
    "job_id": _job,
    "adapter_id": _adapter,
    "version": lambda client, owner: "1",
    "benchmark_id": _benchmark,
    "eval_id": _eval_run,
    "session_id": _tinker_session,
    "model_id": _tinker_model,
    "sampler_id": _tinker_sampler,
    # Every run `_tinker_model` makes has this checkpoint.
    "checkpoint_id": lambda client, owner: "weights/tenancy",
}


# Bodies for routes whose body has required fields (an empty one would be a 422 before the
# route could say 404).
ROUTE_BODIES: dict[str, dict[str, Any]] = {
    "/v1/adapters/{adapter_id}/versions/{version}/replay": {"model": "tiny-qwen3-moe"},
    "/api/v1/sessions/{session_id}/project": {"project_id": "tenancy"},
    "/v1/episodes/{episode_id}/reward": {"score": 1.0},
    "/v1/reviews/queues/{queue_id}/dataset": {"kind": "chat"},
    "/v1/reviews/items/{item_id}": {"assignee": None},
    "/v1/reviews/items/{item_id}/reviews": {"passed": True},
}


def api_routes(app) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    paths = app.openapi()["paths"]
    return [(method.upper(), path) for path, operations in sorted(paths.items()) for method in sorted(operations)]


def test_every_route_is_classified(app) -> None:  # type: ignore[no-untyped-def]
    for _method, path in api_routes(app):
        params = re.findall(r"{(\w+)}", path)
        if path in PUBLIC_ROUTES | GLOBAL_ROUTES | SELF_ROUTES | REFERENCE_ROUTES | TINKER_BODY_ROUTES:
            continue
        missing = [name for name in params if name not in RESOURCE_MAKERS]
        assert params and not missing, f"{path}: add its parameters to RESOURCE_MAKERS or classify the route"


def test_other_organization_gets_404_on_every_resource_route(
    app, client: TestClient, tenant: Tenant, other_tenant: Tenant
) -> None:  # type: ignore[no-untyped-def]
    checked = 0
    for method, path in api_routes(app):
        params = re.findall(r"{(\w+)}", path)
        if not params or path in GLOBAL_ROUTES | PUBLIC_ROUTES:
            continue
        url = path
        for name in params:
            url = url.replace("{" + name + "}", RESOURCE_MAKERS[name](client, tenant))
        body = ROUTE_BODIES.get(path, {})
        owner_sees = client.request(method, url, headers=tenant.headers("admin"), json=body)
        intruder = client.request(method, url, headers=other_tenant.headers("admin"), json=body)
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

"""Deployments over HTTP: create, promote, roll back, withdraw; every change a revision and
an audit-log entry; bad requests say what to fix.

Adapter versions are registered through the adapters service (jobs make them in real use;
the job tests cover that path) with small random archives: deployments only name them.
Gates are exercised with real eval runs in tests/test_loop.py; here, with eval runs recorded directly.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from mint.config import Settings
from mint.services.catalog import resolve_model_ref
from mint.services.models.adapters import register_version
from mint.storage.db import session_scope
from mint.storage.objects import object_store_for
from mint.storage.tables import Benchmark, BenchmarkVersion, EvalRun, Trajectory, new_id
from tests.conftest import Tenant, register_versions

_versions = register_versions


def _post(client: TestClient, tenant: Tenant, path: str, body: dict[str, Any]) -> Any:
    return client.post(path, headers=tenant.headers("developer"), json=body)


def test_promote_rollback_withdraw_each_make_a_revision(client: TestClient, tenant: Tenant, prepared: Settings) -> None:
    v1, v2, v3 = _versions(prepared, tenant, "support", 3)
    created = _post(client, tenant, "/v1/deployments", {"name": "support-prod", "model": v1, "reason": "first"})
    assert created.status_code == 201, created.text
    deployment = created.json()
    assert deployment["current_revision"] == 1 and deployment["serving"]["routing"]["model"] == v1
    path = f"/v1/deployments/{deployment['id']}"

    assert _post(client, tenant, f"{path}/promote", {"model": v2}).json()["serving"]["routing"]["model"] == v2
    assert _post(client, tenant, f"{path}/promote", {"model": v3}).json()["serving"]["routing"]["model"] == v3
    rolled = _post(client, tenant, f"{path}/rollback", {}).json()
    assert rolled["serving"]["routing"]["model"] == v2 and rolled["serving"]["action"] == "rollback"
    back_to_first = _post(client, tenant, "/v1/deployments/support-prod/rollback", {"to_revision": 1}).json()
    assert back_to_first["serving"]["routing"]["model"] == v1
    withdrawn = _post(client, tenant, f"{path}/withdraw", {"reason": "incident"}).json()
    assert withdrawn["status"] == "withdrawn"
    assert _post(client, tenant, f"{path}/withdraw", {}).status_code == 409
    again = _post(client, tenant, f"{path}/promote", {"model": v3}).json()
    assert again["status"] == "active" and again["current_revision"] == 7

    history = client.get(f"{path}/revisions", headers=tenant.headers("viewer")).json()
    assert [r["action"] for r in history] == [
        "promote",
        "withdraw",
        "rollback",
        "rollback",
        "promote",
        "promote",
        "create",
    ]
    audit = client.get("/v1/audit_log?limit=50", headers=tenant.headers("admin")).json()["data"]
    deployment_actions = [entry["action"] for entry in audit if entry["resource_id"] == deployment["id"]]
    assert len(deployment_actions) == 7 and "deployment.rollback" in deployment_actions


def test_bad_deployments_say_what_to_fix(client: TestClient, tenant: Tenant, prepared: Settings) -> None:
    (glm,) = _versions(prepared, tenant, "glm-line", 1)
    (qwen,) = _versions(prepared, tenant, "qwen-line", 1, base="tiny-qwen3-moe")
    cases = [
        ({"name": "a", "model": "tiny-glm-moe"}, 400, "is a base model"),
        ({"name": "b", "model": "nobody@1"}, 404, "no base model or adapter"),
        ({"name": "c"}, 400, "either `model`"),
        ({"name": "d", "model": glm, "mixture": {}}, 400, "either `model`"),
        ({"name": "bad@name", "model": glm}, 422, "name"),
        (
            {
                "name": "e",
                "mixture": {
                    "adapters": [glm, qwen],
                    "policy": {"type": "rules", "rules": [{"adapter": qwen, "keywords": ["x"]}], "default": glm},
                },
            },
            400,
            "one base model",
        ),
    ]
    for body, status, words in cases:
        response = _post(client, tenant, "/v1/deployments", body)
        assert response.status_code == status and words in response.text, (body, response.text)
    created = _post(client, tenant, "/v1/deployments", {"name": "glm-prod", "model": glm}).json()
    assert _post(client, tenant, "/v1/deployments", {"name": "glm-prod", "model": glm}).status_code == 409
    other_base = _post(client, tenant, f"/v1/deployments/{created['id']}/promote", {"model": qwen})
    assert other_base.status_code == 400 and "tiny-glm-moe" in other_base.text
    nothing_earlier = _post(client, tenant, f"/v1/deployments/{created['id']}/rollback", {})
    assert nothing_earlier.status_code == 409 and "no earlier revision" in nothing_earlier.text
    assert client.post("/v1/deployments", headers=tenant.headers("viewer"), json={"name": "v"}).status_code == 403


def test_a_mixture_deployment_records_its_routing(client: TestClient, tenant: Tenant, prepared: Settings) -> None:
    billing, shipping = _versions(prepared, tenant, "billing", 1) + _versions(prepared, tenant, "shipping", 1)
    mixture = {
        "adapters": [billing, shipping],
        "policy": {
            "type": "rules",
            "rules": [{"adapter": shipping, "keywords": ["parcel", "delivery"]}],
            "default": billing,
        },
    }
    response = _post(client, tenant, "/v1/deployments", {"name": "helpdesk", "mixture": mixture})
    assert response.status_code == 201, response.text
    deployment = response.json()
    assert deployment["kind"] == "mixture"
    assert set(deployment["serving"]["routing"]["versions"]) == {billing, shipping}
    single = _post(client, tenant, f"/v1/deployments/{deployment['id']}/promote", {"model": billing})
    assert single.status_code == 400 and "mixture deployment" in single.text


def _evaluated(
    settings: Settings,
    tenant: Tenant,
    ref: str,
    passed: list[bool],
    benchmark: str = "acks",
    *,
    mixture: dict[str, Any] | None = None,
) -> None:
    """Record a succeeded eval run of `ref` on version 1 of `benchmark`, one task per entry of
    `passed`; with `mixture` (a deployment's routing), a run of a deployment serving that mixture,
    which pins its policy and versions as `evaluated_model` does."""
    with session_scope(settings.database) as session:
        version_id = None if mixture else resolve_model_ref(session, tenant.organization_id, ref).adapter_version.id
        config: dict[str, Any] = {"benchmark_name": benchmark}
        if mixture is not None:
            pinned = {"spec": mixture["mixture"], "versions": {name: {"ref": name} for name in mixture["versions"]}}
            config["deployment"] = {"name": ref, "mixture": pinned}
        bench = session.execute(
            select(Benchmark).where(Benchmark.organization_id == tenant.organization_id, Benchmark.name == benchmark)
        ).scalar_one_or_none()
        if bench is None:
            bench = Benchmark(id=new_id("bench"), organization_id=tenant.organization_id, name=benchmark)
            session.add(bench)
            session.flush()
            bench_version = BenchmarkVersion(
                id=new_id("bmv"), benchmark_id=bench.id, version=1, object_key="k", sha256="0" * 64, task_count=0
            )
            session.add(bench_version)
            session.flush()
        bench_version = session.execute(
            select(BenchmarkVersion).where(BenchmarkVersion.benchmark_id == bench.id)
        ).scalar_one()
        run = EvalRun(
            id=new_id("eval"),
            organization_id=tenant.organization_id,
            benchmark_version_id=bench_version.id,
            model_ref=ref,
            adapter_version_id=version_id,
            status="succeeded",
            config=config,
        )
        session.add(run)
        session.flush()
        for index, ok in enumerate(passed):
            session.add(Trajectory(id=new_id("traj"), eval_run_id=run.id, task_id=f"t{index}", passed=ok))


def test_a_gate_holds_after_a_withdraw(client: TestClient, tenant: Tenant, prepared: Settings) -> None:
    good, regressed = _versions(prepared, tenant, "gated", 2)
    _evaluated(prepared, tenant, good, [True] * 40)
    _evaluated(prepared, tenant, regressed, [True] * 25 + [False] * 15)
    gate = {"benchmark": "acks", "min_pass_rate": 0.5, "max_regression": 0.02}
    created = _post(client, tenant, "/v1/deployments", {"name": "gated-prod", "model": good, "gate": gate})
    assert created.status_code == 201, created.text
    path = f"/v1/deployments/{created.json()['id']}"
    refused = _post(client, tenant, f"{path}/promote", {"model": regressed})
    assert refused.status_code == 409 and "against production" in refused.text

    # Withdrawing does not lift the regression checks: the version served last is the baseline.
    assert _post(client, tenant, f"{path}/withdraw", {"reason": "incident"}).status_code == 200
    bypass = _post(client, tenant, f"{path}/promote", {"model": regressed})
    assert bypass.status_code == 409, bypass.text
    verdict = bypass.json()["error"]["verdict"]
    assert verdict["passed"] is False and verdict["delta"] == pytest.approx(-15 / 40)
    assert {check["name"] for check in verdict["checks"] if not check["passed"]} == {
        "max_regression",
        "no_significant_regression",
    }
    audit = client.get("/v1/audit_log?limit=50", headers=tenant.headers("admin")).json()["data"]
    refusals = [entry for entry in audit if entry["action"] == "deployment.gate_refused"]
    assert len(refusals) == 2 and all(entry["data"]["gate"]["passed"] is False for entry in refusals)
    assert client.get(f"{path}", headers=tenant.headers("viewer")).json()["status"] == "withdrawn"

    # The good version may come back.
    again = _post(client, tenant, f"{path}/promote", {"model": good})
    assert again.status_code == 200 and again.json()["status"] == "active"


def test_a_gate_holds_a_mixtures_promotion_on_a_run_of_the_same_mixture(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    """A mixture is measured where it serves: a gated mixture deployment takes a new mixture
    only on an eval run of that very mixture (policy and versions), made on a staging
    deployment, and compares it with the run of the mixture in production."""
    billing, shipping = _versions(prepared, tenant, "bills", 1) + _versions(prepared, tenant, "parcels", 1)

    def mixture(default: str) -> dict[str, Any]:
        rules = [{"adapter": shipping if default == billing else billing, "keywords": ["parcel"]}]
        return {"adapters": [billing, shipping], "policy": {"type": "rules", "rules": rules, "default": default}}

    def staged(name: str, default: str) -> dict[str, Any]:
        created = _post(client, tenant, "/v1/deployments", {"name": name, "mixture": mixture(default)})
        assert created.status_code == 201, created.text
        return created.json()["serving"]["routing"]

    gate = {"benchmark": "desk", "min_pass_rate": 0.5, "max_regression": 0.02}
    first = staged("desk-staging-1", billing)
    unevaluated = _post(client, tenant, "/v1/deployments", {"name": "desk", "mixture": mixture(billing), "gate": gate})
    assert unevaluated.status_code == 409 and "a staging deployment" in unevaluated.text, unevaluated.text
    _evaluated(prepared, tenant, "desk-staging-1", [True] * 40, "desk", mixture=first)
    created = _post(client, tenant, "/v1/deployments", {"name": "desk", "mixture": mixture(billing), "gate": gate})
    assert created.status_code == 201, created.text
    path = f"/v1/deployments/{created.json()['id']}"

    second = staged("desk-staging-2", shipping)
    _evaluated(prepared, tenant, "desk-staging-2", [True] * 25 + [False] * 15, "desk", mixture=second)
    refused = _post(client, tenant, f"{path}/promote", {"mixture": mixture(shipping)})
    assert refused.status_code == 409 and "against production" in refused.text, refused.text
    verdict = refused.json()["error"]["verdict"]
    assert verdict["delta"] == pytest.approx(-15 / 40)
    # The mixture in production, promoted again, meets the gate on its own run.
    assert _post(client, tenant, f"{path}/promote", {"mixture": mixture(billing)}).status_code == 200


def test_versions_registered_at_once_are_numbered_one_after_another(prepared: Settings, tenant: Tenant) -> None:
    """Eight versions of one adapter registered by eight threads at once (jobs of one suffix
    finishing together): each gets its own number, none fails on the (adapter, version) key."""
    import threading

    _versions(prepared, tenant, "burst", 1)
    count = 8
    barrier = threading.Barrier(count)
    numbers: list[int] = []
    errors: list[BaseException] = []

    def register() -> None:
        try:
            with session_scope(prepared.database) as session:
                barrier.wait()
                version = register_version(
                    session,
                    object_store_for(prepared),
                    organization_id=tenant.organization_id,
                    name="burst",
                    base_model="tiny-glm-moe",
                    archive=secrets.token_bytes(128),
                    lora={"rank": 2, "alpha": 4.0},
                )
                session.commit()
                numbers.append(version.version)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=register) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert sorted(numbers) == list(range(2, count + 2))

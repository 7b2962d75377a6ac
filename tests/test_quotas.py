"""Per-organization quotas: live Tinker sessions, live Tinker training models (over all the
sessions), queued and running fine-tuning jobs, queued and running eval runs; and the share of
a base's LoRA slots one organization's models may take. A create over a quota is a 429 naming
the quota, the count and the command that raises it, and records nothing; another organization
is unaffected; operators set quotas with `mint admin orgs quota` (audited), and no key of an
organization can.

Jobs and runs here are on `tiny-qwen3-moe`, whose queue no worker of this suite consumes, so
they stay queued and count against the quota."""

from __future__ import annotations

import json
import secrets
import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from mint.config import Settings
from mint.errors import PermissionDenied
from mint.schemas import tinker as wire
from mint.services import auth
from mint.services.billing.quotas import QUOTA_RETRY_AFTER_S, QuotaDefaults, set_quotas
from mint.services.principal import Principal, operator
from mint.storage.db import session_scope
from mint.storage.tables import EvalRun, TinkerSession, TrainingJob, TrainingSession
from tests.conftest import TRAINING_BASE, Tenant
from tests.jobs.conftest import chat_rows, upload
from tests.test_cli import mint

IDLE_BASE = "tiny-qwen3-moe"


def set_quota(settings: Settings, tenant: Tenant, **changes: int | None) -> None:
    with session_scope(settings.database) as session:
        organization = auth.find_organization(session, tenant.organization_id)
        set_quotas(session, operator(organization.id), organization, changes)  # type: ignore[arg-type]


def count(settings: Settings, model: Any, tenant: Tenant) -> int:
    with session_scope(settings.database) as session:
        query = select(func.count()).select_from(model).where(model.organization_id == tenant.organization_id)
        return int(session.execute(query).scalar_one())


def assert_quota_refusal(response: Any, kind: str, used: int, tenant: Tenant, option: str) -> None:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["type"] == "quota_exceeded_error" and error["param"] == kind
    message = error["message"]
    assert f"has {used} " in message and f"{kind} quota is {used}" in message, message
    assert f"mint admin orgs quota {tenant.name} {option} N" in message, message
    assert response.headers["Retry-After"] == str(QUOTA_RETRY_AFTER_S)


def create_session(client: TestClient, tenant: Tenant) -> Any:
    return client.post("/api/v1/create_session", headers=tenant.headers("developer"), json={"tags": []})


def create_job(client: TestClient, tenant: Tenant, file_id: str) -> Any:
    body = {"model": IDLE_BASE, "training_file": file_id, "steps": 1}
    return client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body)


def benchmark(client: TestClient, tenant: Tenant) -> str:
    task = {"id": "t1", "messages": [{"role": "user", "content": "1+1?"}], "reference": "2"}
    body = {"name": f"quota-{secrets.token_hex(4)}", "format": "jsonl", "content": json.dumps(task)}
    response = client.post(
        "/v1/benchmarks", headers=tenant.headers("developer"), json={**body, "grader": {"type": "numeric"}}
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def create_eval(client: TestClient, tenant: Tenant, benchmark_id: str) -> Any:
    body = {"benchmark_id": benchmark_id, "model": IDLE_BASE}
    return client.post("/v1/evals", headers=tenant.headers("developer"), json=body)


# ---- each quota, enforced at create --------------------------------------------------------


def test_tinker_sessions_over_quota_are_refused_and_another_org_is_not(
    prepared: Settings, client: TestClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    set_quota(prepared, tenant, tinker_sessions=2)
    first = create_session(client, tenant).json()["session_id"]
    assert create_session(client, tenant).status_code == 200
    assert_quota_refusal(create_session(client, tenant), "tinker_sessions", 2, tenant, "--tinker-sessions")
    assert count(prepared, TinkerSession, tenant) == 2
    assert create_session(client, other_tenant).status_code == 200
    # A finished session is no longer live: its place is free again.
    finish = client.post(
        f"/api/v1/sessions/{first}/finish",
        headers=tenant.headers("developer"),
        json={"reason": {"type": "success"}},
    )
    assert finish.status_code == 200, finish.text
    assert create_session(client, tenant).status_code == 200


def test_jobs_over_quota_are_refused_and_another_org_is_not(
    prepared: Settings, client: TestClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    set_quota(prepared, tenant, jobs=1)
    file_id = upload(client, tenant, chat_rows(2))["id"]
    job = create_job(client, tenant, file_id)
    assert job.status_code == 200, job.text
    assert_quota_refusal(create_job(client, tenant, file_id), "jobs", 1, tenant, "--jobs")
    assert count(prepared, TrainingJob, tenant) == 1
    theirs = upload(client, other_tenant, chat_rows(2))["id"]
    assert create_job(client, other_tenant, theirs).status_code == 200
    # A cancelled job no longer counts.
    cancel = client.post(f"/v1/fine_tuning/jobs/{job.json()['id']}/cancel", headers=tenant.headers("developer"))
    assert cancel.status_code == 200, cancel.text
    assert create_job(client, tenant, file_id).status_code == 200


def test_eval_runs_over_quota_are_refused_and_another_org_is_not(
    prepared: Settings, client: TestClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    set_quota(prepared, tenant, eval_runs=1)
    benchmark_id = benchmark(client, tenant)
    run = create_eval(client, tenant, benchmark_id)
    assert run.status_code == 201, run.text
    assert_quota_refusal(create_eval(client, tenant, benchmark_id), "eval_runs", 1, tenant, "--eval-runs")
    assert count(prepared, EvalRun, tenant) == 1
    assert create_eval(client, other_tenant, benchmark(client, other_tenant)).status_code == 201
    cancel = client.post(f"/v1/evals/{run.json()['id']}/cancel", headers=tenant.headers("developer"))
    assert cancel.status_code == 200, cancel.text
    assert create_eval(client, tenant, benchmark_id).status_code == 201


def create_model(client: TestClient, tenant: Tenant, session_id: str, seq: int) -> Any:
    body = {"session_id": session_id, "model_seq_id": seq, "base_model": TRAINING_BASE, "lora_config": {"rank": 4}}
    return client.post("/api/v1/create_model", headers=tenant.headers("developer"), json=body)


def test_tinker_models_count_over_all_sessions_and_another_org_is_not_held_up(
    prepared: Settings, client: TestClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    """One session of an organization cannot hold more models (LoRA slots) than its quota, nor
    can it spread them over several sessions; a model sent again is answered, not counted."""
    set_quota(prepared, tenant, tinker_models=2)
    first, second = (create_session(client, tenant).json()["session_id"] for _ in range(2))
    assert create_model(client, tenant, first, 0).status_code == 200
    assert create_model(client, tenant, first, 1).status_code == 200
    assert create_model(client, tenant, first, 0).status_code == 200  # the same creation, sent again
    assert_quota_refusal(create_model(client, tenant, first, 2), "tinker_models", 2, tenant, "--tinker-models")
    assert_quota_refusal(create_model(client, tenant, second, 0), "tinker_models", 2, tenant, "--tinker-models")
    assert count(prepared, TrainingSession, tenant) == 2
    other = create_session(client, other_tenant).json()["session_id"]
    assert create_model(client, other_tenant, other, 0).status_code == 200


def test_one_organization_never_takes_the_slots_a_base_keeps_for_others(
    prepared: Settings, tenant: Tenant, other_tenant: Tenant
) -> None:
    """A base of 4 slots (one worker's) keeping 1: an organization whose quota would allow far
    more gets 3 models on it, then a 429 naming the base; another organization gets the last."""
    from mint.api.app import create_app
    from mint.worker.dispatch import CeleryDispatch

    shared = prepared.model_copy(
        update={"worker_max_sessions": 4, "tinker_reserved_slots": 1, "quota_tinker_models": 100}
    )
    with TestClient(create_app(shared, dispatch=CeleryDispatch(shared)), raise_server_exceptions=False) as client:
        greedy = create_session(client, tenant).json()["session_id"]
        for seq in range(3):
            assert create_model(client, tenant, greedy, seq).status_code == 200
        refused = create_model(client, tenant, greedy, 3)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["param"] == "base_model" and "holds 3 of its 4 LoRA slots" in error["message"], error
        assert "stay free for other organizations" in error["message"] and refused.headers["Retry-After"]
        other = create_session(client, other_tenant).json()["session_id"]
        assert create_model(client, other_tenant, other, 0).status_code == 200


def test_an_organization_without_its_own_quota_gets_the_platform_default(prepared: Settings, tenant: Tenant) -> None:
    from mint.api.app import create_app

    app = create_app(prepared.model_copy(update={"quota_tinker_sessions": 1}))
    with TestClient(app, raise_server_exceptions=False) as client:
        assert create_session(client, tenant).status_code == 200
        assert_quota_refusal(create_session(client, tenant), "tinker_sessions", 1, tenant, "--tinker-sessions")
        quotas = client.get("/v1/organization/quotas", headers=tenant.headers("viewer")).json()
    line = next(line for line in quotas["data"] if line["kind"] == "tinker_sessions")
    assert line == {**line, "limit": 1, "used": 1, "is_default": True}


def test_concurrent_creates_cannot_both_pass_the_count(prepared: Settings, tenant: Tenant) -> None:
    """Eight creates at once against a quota of one: the organization's row is locked while each
    counts and inserts, so exactly one passes."""
    from mint.errors import QuotaExceeded
    from mint.services.tinker import sessions as tinker

    set_quota(prepared, tenant, tinker_sessions=1)
    defaults = QuotaDefaults.of(prepared)
    start = threading.Barrier(8)
    outcomes: list[str] = []

    def create() -> None:
        start.wait()
        try:
            with session_scope(prepared.database) as session:
                tinker.create_session(
                    session, tenant.organization_id, wire.CreateSessionRequest(tags=[]), quotas=defaults
                )
            outcomes.append("created")
        except QuotaExceeded:
            outcomes.append("refused")

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["created"] + ["refused"] * 7
    assert count(prepared, TinkerSession, tenant) == 1


# ---- setting and showing quotas ------------------------------------------------------------


def test_admin_cli_shows_and_sets_quotas_with_usage_and_audit(
    prepared: Settings, client: TestClient, tenant: Tenant
) -> None:
    assert create_session(client, tenant).status_code == 200
    shown = json.loads(mint("admin", "orgs", "quota", tenant.name, "--json").stdout)
    lines = {line["kind"]: line for line in shown["data"]}
    assert lines["tinker_sessions"] == {
        **lines["tinker_sessions"],
        "used": 1,
        "limit": prepared.quota_tinker_sessions,
        "source": "default",
    }
    assert lines["jobs"]["limit"] == prepared.quota_jobs and lines["eval_runs"]["used"] == 0

    set_ = mint("admin", "orgs", "quota", tenant.organization_id, "--tinker-sessions", "1", "--jobs", "5", "--json")
    lines = {line["kind"]: line for line in json.loads(set_.stdout)["data"]}
    assert (lines["tinker_sessions"]["limit"], lines["tinker_sessions"]["source"]) == (1, "set")
    assert (lines["jobs"]["limit"], lines["eval_runs"]["source"]) == (5, "default")
    assert create_session(client, tenant).status_code == 429

    table = mint("admin", "orgs", "quota", tenant.name).stdout
    assert "tinker_sessions" in table and "set" in table

    back = mint("admin", "orgs", "quota", tenant.name, "--tinker-sessions", "default", "--json")
    lines = {line["kind"]: line for line in json.loads(back.stdout)["data"]}
    assert lines["tinker_sessions"]["source"] == "default"
    assert create_session(client, tenant).status_code == 200

    bad = mint("admin", "orgs", "quota", tenant.name, "--jobs", "lots", check=False)
    assert bad.returncode != 0 and "--jobs takes a number from 0 or `default`" in bad.stdout + bad.stderr
    too_many = mint("admin", "orgs", "quota", tenant.name, "--jobs", "1000000", check=False)
    assert too_many.returncode != 0 and "from 0 to 100000" in too_many.stdout + too_many.stderr

    audit = client.get("/v1/audit_log", headers=tenant.headers("admin"), params={"limit": 100}).json()["data"]
    changes = [entry["data"]["changes"] for entry in audit if entry["action"] == "organization.quota"]
    assert changes == [
        {"tinker_sessions": {"from": 1, "to": None}},
        {"tinker_sessions": {"from": None, "to": 1}, "jobs": {"from": None, "to": 5}},
    ]
    assert all(entry["actor"] == "operator" for entry in audit if entry["action"] == "organization.quota")


def test_no_key_of_the_organization_can_set_its_quotas(prepared: Settings, client: TestClient, tenant: Tenant) -> None:
    for role in ("admin", "developer", "viewer"):
        principal = Principal(tenant.organization_id, tenant.key_ids[role], role, f"{role} key")
        with session_scope(prepared.database) as session:
            organization = auth.find_organization(session, tenant.organization_id)
            with pytest.raises(PermissionDenied, match="mint admin orgs quota"):
                set_quotas(session, principal, organization, {"jobs": 1000})
    for method in ("POST", "PUT", "PATCH"):
        response = client.request(
            method, "/v1/organization/quotas", headers=tenant.headers("admin"), json={"jobs": 1000}
        )
        assert response.status_code == 405, (method, response.text)
    quotas = client.get("/v1/organization/quotas", headers=tenant.headers("viewer"))
    assert quotas.status_code == 200, quotas.text
    assert {line["kind"]: line["limit"] for line in quotas.json()["data"]}["jobs"] == prepared.quota_jobs


def test_sdk_raises_quota_exceeded_for_a_quota_429() -> None:
    from mint.sdk import QuotaExceededError, RateLimitError
    from mint.sdk.errors import error_from_body

    body = {"error": {"type": "quota_exceeded_error", "message": "Quota exceeded", "param": "jobs"}}
    error = error_from_body(429, body)
    assert isinstance(error, QuotaExceededError) and isinstance(error, RateLimitError)
    plain = error_from_body(429, {"error": {"type": "rate_limit_error", "message": "slow down"}})
    assert type(plain) is RateLimitError

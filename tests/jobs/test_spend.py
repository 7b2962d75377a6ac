"""Money: the price table, estimates before a job runs, cost recorded as it runs, and spend
limits enforced at create (402, nothing recorded) and while running (a checkpoint, then
`budget_exhausted`).

The jobs that must run do so on real `mint worker` processes (tiny-glm-moe); those that must
only be refused are on `tiny-qwen3-moe`, whose queue no worker of this suite consumes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from mint.config import Settings
from mint.services.billing.prices import (
    BASIS_MEASURED,
    BASIS_UNCALIBRATED,
    DEFAULT_OVERHEAD_S,
    DEFAULT_PRICES,
    DEFAULT_TOKENS_PER_SECOND,
    FEW_JOBS_SPREAD,
    UNCALIBRATED_TIME,
    set_prices,
)
from mint.services.billing.usage import record_usage
from mint.storage.db import session_scope
from mint.storage.tables import Checkpoint, TrainingJob, UsageRecord
from tests.conftest import Tenant, Workers, make_tenant, wait_for
from tests.jobs.conftest import BASE, chat_rows, upload
from tests.test_cli import mint

IDLE_BASE = "tiny-qwen3-moe"


def _estimate(client: TestClient, tenant: Tenant, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/fine_tuning/jobs/estimate", headers=tenant.headers("developer"), json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _jobs(settings: Settings, tenant: Tenant) -> int:
    with session_scope(settings.database) as session:
        query = (
            select(func.count()).select_from(TrainingJob).where(TrainingJob.organization_id == tenant.organization_id)
        )
        return int(session.execute(query).scalar_one())


def test_prices_come_from_the_table_and_price_usage_when_it_is_recorded(
    prepared: Settings, client: TestClient, tenant: Tenant
) -> None:
    listed = {
        line["base_model"]: line for line in client.get("/v1/prices", headers=tenant.headers("viewer")).json()["data"]
    }
    assert listed[BASE]["is_default"] is True
    assert listed[BASE]["usd_per_million_trained"] == DEFAULT_PRICES.trained

    shown = json.loads(mint("admin", "prices", "set", BASE, "--trained", "2.5", "--served", "1", "--json").stdout)
    assert shown[0] == {**shown[0], "trained": 2.5, "served": 1.0, "sampled": DEFAULT_PRICES.sampled, "source": "set"}
    listed = {
        line["base_model"]: line for line in client.get("/v1/prices", headers=tenant.headers("viewer")).json()["data"]
    }
    assert (listed[BASE]["usd_per_million_trained"], listed[BASE]["is_default"]) == (2.5, False)

    with session_scope(prepared.database) as session:
        record_usage(session, organization_id=tenant.organization_id, kind="trained", tokens=2_000_000,
                     base_model=BASE, model_ref="bot@1")  # fmt: skip
    # A later price does not reprice what was recorded.
    mint("admin", "prices", "set", BASE, "--trained", "10")
    usage = client.get("/v1/usage", headers=tenant.headers("viewer")).json()
    (line,) = [line for line in usage["data"] if line["kind"] == "trained"]
    assert line["cost_usd"] == pytest.approx(5.0) and usage["total_cost_usd"] == pytest.approx(5.0)

    mint("admin", "prices", "set", BASE, "--default")
    listed = {
        line["base_model"]: line for line in client.get("/v1/prices", headers=tenant.headers("viewer")).json()["data"]
    }
    assert listed[BASE]["is_default"] is True
    bad = mint("admin", "prices", "set", "no-such-base", "--trained", "1", check=False)
    assert bad.returncode != 0 and "no base model 'no-such-base'" in bad.stdout + bad.stderr
    with session_scope(prepared.database) as session, pytest.raises(Exception, match="a price is USD from 0"):
        set_prices(session, BASE, {"trained": 1e12})


def test_an_estimate_checks_the_request_as_a_create_does_and_records_nothing(
    prepared: Settings, client: TestClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    file = upload(client, tenant, chat_rows(16))
    body = {"model": IDLE_BASE, "training_file": file["id"], "steps": 10}
    estimate = _estimate(client, tenant, body)
    assert estimate["steps"] == 10 and estimate["calibrated_on"] == 0 and estimate["sampled_tokens"] == 0
    # Uncalibrated: steps x batch (8) x the file's bytes of assistant turns per row / 4.
    trained_bytes = file["validation_report"]["trained_bytes"]
    assert 16 * len(json.dumps(["OK 0", None])) == trained_bytes < file["size_bytes"] / 4
    assert estimate["trained_tokens"] == round(10 * 8 * trained_bytes / 16 / 4)
    assert estimate["cost_usd"] == pytest.approx(estimate["trained_tokens"] * DEFAULT_PRICES.trained / 1e6, abs=1e-6)
    assert estimate["allowed_usd"] is None and estimate["limited_by"] is None
    # A guess says so, with a wide range: x0.5..x20 of the time, the high end times the file's
    # bytes per trained byte (its prompts run too); x0.5..x2 of the tokens, and so of the cost.
    assert estimate["basis"] == BASIS_UNCALIBRATED
    seconds = DEFAULT_OVERHEAD_S + estimate["trained_tokens"] / DEFAULT_TOKENS_PER_SECOND
    assert estimate["seconds"] == pytest.approx(seconds, abs=0.1)
    assert estimate["seconds_low"] == pytest.approx(seconds * UNCALIBRATED_TIME[0], abs=0.1)
    work_ratio = file["size_bytes"] / trained_bytes
    assert estimate["seconds_high"] == pytest.approx(seconds * UNCALIBRATED_TIME[1] * work_ratio, abs=0.5)
    assert estimate["cost_usd_low"] < estimate["cost_usd"] < estimate["cost_usd_high"]
    assert estimate["cost_usd_high"] == pytest.approx(2 * estimate["cost_usd"], abs=1e-6)
    doubled = _estimate(client, tenant, {**body, "steps": 20})
    assert doubled["trained_tokens"] == pytest.approx(2 * estimate["trained_tokens"], abs=1)

    rl = _estimate(
        client,
        tenant,
        {"model": IDLE_BASE, "training_file": upload(client, tenant, [
            {"messages": [{"role": "user", "content": f"Say a {i}"}], "reference": "a"} for i in range(4)
        ])["id"], "steps": 3, "method": {"type": "reinforcement", "reinforcement": {
            "grader": {"type": "exact"}, "hyperparameters": {"group_size": 2, "max_tokens": 16}}}},
    )  # fmt: skip
    assert rl["sampled_tokens"] == 3 * 4 * 2 * 16 == rl["trained_tokens"]

    foreign = client.post("/v1/fine_tuning/jobs/estimate", headers=other_tenant.headers("developer"), json=body)
    assert foreign.status_code == 404, foreign.text
    wrong = client.post(
        "/v1/fine_tuning/jobs/estimate", headers=tenant.headers("developer"), json={**body, "model": "x"}
    )
    assert wrong.status_code == 400 and "no enabled base model 'x'" in wrong.json()["error"]["message"]
    assert _jobs(prepared, tenant) == 0


def test_spend_limits_refuse_a_job_over_them_at_create_and_record_nothing(
    prepared: Settings, client: TestClient, tenant: Tenant
) -> None:
    file = upload(client, tenant, chat_rows(16))
    body = {"model": IDLE_BASE, "training_file": file["id"], "steps": 10}
    cost = _estimate(client, tenant, body)["cost_usd"]

    denied = client.patch("/v1/organization/spend_limits", headers=tenant.headers("developer"), json={"job_usd": 1})
    assert denied.status_code == 403, denied.text
    limits = client.patch(
        "/v1/organization/spend_limits", headers=tenant.headers("admin"), json={"job_usd": cost / 2}
    ).json()
    assert limits["job_usd"] == pytest.approx(cost / 2) and limits["month_usd"] is None

    refused = client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body)
    assert refused.status_code == 402, refused.text
    error = refused.json()["error"]
    assert error["type"] == "spend_limit_exceeded_error" and error["param"] == "spend_limits"
    assert f"estimated at ${cost:.4f}" in error["message"] and f"${cost / 2:.4f}" in error["message"]
    assert "per-job spend limit" in error["message"] and "PATCH /v1/organization/spend_limits" in error["message"]
    assert _estimate(client, tenant, body)["allowed_usd"] == pytest.approx(cost / 2, abs=1e-6)
    assert _jobs(prepared, tenant) == 0

    # The job's own budget, under the organization's limits.
    client.patch("/v1/organization/spend_limits", headers=tenant.headers("admin"), json={"job_usd": None})
    over_budget = client.post(
        "/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json={**body, "budget_usd": cost * 0.9}
    )
    assert over_budget.status_code == 402 and over_budget.json()["error"]["param"] == "budget_usd"
    assert "the job's budget_usd" in over_budget.json()["error"]["message"]

    # The month's limit counts what was spent this month and what queued jobs are expected to cost.
    with session_scope(prepared.database) as session:
        record_usage(session, organization_id=tenant.organization_id, kind="served", tokens=1_000_000,
                     base_model=IDLE_BASE, model_ref="bot@1")  # fmt: skip
    spent = DEFAULT_PRICES.served
    client.patch(
        "/v1/organization/spend_limits", headers=tenant.headers("admin"), json={"month_usd": spent + cost * 1.5}
    )
    first = client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json={**body, "budget_usd": cost})
    assert first.status_code == 200, first.text
    assert first.json()["estimate"]["cost_usd"] == pytest.approx(cost) and first.json()["budget_usd"] == cost
    second = client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body)
    assert second.status_code == 402, second.text
    message = second.json()["error"]["message"]
    assert f"spent ${spent:.4f}" in message and f"estimated at ${cost:.4f} more" in message
    assert _jobs(prepared, tenant) == 1
    status = client.get("/v1/organization/spend_limits", headers=tenant.headers("viewer")).json()
    assert status["spent_this_month_usd"] == pytest.approx(spent)
    audit = client.get("/v1/audit_log", headers=tenant.headers("admin"), params={"limit": 100}).json()["data"]
    assert [e["data"]["changes"] for e in audit if e["action"] == "organization.spend_limits"][0] == {
        "month_usd": {"from": None, "to": spent + cost * 1.5}
    }


@pytest.mark.torch
@pytest.mark.long_run
def test_a_job_records_its_cost_calibrates_the_next_estimate_and_stops_at_a_limit_lowered_while_it_runs(
    prepared: Settings, client: TestClient, workers: Workers
) -> None:
    tenant = make_tenant(prepared)  # its own organization: the month's spend is this test's alone
    workers.start("spend")
    file = upload(client, tenant, chat_rows(8))
    body = {"model": BASE, "training_file": file["id"], "steps": 4}

    first = client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body).json()
    assert first["estimate"]["cost_usd"] > 0  # calibrated on whatever jobs of this base this suite ran before
    done = wait_for(lambda: (j := _job(client, tenant, first["id"]))["status"] == "succeeded" and j, "first job")
    with session_scope(prepared.database) as session:
        billed = session.execute(
            select(UsageRecord.kind, func.sum(UsageRecord.tokens), func.sum(UsageRecord.cost_usd))
            .where(UsageRecord.resource_id == first["id"])
            .group_by(UsageRecord.kind)
        ).all()
    assert [(kind, int(tokens)) for kind, tokens, _ in billed] == [("trained", done["trained_tokens"])]
    assert done["cost_usd"] > 0 and done["cost_usd"] == pytest.approx(billed[0][2], abs=1e-6)
    assert done["cost_usd"] == pytest.approx(done["trained_tokens"] * DEFAULT_PRICES.trained / 1e6, abs=1e-6)

    # Calibrated on that job (the only one on this file), the same request is estimated at what it used.
    again = _estimate(client, tenant, body)
    assert again["calibrated_on"] == 1 and again["trained_tokens"] == done["trained_tokens"]
    assert again["cost_usd"] == pytest.approx(done["cost_usd"], abs=1e-6)
    # ... and its range narrows, but one job is little evidence: at least x0.5..x2 until five jobs
    # on this file (then the spread of the jobs it rests on, never under x0.8..x1.25)
    assert again["basis"] == "calibrated on 1 finished job of this base and method"
    assert again["seconds_high"] == pytest.approx(FEW_JOBS_SPREAD * again["seconds"], abs=0.2)
    assert again["seconds_low"] == pytest.approx(again["seconds"] / FEW_JOBS_SPREAD, abs=0.2)
    assert again["cost_usd_low"] < again["cost_usd"] < again["cost_usd_high"]
    report = mint("admin", "estimates", "--json").stdout
    assert first["id"] in report

    # A job whose month limit is lowered while it runs checkpoints and stops before passing it.
    long = client.post(
        "/v1/fine_tuning/jobs",
        headers=tenant.headers("developer"),
        json={**body, "steps": 200, "checkpoint_interval": 1000},
    ).json()
    running = wait_for(lambda: (j := _job(client, tenant, long["id"]))["completed_steps"] >= 2 and j, "two steps")
    # its time left comes from its own steps once one finished
    assert running["eta_basis"] == BASIS_MEASURED and running["eta_s"] > 0 and running["elapsed_s"] > 0
    assert running["estimated_finish"] >= running["started_at"] + running["elapsed_s"] - 1
    spent = client.get("/v1/organization/spend_limits", headers=tenant.headers("viewer")).json()["spent_this_month_usd"]
    limit = spent + running["cost_usd"] * 3
    client.patch("/v1/organization/spend_limits", headers=tenant.headers("admin"), json={"month_usd": limit})
    stopped = wait_for(lambda: (j := _job(client, tenant, long["id"]))["status"] != "running" and j, "the stop")
    assert stopped["status"] == "failed" and stopped["error"]["code"] == "budget_exhausted", stopped
    assert "monthly spend limit" in stopped["error"]["message"]
    assert stopped["completed_steps"] < 200 and stopped["fine_tuned_model"] is None
    now = client.get("/v1/organization/spend_limits", headers=tenant.headers("viewer")).json()
    assert now["spent_this_month_usd"] <= limit + 1e-9  # every step costs the same: it stopped before passing
    assert now["spent_this_month_usd"] == pytest.approx(spent + stopped["cost_usd"], abs=1e-6)
    with session_scope(prepared.database) as session:
        kept = session.execute(select(Checkpoint.step).where(Checkpoint.job_id == long["id"])).scalars().all()
    assert kept == [stopped["completed_steps"]]


def _job(client: TestClient, tenant: Tenant, job_id: str) -> dict[str, Any]:
    return client.get(f"/v1/fine_tuning/jobs/{job_id}", headers=tenant.headers("viewer")).json()


def test_a_month_whose_limit_is_spent_refuses_new_eval_runs_and_tinker_sessions(
    prepared: Settings, client: TestClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    from tests.test_quotas import benchmark, create_eval, create_session

    benchmark_id = benchmark(client, tenant)
    assert create_eval(client, tenant, benchmark_id).status_code == 201
    with session_scope(prepared.database) as session:
        record_usage(session, organization_id=tenant.organization_id, kind="served", tokens=1_000_000,
                     base_model=IDLE_BASE, model_ref="bot@1")  # fmt: skip
    client.patch("/v1/organization/spend_limits", headers=tenant.headers("admin"), json={"month_usd": 0.1})
    for refused, what in ((create_eval(client, tenant, benchmark_id), "eval run"),
                          (create_session(client, tenant), "Tinker session")):  # fmt: skip
        assert refused.status_code == 402, refused.text
        message = refused.json()["error"]["message"]
        assert f"whole $0.1000 monthly spend limit, so no new {what} can start" in message
    assert create_session(client, other_tenant).status_code == 200
    client.patch("/v1/organization/spend_limits", headers=tenant.headers("admin"), json={"month_usd": None})
    assert create_eval(client, tenant, benchmark_id).status_code == 201

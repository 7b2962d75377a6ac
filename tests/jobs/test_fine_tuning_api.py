"""Fine-tuning jobs over HTTP, before any worker runs them: validation of the request and
its files, idempotent creation, listing, events and cancelling a queued job; and the same
through the official `openai` client on a real socket.

Jobs here are on `tiny-qwen3-moe`, whose queue no worker of this suite consumes, so they stay
queued (the tests that run jobs use `tiny-glm-moe`)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from mint.config import Settings
from mint.storage.db import session_scope
from mint.storage.tables import TrainingJob
from tests.conftest import LiveServer, Tenant
from tests.jobs.conftest import chat_rows, jsonl, preference_rows, prompt_rows, upload

IDLE_BASE = "tiny-qwen3-moe"


def _create(client: TestClient, tenant: Tenant, body: dict[str, Any], **headers: str) -> Any:
    return client.post("/v1/fine_tuning/jobs", headers={**tenant.headers("developer"), **headers}, json=body)


def test_create_queues_the_job_with_its_plan(client: TestClient, tenant: Tenant) -> None:
    file = upload(client, tenant, chat_rows(10))
    response = _create(
        client,
        tenant,
        {
            "model": IDLE_BASE,
            "training_file": file["id"],
            "suffix": "support-bot",
            "seed": 7,
            "method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 4, "n_epochs": 2}}},
            "lora": {"rank": 4},
        },
    )
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["object"] == "fine_tuning.job" and job["status"] == "queued"
    assert job["model"] == IDLE_BASE and job["training_file"] == file["id"] and job["seed"] == 7
    assert job["hyperparameters"] == {"batch_size": 4, "learning_rate_multiplier": 1.0, "n_epochs": 2}
    assert job["total_steps"] == 6 and job["lora"]["rank"] == 4 and job["fine_tuned_model"] is None
    assert isinstance(job["created_at"], int)
    events = client.get(f"/v1/fine_tuning/jobs/{job['id']}/events", headers=tenant.headers("viewer")).json()
    messages = [event["message"] for event in events["data"]]
    assert messages[0] == "Job enqueued" and messages[-1].startswith("Validating training file")
    assert client.get("/v1/fine_tuning/jobs", headers=tenant.headers("viewer")).json()["data"][0]["id"] == job["id"]


def test_bad_requests_say_what_to_fix(client: TestClient, tenant: Tenant, other_tenant: Tenant) -> None:
    chat = upload(client, tenant, chat_rows(3))
    prefs = upload(client, tenant, preference_rows(3))
    theirs = upload(client, other_tenant, chat_rows(3))
    cases = [
        ({"model": "no-such-base", "training_file": chat["id"]}, 400, "no enabled base model"),
        ({"model": IDLE_BASE, "training_file": theirs["id"]}, 404, "No dataset"),
        ({"model": IDLE_BASE, "training_file": prefs["id"]}, 400, "holds preference rows"),
        ({"model": IDLE_BASE, "training_file": chat["id"], "method": {"type": "dpo"}}, 400, "holds chat rows"),
        ({"model": IDLE_BASE, "training_file": chat["id"], "method": {"type": "reinforcement"}}, 400, "grader"),
        ({"model": IDLE_BASE, "training_file": chat["id"], "lora": {"rank": 0}}, 422, "rank"),
        ({"model": IDLE_BASE, "training_file": chat["id"], "suffix": "has space"}, 422, "suffix"),
        ({"model": IDLE_BASE, "training_file": chat["id"], "unknown_field": 1}, 422, "unknown_field"),
    ]
    for body, status, words in cases:
        response = _create(client, tenant, body)
        assert response.status_code == status, (body, response.text)
        assert words in response.text, (body, response.text)
    prompts = upload(client, tenant, prompt_rows(2))
    grader = {"type": "no-such-grader"}
    bad_grader = _create(
        client,
        tenant,
        {
            "model": IDLE_BASE,
            "training_file": prompts["id"],
            "method": {"type": "reinforcement", "reinforcement": {"grader": grader}},
        },
    )
    assert bad_grader.status_code == 400 and "unknown grader type" in bad_grader.text
    reinforcement = {"grader": {"type": "exact"}, "hyperparameters": {"loss_fn": "cispo", "loss_fn_config": {"x": 1}}}
    bad_loss = _create(
        client,
        tenant,
        {
            "model": IDLE_BASE,
            "training_file": prompts["id"],
            "method": {"type": "reinforcement", "reinforcement": reinforcement},
        },
    )
    assert bad_loss.status_code == 400 and "loss 'cispo' takes no config key x" in bad_loss.text, bad_loss.text


def test_idempotency_key_returns_the_first_job(client: TestClient, tenant: Tenant) -> None:
    file = upload(client, tenant, chat_rows(4))
    body = {"model": IDLE_BASE, "training_file": file["id"], "steps": 2}
    first = _create(client, tenant, body, **{"Idempotency-Key": "retry-1"}).json()
    second = _create(client, tenant, body, **{"Idempotency-Key": "retry-1"}).json()
    assert first["id"] == second["id"]
    other = _create(client, tenant, {**body, "steps": 3}, **{"Idempotency-Key": "retry-1"})
    assert other.status_code == 409 and "Idempotency-Key" in other.text


def test_cancel_a_queued_job(client: TestClient, tenant: Tenant) -> None:
    file = upload(client, tenant, chat_rows(4))
    job = _create(client, tenant, {"model": IDLE_BASE, "training_file": file["id"], "steps": 2}).json()
    cancelled = client.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel", headers=tenant.headers("developer")).json()
    assert cancelled["status"] == "cancelled" and cancelled["finished_at"] is not None
    again = client.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel", headers=tenant.headers("developer"))
    assert again.status_code == 409


def test_openai_client_fine_tuning_jobs(live_server: LiveServer, tenant: Tenant) -> None:
    from openai import NotFoundError, OpenAI

    client = OpenAI(base_url=f"{live_server.url}/v1", api_key=tenant.keys["developer"], max_retries=0)
    file = client.files.create(file=("prefs.jsonl", jsonl(preference_rows(4))), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=IDLE_BASE,
        training_file=file.id,
        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2, "batch_size": 2}}},
        suffix="prefs",
        seed=3,
        extra_body={"lora": {"rank": 2}, "steps": 3},
    )
    assert job.status == "queued" and job.method.type == "dpo" and job.seed == 3
    assert job.method.dpo.hyperparameters.beta == 0.2
    assert client.fine_tuning.jobs.retrieve(job.id).id == job.id
    assert job.id in [listed.id for listed in client.fine_tuning.jobs.list(limit=5)]
    events = client.fine_tuning.jobs.list_events(job.id, limit=2)
    assert len(events.data) == 2 and events.has_more and events.data[0].object == "fine_tuning.job.event"
    older = client.fine_tuning.jobs.list_events(job.id, after=events.data[-1].id, limit=10)
    assert older.data and all(int(e.id) < int(events.data[-1].id) for e in older.data)
    assert list(client.fine_tuning.jobs.checkpoints.list(job.id)) == []
    assert client.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    try:
        client.fine_tuning.jobs.retrieve("ftjob_missing")
    except NotFoundError as exc:
        assert "No fine-tuning job" in str(exc)
    else:
        raise AssertionError("a missing job was found")


def test_a_plan_the_request_leads_to_is_checked_at_create(client: TestClient, tenant: Tenant) -> None:
    """Fields each valid alone can resolve to a plan the checks refuse: the 400 names the plan's field."""
    file = upload(client, tenant, chat_rows(3))
    base = {"model": IDLE_BASE, "training_file": file["id"]}
    # Each value within its own range (a NaN or 1e12 epochs is a 422 of the schema: tests/test_bounds.py).
    supervised = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 10**6, "batch_size": 1}}}
    cases: list[tuple[dict[str, Any], str]] = [
        ({**base, "hyperparameters": {"learning_rate_multiplier": 1e4}}, "learning_rate"),  # 4e-4 * 1e4 > 1
        ({**base, "method": supervised}, "steps"),  # 3 steps per epoch * 10**6 epochs: more than 1,000,000 steps
    ]
    for body, field in cases:
        response = _create(client, tenant, body)
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["param"] == field and field in error["message"], error


def test_a_stored_plan_that_no_longer_validates_fails_the_job_on_the_worker(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    from mint.services.jobs.runner import run_job

    file = upload(client, tenant, chat_rows(4))
    created = _create(client, tenant, {"model": IDLE_BASE, "training_file": file["id"], "steps": 2}).json()
    with session_scope(prepared.database) as session:  # as a row written by another version could be
        row = session.get(TrainingJob, created["id"])
        assert row is not None and row.spec["plan"]["method"] == "sft"
        row.spec = {**row.spec, "plan": {**row.spec["plan"], "batch_size": 0}}

    def no_base(name: str) -> Any:
        raise AssertionError("a job whose plan is refused loads no base")

    assert run_job(prepared, created["id"], "worker-under-test", no_base) == "failed"
    job = client.get(f"/v1/fine_tuning/jobs/{created['id']}", headers=tenant.headers("viewer")).json()
    assert job["status"] == "failed" and job["error"]["code"] == "invalid_plan", job
    assert "plan batch_size" in job["error"]["message"] and job["attempts"] == 1
    # A second delivery of its message finds the job finished: no retry loop.
    assert run_job(prepared, created["id"], "worker-under-test", no_base) == "not-claimed"


def test_a_suffix_that_names_another_bases_adapter_is_refused_at_create(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    from mint.services.models.adapters import ensure_adapter

    with session_scope(prepared.database) as session:
        ensure_adapter(session, organization_id=tenant.organization_id, name="shared-name", base_model="tiny-glm-moe")
        session.commit()
    file = upload(client, tenant, chat_rows(4))
    body = {"model": IDLE_BASE, "training_file": file["id"], "steps": 2, "suffix": "shared-name"}
    refused = _create(client, tenant, body)
    assert refused.status_code == 409, refused.text
    assert "belongs to base 'tiny-glm-moe'" in refused.text and "choose another name" in refused.text
    with session_scope(prepared.database) as session:
        assert (
            session.query(TrainingJob).filter_by(organization_id=tenant.organization_id, suffix="shared-name").count()
            == 0
        )
    assert _create(client, tenant, {**body, "suffix": "own-name"}).status_code == 200


def test_a_reinforcement_job_takes_a_composite_grader_with_penalties(client: TestClient, tenant: Tenant) -> None:
    prompts = upload(client, tenant, prompt_rows(2))
    format_and_answer = {
        "type": "composite",
        "config": {
            "parts": [
                {"weight": 1, "grader": {"type": "regex", "config": {"pattern": r"ANSWER: \d+", "mode": "search"}}},
                {"weight": 3, "grader": {"type": "numeric", "config": {"abs_tol": 0.5, "partial_band": 5}}},
            ]
        },
        "penalties": {"token": 0.001, "free_tokens": 16},
    }

    def create(grader: dict[str, Any]) -> Any:
        method = {"type": "reinforcement", "reinforcement": {"grader": grader}}
        return _create(client, tenant, {"model": IDLE_BASE, "training_file": prompts["id"], "method": method})

    created = create(format_and_answer)
    assert created.status_code == 200, created.text
    stored = created.json()["method"]["reinforcement"]["grader"]
    assert stored["type"] == "composite" and stored["penalties"]["token"] == 0.001
    assert stored["config"]["parts"][1]["grader"]["config"]["partial_band"] == 5
    judged = {
        "type": "composite",
        "config": {"parts": [{"weight": 1, "grader": {"type": "judge", "config": {"rubric": "r"}}}]},
    }
    refused = create(judged)
    assert refused.status_code == 400 and "cannot score RL samples" in refused.text
    too_costly = create({"type": "exact", "penalties": {"token": 1.0}})
    assert too_costly.status_code == 400 and "penalties.token" in too_costly.text


def test_an_rl_jobs_environment_is_checked_at_create_and_at_upload(client: TestClient, tenant: Tenant) -> None:
    """A named environment must be registered in Mint's code: an unknown name is a 400 naming
    the registered ones, whether the job or a row names it; a job without grader needs one."""
    prompts = upload(client, tenant, prompt_rows(2))

    def reinforcement(section: dict[str, Any]) -> Any:
        method = {"type": "reinforcement", "reinforcement": section}
        return _create(client, tenant, {"model": IDLE_BASE, "training_file": prompts["id"], "method": method})

    unknown = reinforcement({"environment": {"name": "no-such-env"}})
    assert unknown.status_code == 400, unknown.text
    error = unknown.json()["error"]
    assert error["param"] == "method.reinforcement.environment.name", error
    assert (
        "no environment is registered as 'no-such-env'" in error["message"] and "account_deletion" in error["message"]
    )
    neither = reinforcement({"hyperparameters": {"max_turns": 3}})
    assert neither.status_code == 400 and "unless method.reinforcement.environment" in neither.text
    too_many = reinforcement({"environment": {"name": "account_deletion"}, "hyperparameters": {"max_turns": 33}})
    assert too_many.status_code == 422 and "max_turns" in too_many.text

    created = reinforcement({"environment": {"name": "account_deletion"}, "hyperparameters": {"max_turns": 3}})
    assert created.status_code == 200, created.text
    section = created.json()["method"]["reinforcement"]
    assert section["environment"] == {"name": "account_deletion", "config": {}} and section["grader"] is None
    assert section["hyperparameters"]["max_turns"] == 3

    rows = [{"messages": [{"role": "user", "content": "hi"}], "environment": {"name": "no-such-env"}}]
    refused = client.post(
        "/v1/datasets",
        headers=tenant.headers("developer"),
        files={"file": ("rl.jsonl", jsonl(rows), "application/jsonl")},
    )
    assert refused.status_code == 400 and "line 1: environment.name: no environment is registered" in refused.text

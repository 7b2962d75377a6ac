"""Crash safety with real processes: a worker killed with SIGKILL in the middle of a job, and
a Redis broker restarted (losing every queued message) while jobs wait.

The database row is the truth; the reconciler (run by `mint beat` every second here, with
3-second leases) queues again a job whose worker stopped renewing its lease, and re-sends a
queued job whose message the broker no longer holds.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mint.config import Settings
from tests.conftest import Tenant, Workers, free_port, poisoned, reconcile_after, wait_for
from tests.jobs.conftest import BASE, chat_rows, upload
from tests.jobs.resumes import adapter_weights, assert_same_adapter, event_messages, job_of, succeeded

pytestmark = pytest.mark.torch


def test_sigkilled_worker_job_resumes_from_its_checkpoint_with_no_step_lost_or_doubled(
    client: TestClient, tenant: Tenant, workers: Workers
) -> None:
    file = upload(client, tenant, chat_rows(12))
    body = {
        "model": BASE,
        "training_file": file["id"],
        "seed": 5,
        "steps": 16,
        "checkpoint_interval": 4,
        "learning_rate": 5e-3,
        "method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 4}}},
    }
    victim = workers.start("victim")
    workers.beat()
    resumed = client.post(
        "/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json={**body, "suffix": "resumed"}
    ).json()
    wait_for(lambda: job_of(client, tenant, resumed["id"])["completed_steps"] >= 6, "six steps before the kill")
    victim.kill()
    victim.wait()
    at_kill = job_of(client, tenant, resumed["id"])
    assert at_kill["status"] == "running" and at_kill["completed_steps"] < 16

    workers.start("rescuer")
    job = succeeded(client, tenant, resumed["id"])
    assert job["attempts"] == 2 and job["completed_steps"] == 16
    redone = at_kill["completed_steps"] % 4
    assert job["steps_redone"] == redone, (job, at_kill)
    messages = event_messages(client, tenant, job["id"])
    assert any("stopped renewing the job's lease" in message for message in messages)
    assert any(f"Resuming from checkpoint at step {at_kill['completed_steps'] - redone}" in m for m in messages)

    # The same job, never interrupted, gives the very same adapter: every step ran once.
    control = client.post(
        "/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json={**body, "suffix": "uninterrupted"}
    ).json()
    uninterrupted = succeeded(client, tenant, control["id"])
    assert uninterrupted["attempts"] == 1 and uninterrupted["steps_redone"] == 0
    assert_same_adapter(adapter_weights(client, tenant, job), adapter_weights(client, tenant, uninterrupted))


@pytest.fixture
def own_redis() -> Iterator[tuple[str, Any]]:
    """A Redis server of this test's own (no persistence), and a function that restarts it empty."""
    port = free_port()
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    state = {"process": subprocess.Popen(command, stdout=subprocess.DEVNULL)}

    def ping() -> bool:
        import redis

        try:
            return bool(redis.Redis(port=port).ping())
        except redis.ConnectionError:
            return False

    def restart() -> None:
        state["process"].kill()
        state["process"].wait()
        state["process"] = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        wait_for(ping, "redis to restart", timeout=30)

    wait_for(ping, "redis to start", timeout=30)
    try:
        yield f"redis://127.0.0.1:{port}/0", restart
    finally:
        state["process"].kill()
        state["process"].wait()


def test_jobs_queued_when_redis_restarts_are_not_lost(
    prepared: Settings, tenant: Tenant, workers: Workers, own_redis: tuple[str, Any]
) -> None:
    from mint.api.app import create_app
    from mint.worker.dispatch import CeleryDispatch

    broker, restart = own_redis
    import redis

    settings = prepared.model_copy(update={"broker_url": broker})
    with TestClient(create_app(settings, dispatch=CeleryDispatch(settings))) as client:
        file = upload(client, tenant, chat_rows(6))
        ids = [
            client.post(
                "/v1/fine_tuning/jobs",
                headers=tenant.headers("developer"),
                json={"model": BASE, "training_file": file["id"], "steps": 2, "suffix": f"after-restart-{n}"},
            ).json()["id"]
            for n in range(2)
        ]
        assert redis.Redis.from_url(broker).llen(f"train.{BASE}") == 2
        restart()
        assert redis.Redis.from_url(broker).llen(f"train.{BASE}") == 0

        env = {"MINT_BROKER_URL": broker, "MINT_RESULT_BACKEND_URL": broker}
        workers.start("after-restart", env=env)
        workers.beat(env=env)
        for job_id in ids:
            job = succeeded(client, tenant, job_id)
            assert job["attempts"] == 1
            assert "The job's queue message was lost; sent again" in event_messages(client, tenant, job_id)


def test_a_job_out_of_attempts_fails_with_its_last_error(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    """A poison job (its worker dies at every attempt) is not queued again once it has had
    `max_attempts` claims: the reconciler or the next claim fails it with its last error."""
    from mint.services.jobs.runner import run_job
    from mint.storage.tables import TrainingJob

    file = upload(client, tenant, chat_rows(6))
    body = {"model": BASE, "training_file": file["id"], "steps": 2}
    dead, poison, redelivered = (
        client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body).json()["id"]
        for _ in range(3)
    )
    cap = prepared.max_attempts
    report, sent = reconcile_after(prepared, TrainingJob, poisoned(dead, poison, redelivered, cap))
    assert {dead, poison} <= set(report.gave_up) and not {dead, poison} & {job_id for _task, (job_id,) in sent}
    assert dead not in report.requeued_lost_workers and poison not in report.resent_lost_messages
    assert (job := job_of(client, tenant, dead))["status"] == "failed"
    message = f"gave up after {cap} attempts: worker w-dead stopped renewing the lease (killed, out of memory, or lost)"
    assert job["error"]["message"] == message and f"Job failed: {message}" in event_messages(client, tenant, dead)
    assert (job := job_of(client, tenant, poison))["status"] == "failed"
    assert job["error"]["message"].startswith("gave up after 500 attempts: the worker of the last attempt stopped")

    def no_base(name: str) -> Any:
        raise AssertionError("a job out of attempts must not load a model")

    # A message still in the broker for a job at the cap: the claim fails it instead.
    assert run_job(prepared, redelivered, "w-next", no_base) == "failed"
    assert (job := job_of(client, tenant, redelivered))["status"] == "failed" and job["attempts"] == cap
    assert job["error"]["message"].startswith(f"gave up after {cap} attempts")

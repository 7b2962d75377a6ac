"""`mint admin queues` and `mint admin jobs list | requeue | reconcile`, in real subprocesses
against the session's database and broker (no worker consumes `train.tiny-qwen3-moe`)."""

from __future__ import annotations

import json
import os
from typing import Any

from fastapi.testclient import TestClient

from mint.config import Settings
from mint.worker.app import create_celery
from tests.conftest import Tenant
from tests.jobs.conftest import chat_rows, upload
from tests.test_cli import mint

IDLE_QUEUE = "train.tiny-qwen3-moe"


def _queued_job(client: TestClient, tenant: Tenant) -> dict[str, Any]:
    file = upload(client, tenant, chat_rows(2))
    body = {"model": "tiny-qwen3-moe", "training_file": file["id"], "steps": 1}
    return client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body).json()


def _waiting(queue: str) -> int:
    rows = json.loads(mint("admin", "queues", "--json").stdout)
    return next(row["waiting"] for row in rows if row["queue"] == queue)


def test_queues_show_depths_and_requeue_sends_a_new_message(
    prepared: Settings, client: TestClient, tenant: Tenant
) -> None:
    before = _waiting(IDLE_QUEUE)
    job = _queued_job(client, tenant)
    assert _waiting(IDLE_QUEUE) == before + 1
    listed = json.loads(mint("admin", "jobs", "list", "--status", "queued", "--json").stdout)
    assert job["id"] in {row["id"] for row in listed}

    requeued = json.loads(mint("admin", "jobs", "requeue", job["id"], "--json").stdout)
    assert requeued["status"] == "queued" and requeued["task_id"].startswith(job["id"])
    assert _waiting(IDLE_QUEUE) == before + 2  # the old message stays; the claim makes it harmless

    client.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel", headers=tenant.headers())
    refused = mint("admin", "jobs", "requeue", job["id"], check=False)
    assert refused.returncode == 5 and "cancelled" in refused.stderr
    missing = mint("admin", "jobs", "requeue", "ftjob_missing", check=False)
    assert missing.returncode == 3


def test_reconcile_resends_a_queued_job_whose_message_was_lost(
    prepared: Settings, client: TestClient, tenant: Tenant
) -> None:
    job = _queued_job(client, tenant)
    with create_celery(prepared).connection_for_write() as connection:
        connection.default_channel.queue_purge(IDLE_QUEUE)
    assert _waiting(IDLE_QUEUE) == 0
    env = {**os.environ, "MINT_REQUEUE_GRACE_S": "0"}
    report = json.loads(mint("admin", "jobs", "reconcile", "--json", env=env).stdout)
    assert job["id"] in report["resent_lost_messages"]
    assert _waiting(IDLE_QUEUE) >= 1
    again = json.loads(mint("admin", "jobs", "reconcile", "--json", env=env).stdout)
    assert job["id"] not in again["resent_lost_messages"]  # its new message is there now

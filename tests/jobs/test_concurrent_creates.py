"""Twin requests at once: a create retried with the same `Idempotency-Key`, or the same file
uploaded twice, while the first is still being recorded. Both check, find nothing, and insert;
the unique constraint refuses the second, which then answers with the first's row, never 500.

The deterministic tests commit the twin from a second session at the one moment that matters:
right after the request's own lookup found nothing, before it takes any lock or writes (an
`after_cursor_execute` hook on that lookup times it). The HTTP tests send real concurrent
requests to the API on a socket."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, func, select

from mint.config import Settings
from mint.storage.db import session_scope
from mint.storage.keys import dataset_key
from mint.storage.tables import Dataset, TrainingJob, new_id
from tests.conftest import LiveServer, Tenant
from tests.jobs.conftest import chat_rows, jsonl, upload

IDLE_BASE = "tiny-qwen3-moe"


@contextmanager
def twin_committed_after_lookup(
    settings: Settings, table: str, marker: str, twin: Callable[[], Any]
) -> Iterator[list[str]]:
    """Once a SELECT on `table` whose parameters hold `marker` has run (the request's lookup,
    which found nothing), commit the row `twin()` makes from another session: the twin request
    that got there first. Yields the twin's id."""
    twins: list[str] = []

    def commit_twin(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        lookup = statement.lstrip().upper().startswith("SELECT") and f"FROM {table}" in statement
        if twins or not lookup or marker not in repr(parameters):
            return
        row = twin()
        twins.append(row.id)  # before the twin's own statements, which this hook sees too
        with session_scope(settings.database) as other:
            other.add(row)
            other.commit()

    event.listen(Engine, "after_cursor_execute", commit_twin)
    try:
        yield twins
    finally:
        event.remove(Engine, "after_cursor_execute", commit_twin)


def _count(settings: Settings, query: Any) -> int:
    with session_scope(settings.database) as session:
        return session.execute(query).scalar_one()


def test_a_create_whose_retry_was_recorded_first_returns_that_job(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    file = upload(client, tenant, chat_rows(4))
    body = {"model": IDLE_BASE, "training_file": file["id"], "steps": 2}
    developer = tenant.headers("developer")
    # The same request under another key: the job the twin would have recorded, to copy.
    template = client.post("/v1/fine_tuning/jobs", json=body, headers=developer | {"Idempotency-Key": "template-1"})
    assert template.status_code == 200, template.text

    def twin() -> TrainingJob:
        with session_scope(prepared.database) as session:
            row = session.get(TrainingJob, template.json()["id"])
            assert row is not None
            columns = {c.key: getattr(row, c.key) for c in TrainingJob.__table__.columns if c.key != "id"}
        return TrainingJob(**(columns | {"id": new_id("ftjob"), "idempotency_key": "twin-1"}))

    with twin_committed_after_lookup(prepared, "training_jobs", "twin-1", twin) as twins:
        response = client.post("/v1/fine_tuning/jobs", json=body, headers=developer | {"Idempotency-Key": "twin-1"})
    assert response.status_code == 200, response.text
    assert twins and response.json()["id"] == twins[0]
    keyed = select(func.count()).select_from(TrainingJob).where(TrainingJob.idempotency_key == "twin-1")
    assert _count(prepared, keyed) == 1


def test_an_upload_whose_twin_was_recorded_first_returns_that_dataset(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    content = jsonl(chat_rows(9))
    sha256 = hashlib.sha256(content).hexdigest()

    def twin() -> Dataset:
        return Dataset(
            id=new_id("file"),
            organization_id=tenant.organization_id,
            filename="twin.jsonl",
            purpose="fine-tune",
            kind="chat",
            status="ready",
            object_key=dataset_key(sha256),
            sha256=sha256,
            size_bytes=len(content),
            row_count=9,
            validation_report={"rows": 9, "errors": []},
        )

    with twin_committed_after_lookup(prepared, "datasets", sha256, twin) as twins:
        response = client.post(
            "/v1/datasets",
            headers=tenant.headers("developer"),
            files={"file": ("twin.jsonl", content, "application/jsonl")},
        )
    assert response.status_code == 201, response.text
    assert twins and response.json()["id"] == twins[0]
    same = select(func.count()).select_from(Dataset).where(Dataset.sha256 == sha256)
    assert _count(prepared, same) == 1


def _at_once(count: int, send: Callable[[httpx.Client], httpx.Response], url: str) -> list[httpx.Response]:
    barrier = threading.Barrier(count)
    answers: list[httpx.Response] = []

    def run() -> None:
        with httpx.Client(base_url=url, timeout=120) as api:
            barrier.wait()
            answers.append(send(api))

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_concurrent_retries_with_one_idempotency_key_make_one_job(
    client: TestClient, live_server: LiveServer, tenant: Tenant, prepared: Settings
) -> None:
    file = upload(client, tenant, chat_rows(4))
    body = {"model": IDLE_BASE, "training_file": file["id"], "steps": 2}
    headers = tenant.headers("developer") | {"Idempotency-Key": "burst-1"}
    answers = _at_once(8, lambda api: api.post("/v1/fine_tuning/jobs", json=body, headers=headers), live_server.url)
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers if a.status_code != 200]
    assert len({a.json()["id"] for a in answers}) == 1
    keyed = select(func.count()).select_from(TrainingJob).where(TrainingJob.idempotency_key == "burst-1")
    assert _count(prepared, keyed) == 1


def test_concurrent_identical_uploads_make_one_dataset(
    live_server: LiveServer, tenant: Tenant, prepared: Settings
) -> None:
    content = jsonl(chat_rows(11))

    def send(api: httpx.Client) -> httpx.Response:
        files = {"file": ("same.jsonl", content, "application/jsonl")}
        return api.post("/v1/datasets", headers=tenant.headers("developer"), files=files)

    answers = _at_once(8, send, live_server.url)
    assert [a.status_code for a in answers] == [201] * 8, [a.text for a in answers if a.status_code != 201]
    assert len({a.json()["id"] for a in answers}) == 1

"""Celery on the session's broker (embedded SQLite or Redis), with a real worker process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from kombu.exceptions import EncodeError

from mint.config import Settings
from mint.services.workers import list_workers
from mint.storage.db import session_scope
from mint.worker.app import create_celery
from mint.worker.queues import EVALS_QUEUE, SERVING_QUEUE, SYSTEM_QUEUE, training_queue
from tests.conftest import wait_for

WAIT_S = 90.0


@pytest.fixture
def worker(prepared: Settings) -> Iterator[subprocess.Popen[bytes]]:
    queues = f"{training_queue('tiny-glm-moe')},{EVALS_QUEUE}"
    process = subprocess.Popen(
        [sys.executable, "-m", "mint", "worker", "--queues", queues, "--name", "test-worker@%h"],
        env=os.environ.copy(),
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def _registered(settings: Settings) -> list[str]:
    with session_scope(settings.database) as session:
        return [w.id for w in list_workers(session) if w.id.startswith("test-worker@")]


def test_app_configuration_follows_settings(prepared: Settings) -> None:
    app = create_celery(prepared)
    assert app.conf.task_serializer == "json" and app.conf.accept_content == ["json"]
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost
    if prepared.broker.startswith("redis://"):
        assert app.conf.broker_transport_options["visibility_timeout"] == prepared.visibility_timeout_s
    queues = {queue.name for queue in app.conf.task_queues}
    assert {
        training_queue("tiny-glm-moe"),
        training_queue("smollm2-135m-instruct"),
        EVALS_QUEUE,
        SERVING_QUEUE,
        SYSTEM_QUEUE,
    } <= queues
    assert app.conf.broker_url == prepared.broker


def test_payloads_must_be_json(prepared: Settings) -> None:
    app = create_celery(prepared)
    with pytest.raises(EncodeError):
        app.send_task("mint.system.ping", args=[object()], queue=EVALS_QUEUE)


def test_worker_consumes_its_queues_and_registers(prepared: Settings, worker: subprocess.Popen[bytes]) -> None:
    worker_id = wait_for(lambda: _registered(prepared), "the worker to register")[0]
    app = create_celery(prepared)
    for queue in (training_queue("tiny-glm-moe"), EVALS_QUEUE):
        probe = str(uuid.uuid4())
        answer = app.send_task("mint.system.ping", args=[probe], queue=queue).get(timeout=WAIT_S)
        assert answer["probe_id"] == probe and answer["worker_id"] == worker_id
        assert answer["pid"] == worker.pid

    with session_scope(prepared.database) as session:
        row = next(w for w in list_workers(session) if w.id == worker_id)
        assert row.base_model == "tiny-glm-moe"
        assert row.queues == sorted([training_queue("tiny-glm-moe"), EVALS_QUEUE, SYSTEM_QUEUE])

    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    assert _registered(prepared) == []

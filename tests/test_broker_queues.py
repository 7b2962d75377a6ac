"""Queues of kombu's SQL transport made before processes share them: processes declaring the same
queues at once on a fresh broker all succeed, each queue has one row, and a process declares
them before its first send."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import sqlalchemy as sa

from mint.storage.broker import declare_sql_queues
from mint.worker.queues import SYSTEM_QUEUE

pytestmark = pytest.mark.backend_free

NAMES = [f"train.base-{index}" for index in range(24)]


def _declare(url: str, start: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    start.wait()
    declare_sql_queues(url, NAMES)


def test_processes_declaring_the_same_queues_at_once_all_succeed(tmp_path: Path) -> None:
    url = f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    declare_sql_queues(url, [])  # kombu makes its tables; the queues are still to be made
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    processes = [context.Process(target=_declare, args=(url, start)) for _ in range(6)]
    for process in processes:
        process.start()
    start.set()
    for process in processes:
        process.join(timeout=120)
    assert [process.exitcode for process in processes] == [0] * len(processes)
    engine = sa.create_engine(url.removeprefix("sqla+"))
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT name, count(*) FROM kombu_queue GROUP BY name")).all()
    engine.dispose()
    assert sorted(rows) == sorted((name, 1) for name in NAMES)


def test_a_process_declares_the_shared_queues_before_its_first_send(tmp_path: Path) -> None:
    """An API process's first send can race a starting worker's declaring on a fresh embedded
    broker, and kombu's publish would create the queue by a check then an insert that fails on
    the unique name when the worker inserted in between. So the app a process sends with is made
    with every shared queue declared (`declare_sql_queues`, which survives that race) before it
    publishes anything."""
    from mint.config import Settings
    from mint.schemas.base_models import enabled_base_names
    from mint.worker.app import celery_for
    from mint.worker.queues import all_queues

    home = tmp_path / "home"
    settings = Settings(
        home=home, broker_url=f"sqla+sqlite:///{home}/broker.db", result_backend_url=f"db+sqlite:///{home}/r.db"
    )
    celery_for(settings)
    engine = sa.create_engine(f"sqlite:///{home}/broker.db")
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT name, count(*) FROM kombu_queue GROUP BY name")).all()
    engine.dispose()
    shared = all_queues(enabled_base_names(settings.model_configs_dir))
    assert SYSTEM_QUEUE in shared and sorted(rows) == sorted((name, 1) for name in shared)


def test_other_brokers_need_no_declaring() -> None:
    declare_sql_queues("redis://127.0.0.1:1/0", NAMES)  # returns without connecting anywhere

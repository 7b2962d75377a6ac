"""Queues of kombu's SQL transport made before workers share them: processes declaring the same
queues at once on a fresh broker all succeed, and each queue has one row."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import sqlalchemy as sa

from mint.storage.broker import declare_sql_queues

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


def test_other_brokers_need_no_declaring() -> None:
    declare_sql_queues("redis://127.0.0.1:1/0", NAMES)  # returns without connecting anywhere

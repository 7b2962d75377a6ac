"""Looking inside the broker: queue depths, and which task messages a queue still holds.

Celery has no portable way to ask whether a given message is still queued, and Mint needs
it twice: `mint admin queues` shows depths, and the reconciler tells a queued job whose
message is waiting from one whose message the broker lost (a Redis restart without
persistence, a worker of the embedded broker killed after taking it). Both transports
Mint runs on are read directly, read-only:

- Redis (kombu's layout): a queue is a list of JSON messages under the queue's name;
  messages taken but not acknowledged are kept in the `unacked` hash.
- kombu's SQLAlchemy transport (the embedded default): rows of `kombu_message` joined to
  `kombu_queue`; a taken message stays as an invisible row until it is acknowledged.

Any other broker answers `None` (unknown), and callers fall back to a time-based rule.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from mint.config import Settings

REDIS_SCHEMES = ("redis://", "rediss://")
SQLA_PREFIX = "sqla+"
UNACKED_KEY = "unacked"


@dataclass(frozen=True)
class QueueState:
    """Messages waiting in a queue, and the task ids of those waiting or taken but not acknowledged."""

    waiting: int
    task_ids: frozenset[str]


def _task_id(message: dict[str, Any]) -> str | None:
    headers = message.get("headers") or {}
    return headers.get("id") or (message.get("properties") or {}).get("correlation_id")


def declare_sql_queues(url: str, names: list[str], *, attempts: int = 3) -> None:
    """Create kombu's tables and the rows of `names` in its SQL transport (`sqla+...` brokers;
    others need none) before processes that share them start. kombu makes both on first use, by
    a check then a create that only threads of one process serialise: two workers starting at
    once on a fresh broker both create, and the loser dies on "table already exists" or on the
    queue name's unique constraint. Here a lost race is caught and the work done again, which
    then finds what the other process made."""
    if not url.startswith(SQLA_PREFIX):
        return
    from kombu import Connection
    from sqlalchemy.exc import DBAPIError, IntegrityError

    for attempt in range(1, attempts + 1):
        try:
            with Connection(url) as connection:
                channel: Any = connection.default_channel
                channel.session  # noqa: B018 -- kombu makes its tables on first use
                for name in names:
                    try:
                        channel.queue_declare(queue=name)
                    except IntegrityError:  # another process made it between kombu's check and insert
                        channel.session.rollback()
                        channel.queue_declare(queue=name)
            return
        except DBAPIError:  # the tables, made by another process between kombu's check and create
            if attempt == attempts:
                raise


def _redis_state(url: str, queues: list[str]) -> dict[str, QueueState]:
    import redis

    client = redis.Redis.from_url(url)
    try:
        unacked: dict[str, set[str]] = {name: set() for name in queues}
        for raw in client.hvals(UNACKED_KEY):
            message, _exchange, routing_key = json.loads(raw)
            if routing_key in unacked and (task_id := _task_id(message)):
                unacked[routing_key].add(task_id)
        states = {}
        for name in queues:
            waiting = [json.loads(raw) for raw in client.lrange(name, 0, -1)]
            ids = {task_id for message in waiting if (task_id := _task_id(message))}
            states[name] = QueueState(waiting=len(waiting), task_ids=frozenset(ids | unacked[name]))
        return states
    finally:
        client.close()


def _sqla_state(url: str, queues: list[str]) -> dict[str, QueueState]:
    engine = sa.create_engine(url.removeprefix(SQLA_PREFIX))
    try:
        with engine.connect() as connection:
            if not sa.inspect(connection).has_table("kombu_message"):
                return {name: QueueState(waiting=0, task_ids=frozenset()) for name in queues}
            rows = connection.execute(
                sa.text(
                    "SELECT q.name, m.visible, m.payload FROM kombu_message m JOIN kombu_queue q ON q.id = m.queue_id"
                )
            ).all()
    finally:
        engine.dispose()
    waiting = dict.fromkeys(queues, 0)
    ids: dict[str, set[str]] = {name: set() for name in queues}
    for name, visible, payload in rows:
        if name not in ids:
            continue
        waiting[name] += 1 if visible else 0
        if task_id := _task_id(json.loads(payload)):
            ids[name].add(task_id)
    return {name: QueueState(waiting=waiting[name], task_ids=frozenset(ids[name])) for name in queues}


def queue_states(settings: Settings, queues: list[str]) -> dict[str, QueueState] | None:
    """Each queue's state on the configured broker; None where the broker cannot be read."""
    broker = settings.broker
    if broker.startswith(REDIS_SCHEMES):
        return _redis_state(broker, queues)
    if broker.startswith(SQLA_PREFIX):
        return _sqla_state(broker, queues)
    return None

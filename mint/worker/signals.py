"""Worker lifecycle: register in the `workers` table at start, heartbeat, unregister at stop.

The row is how operators (`mint admin workers list`) and the API see live workers on any
broker, the embedded one included.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from celery.signals import after_setup_logger, task_postrun, task_prerun, worker_ready, worker_shutdown

from mint import tracing
from mint.config import get_settings
from mint.services.workers import heartbeat, register_worker, unregister_worker
from mint.storage.db import session_scope
from mint.worker.queues import base_of_queue

HEARTBEAT_EVERY_S = 30.0
log = logging.getLogger(__name__)

_state: dict[str, Any] = {"worker_id": None, "stop": threading.Event()}


def current_worker_id() -> str | None:
    return _state["worker_id"]


def process_identity() -> str:
    """This process, uniquely: the worker's name and pid (a restarted worker of the same name differs)."""
    return f"{current_worker_id() or socket.gethostname()}/{os.getpid()}"


def _base_model_of(queues: list[str]) -> str | None:
    bases = [base for base in map(base_of_queue, queues) if base is not None]
    return bases[0] if len(bases) == 1 else None


@after_setup_logger.connect
def on_setup_logger(logger: logging.Logger, **_: Any) -> None:
    """Every line of the worker names the request whose work it is doing (`mint.tracing`)."""
    tracing.install(logger.handlers)


@task_prerun.connect
def on_task_start(task: Any = None, **_: Any) -> None:
    """Work under the id of the request that sent this task (a queue message header), if any."""
    request = getattr(task, "request", None)
    headers = getattr(request, "headers", None) or {}
    sent = getattr(request, tracing.MESSAGE_HEADER, None) or headers.get(tracing.MESSAGE_HEADER)
    _state["trace_token"] = tracing.begin(sent if isinstance(sent, str) else None)


@task_postrun.connect
def on_task_end(**_: Any) -> None:
    token = _state.pop("trace_token", None)
    if token is not None:
        tracing.end(token)


@worker_ready.connect
def on_worker_ready(sender: Any = None, **_: Any) -> None:
    worker_id = sender.hostname
    queues = sorted(queue.name for queue in sender.app.amqp.queues.consume_from.values())
    _state["worker_id"] = worker_id
    with session_scope(get_settings().database) as session:
        register_worker(
            session,
            worker_id=worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            base_model=_base_model_of(queues),
            queues=queues,
        )
    thread = threading.Thread(target=_heartbeat_loop, args=(worker_id,), name="mint-heartbeat", daemon=True)
    thread.start()
    log.info("worker %s ready on queues %s", worker_id, ", ".join(queues))


@worker_shutdown.connect
def on_worker_shutdown(**_: Any) -> None:
    _state["stop"].set()
    worker_id = _state["worker_id"]
    if worker_id is None:
        return
    with session_scope(get_settings().database) as session:
        unregister_worker(session, worker_id)


def _heartbeat_loop(worker_id: str) -> None:
    stop: threading.Event = _state["stop"]
    while not stop.wait(HEARTBEAT_EVERY_S):
        try:
            with session_scope(get_settings().database) as session:
                heartbeat(session, worker_id)
        except Exception:  # a database blip must not kill the worker; the next beat retries
            log.warning("worker heartbeat failed", exc_info=True)

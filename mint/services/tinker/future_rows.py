"""Tinker futures' rows, as the API and the workers write them: new, with a request, then a
result or a failure.

Every long Tinker call is a future (a `futures` row); the API records its request and the worker
that runs it records its result. A request or result up to INLINE_PAYLOAD_BYTES lives in the row,
a larger one (or one holding NaN or infinities, which are not JSON to PostgreSQL) in the object
store, under the future's id. A model's requests are found by `(model_id, seq_id)`
(`future_at`). The row is the truth and a queue message only wakes a worker, so a message that
cannot be sent now is logged, not raised (`send_quietly`): a waiting `retrieve_future` sends it
again (`mint.services.tinker.futures`). This is the bottom of the Tinker modules that record
work (sessions, models, sampling, futures and the worker half build on it); it never imports torch.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.services.dispatch import Dispatch
from mint.storage.keys import tinker_request_key, tinker_result_key
from mint.storage.objects import ObjectStore
from mint.storage.tables import Future, TrainingSession, new_id, utcnow

log = logging.getLogger(__name__)

# Requests and results up to this size live in the row; larger ones in the object store.
INLINE_PAYLOAD_BYTES = 64 * 1024
WAITING = ("pending", "running")


def _put_payload(store: ObjectStore, key: str, payload: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    encoded = json.dumps(payload, separators=(",", ":"), allow_nan=True)
    # NaN and infinities (a diverged loss) are not JSON to PostgreSQL: those go to the store too.
    if len(encoded) <= INLINE_PAYLOAD_BYTES and "NaN" not in encoded and "Infinity" not in encoded:
        return payload, None
    store.put_bytes(key, encoded.encode())
    return None, key


def get_payload(store: ObjectStore, inline: dict[str, Any] | None, key: str | None) -> dict[str, Any]:
    if key is not None:
        loaded: dict[str, Any] = json.loads(store.get_bytes(key))
        return loaded
    return dict(inline or {})


def set_request(store: ObjectStore, future: Future, payload: dict[str, Any]) -> None:
    future.request, future.request_object_key = _put_payload(store, tinker_request_key(future.id), payload)


def set_result(store: ObjectStore, future: Future, result: dict[str, Any]) -> None:
    future.result, future.result_object_key = _put_payload(store, tinker_result_key(future.id), result)
    future.status, future.finished_at = "succeeded", utcnow()


def fail_future(future: Future, category: str, message: str) -> None:
    future.status, future.error, future.error_category, future.finished_at = "failed", message, category, utcnow()


def fail_waiting(session: Session, model_id: str, message: str, category: str = "user") -> int:
    """Fail every pending or running future of a model or sampler."""
    futures = session.execute(select(Future).where(Future.model_id == model_id, Future.status.in_(WAITING))).scalars()
    count = 0
    for future in futures:
        fail_future(future, category, message)
        count += 1
    return count


def future_at(session: Session, model_id: str, seq_id: int) -> Future | None:
    return session.execute(
        select(Future).where(Future.model_id == model_id, Future.seq_id == seq_id)
    ).scalar_one_or_none()


def new_future(row: TrainingSession, operation: str, seq_id: int | None) -> Future:
    return Future(
        id=new_id("fut"),
        organization_id=row.organization_id,
        session_id=row.id,
        model_id=row.id,
        seq_id=seq_id,
        operation=operation,
        status="pending",
    )


def send_quietly(send: Dispatch, task: str, args: list[str], **where: Any) -> None:
    try:
        send(task, args=args, **where)
    except Exception:  # noqa: BLE001 - the row is committed; a waiting retrieve_future sends it again
        log.warning("could not send %s%s now; it is sent again while its future waits", task, args, exc_info=True)

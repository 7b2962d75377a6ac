"""Tinker futures, the API half: what `retrieve_future` and `cancel_future` answer about a request.

Every long Tinker call is a future (a `futures` row, `mint.services.tinker.future_rows`,
recorded by `mint.services.tinker.models` and `mint.services.tinker.sampling` and moved along by
the worker half, `mint.services.tinker.runner`). Here is how a client reads one back:
`poll_future` says whether it succeeded (with its result), failed (with its error and category)
or is still waiting, and the endpoint long-polls it for up to LONG_POLL_S. While a future waits,
its worker is looked at every INSPECT_EVERY_S: a model whose worker process is gone is lost and
its futures fail saying how to restore it, a future whose message was lost (a broker restart) is
sent again after RESEND_AFTER_S, and a base no worker holds is reported as the queue's paused
reason. `cancel_future` cancels one that has not started, and `encode_result` writes a finished
result as the protobuf the SDK reads.
This module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from mint.config import Settings
from mint.schemas import tinker_proto as proto
from mint.services.dispatch import Dispatch
from mint.services.tinker.future_rows import WAITING, fail_future, get_payload, send_quietly
from mint.services.tinker.models import RUN_MODEL_TASK, lose_model
from mint.services.tinker.sampling import SAMPLE_TASK
from mint.services.workers import base_is_served, live_worker
from mint.storage.db import session_scope
from mint.storage.objects import object_store_for
from mint.storage.queries import get_owned
from mint.storage.tables import Future, TrainingSession, as_utc, utcnow

# retrieve_future holds a pending request this long (the SDK gives up at 45 s).
LONG_POLL_S = 25.0
# While it waits, it looks at the model's worker this often, and sends the model's message
# again when a future has waited this long (a message lost with a broker restart).
INSPECT_EVERY_S = 10.0
RESEND_AFTER_S = 30.0
TERMINAL = ("succeeded", "failed", "cancelled")
# The operations whose results the SDK reads as protobuf (`encode_result`); the rest are JSON.
PROTOBUF_OPERATIONS = frozenset({"forward_backward", "sample"})


@dataclass(frozen=True)
class FutureState:
    """What `retrieve_future` answers: a result, an error, or 'try again' with the queue's state."""

    request_id: str
    operation: str
    status: str
    result: dict[str, Any] | None = None
    error: str | None = None
    category: str | None = None
    # Set (when the worker was inspected) if no worker can run the request now, saying why.
    queue_state_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


def poll_future(
    settings: Settings, organization_id: str, request_id: str, send: Dispatch, *, inspect: bool
) -> FutureState:
    """The future's state now. With `inspect`, a waiting future's worker is checked (a dead one
    fails the future, saying why) and its message is sent again if it has waited long."""
    with session_scope(settings.database) as session:
        future = get_owned(session, Future, request_id, organization_id=organization_id, noun="future")
        reason = _inspect_waiting(session, future, send) if future.status in WAITING and inspect else None
        if future.status == "succeeded":
            result = get_payload(object_store_for(settings), future.result, future.result_object_key)
            return FutureState(future.id, future.operation, future.status, result=result)
        if future.status in ("failed", "cancelled"):
            error = future.error or f"request {future.id} was cancelled"
            return FutureState(
                future.id, future.operation, future.status, error=error, category=future.error_category or "user"
            )
        return FutureState(future.id, future.operation, future.status, queue_state_reason=reason)


def _inspect_waiting(session: Session, future: Future, send: Dispatch) -> str | None:
    """Fail a future whose model is gone; resend a long-waiting one's message. Returns why the
    queue is paused, if it is (no worker holds the base)."""
    row = session.get(TrainingSession, future.session_id)
    if row is None or row.status != "active":
        fail_future(future, "user", f"{future.model_id} is closed (its session finished, or its worker stopped)")
        return None
    waited = (utcnow() - as_utc(future.created_at)).total_seconds()
    if row.kind == "training" and row.worker_id is not None:
        ref = live_worker(session, row.worker_id)
        if ref is None:
            lose_model(session, row)
        elif future.status == "pending" and waited > RESEND_AFTER_S:
            send_quietly(send, RUN_MODEL_TASK, [row.id], worker=ref)
        return None
    if future.status == "running" and future.worker_id and live_worker(session, future.worker_id) is None:
        fail_future(
            future, "server", f"the worker running request {future.id} ({future.worker_id}) stopped; send it again"
        )
        return None
    if not base_is_served(session, row.base_model):
        return f"no worker holds base {row.base_model} now; start one with `mint worker --base {row.base_model}`"
    if future.status == "pending" and waited > RESEND_AFTER_S:
        task, args = (RUN_MODEL_TASK, [row.id]) if row.kind == "training" else (SAMPLE_TASK, [future.id])
        send_quietly(send, task, args, base_model=row.base_model)
    return None


def cancel_future(session: Session, organization_id: str, request_id: str) -> str:
    """Cancel a future that has not started (one running or done is left as it is); its status."""
    future = get_owned(session, Future, request_id, organization_id=organization_id, noun="future")
    if future.status == "pending":
        future.status, future.error, future.error_category = "cancelled", "cancelled by the client", "user"
        future.finished_at = utcnow()
    return future.status


def encode_result(state: FutureState) -> bytes:
    """A finished forward, forward_backward or sample result in the protobuf the SDK reads."""
    assert state.result is not None
    if state.operation == "sample":
        return proto.encode_sample_response(state.result)
    return proto.encode_forward_backward_output(state.result["logprobs"], state.result["metrics"])

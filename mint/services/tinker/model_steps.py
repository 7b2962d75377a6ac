"""A model's requests on its worker: the model claimed, its next request taken in `seq_id` order,
and the request's outcome recorded.

The first worker process of the base to run a model's creation claims the model (`claim_model`,
`training_sessions.worker_id`); a process that consumes no queue of its own cannot, since later
messages could not reach it. The claimed process then takes the model's requests one at a time
(`next_step`), strictly at `training_sessions.next_seq_id`, so one that arrived early waits for
the missing one; a request left `running` by an attempt that stopped half way fails. Each
request runs with a `ModelContext` (where it runs, whose model, its seq_id) and its outcome is
recorded on its future (`record_or_fail`), which moves `next_seq_id` on. What runs each request
is `mint.services.tinker.runner`'s registry. Importing this module imports no torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import update

from mint.config import Settings
from mint.errors import InvalidRequest
from mint.services.tinker.future_rows import fail_future, fail_waiting, future_at, get_payload, set_result
from mint.services.tinker.resident import LoadBase, WorkerIdentity, held, release_model
from mint.storage.db import session_scope
from mint.storage.objects import ObjectStore
from mint.storage.queries import rowcount
from mint.storage.tables import Future, TrainingSession

if TYPE_CHECKING:
    from mint.trainer.training_session import TrainingSession as LoraSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimedModel:
    """A model this worker process holds: whose it is, on which base, in which Tinker session."""

    organization_id: str
    base_model: str
    tinker_session_id: str | None


@dataclass
class Step:
    """One claimed request of a model."""

    future_id: str
    operation: str
    seq_id: int
    payload: dict[str, Any]


@dataclass
class ModelContext:
    """What an operation on a model knows: where it runs, whose model it is, and its seq_id."""

    settings: Settings
    store: ObjectStore
    load_base: LoadBase
    model_id: str
    organization_id: str
    base_model: str
    tinker_session_id: str | None
    seq_id: int

    def training(self) -> LoraSession:
        training = held.models.get(self.model_id)
        if training is None or training.closed:
            raise InvalidRequest(
                f"model {self.model_id} is not resident on this worker any more (released when its session "
                "ended or went silent); create it again from a checkpoint",
                param="model_id",
            )
        return training


def claim_model(settings: Settings, model_id: str, me: WorkerIdentity) -> ClaimedModel | str:
    """The model, claimed for this process if nobody holds it; or why this process cannot run its
    requests: "missing", "closed", "unreachable", "taken" (another process claimed it first) or
    "not-mine"."""
    with session_scope(settings.database) as session:
        row = session.get(TrainingSession, model_id)
        if row is None or row.kind != "training":
            return "missing"
        if row.status != "active":
            fail_waiting(session, model_id, f"model {model_id} is closed")
            release_model(model_id)
            return "closed"
        if row.worker_id is None:
            if not me.reachable:
                fail_waiting(
                    session,
                    model_id,
                    f"worker {me.worker_id} does not consume a queue of its own, so it cannot hold Tinker models; "
                    "start training workers with `mint worker --base NAME` (not `--queues`)",
                    category="server",
                )
                return "unreachable"
            claimed = rowcount(
                session.execute(
                    update(TrainingSession)
                    .where(TrainingSession.id == model_id, TrainingSession.worker_id.is_(None))
                    .values(worker_id=me.worker_id)
                    .execution_options(synchronize_session=False)
                )
            )
            if not claimed:
                return "taken"
        elif row.worker_id != me.worker_id:
            return "not-mine"
        return ClaimedModel(row.organization_id, row.base_model, row.tinker_session_id)


def next_step(settings: Settings, store: ObjectStore, model_id: str, worker_id: str) -> Step | None:
    """Claim the model's request at its next seq_id, skipping ones already settled."""
    with session_scope(settings.database) as session:
        row = session.get(TrainingSession, model_id)
        if row is None or row.status != "active":
            if row is not None:
                fail_waiting(session, model_id, f"model {model_id} is closed")
            release_model(model_id)
            return None
        while True:
            future = future_at(session, model_id, row.next_seq_id)
            if future is None:
                return None
            if future.status == "pending":
                break
            if future.status == "running":  # an earlier attempt in this process stopped half way
                fail_future(future, "server", "the request was interrupted; send it again")
            row.next_seq_id += 1
        future.status, future.worker_id = "running", worker_id
        payload = get_payload(store, future.request, future.request_object_key)
        return Step(future.id, future.operation, int(future.seq_id or 0), payload)


def record_or_fail(settings: Settings, store: ObjectStore, model_id: str, step: Step, outcome: tuple[str, Any]) -> None:
    try:
        _record(settings, store, model_id, step, outcome)
    except Exception as exc:  # the result could not be stored: the client must hear of it all the same
        log.exception("could not record request %s of model %s", step.future_id, model_id)
        _record(settings, store, model_id, step, ("server", f"its result could not be stored: {exc}"))


def _record(settings: Settings, store: ObjectStore, model_id: str, step: Step, outcome: tuple[str, Any]) -> None:
    with session_scope(settings.database) as session:
        future = session.get(Future, step.future_id)
        row = session.get(TrainingSession, model_id)
        assert future is not None and row is not None
        if future.status == "running":
            kind, value = outcome
            if kind == "ok":
                set_result(store, future, value)
            else:
                fail_future(future, kind, value)
        row.next_seq_id = max(row.next_seq_id, step.seq_id + 1)

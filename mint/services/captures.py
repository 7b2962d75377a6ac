"""Production capture and feedback: what a deployment served, and what people said about it.

A deployment captures nothing until its capture rate is set (`PATCH
/v1/deployments/{id}/capture`): then that share of the requests served through it, chosen at
random, is recorded with the messages (or prompt), tools, the answer, the version that gave it,
tokens and latency, and kept for the deployment's retention period. A capture's id is the
completion's (`chatcmpl-...`), so whoever holds an answer can find its record and give feedback
on it: a score in [0, 1], a label, a comment, and the answer it should have been.

Capture never slows or fails a request: the API hands each record to a `CaptureWriter`, whose
thread writes them in batches behind the request path; a full queue (the database falling
behind) drops the record and counts it, and the request goes on.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from mint.errors import InvalidRequest, NotFound
from mint.services.audit import record_audit
from mint.services.deployments import get_deployment
from mint.services.principal import Principal
from mint.storage.db import session_scope
from mint.storage.queries import PageResult, paginate
from mint.storage.tables import Capture, Deployment, Feedback, new_id, utcnow

log = logging.getLogger(__name__)

QUEUE_SIZE = 1000  # records waiting to be written; one more is dropped (and counted)
BATCH = 100  # records written per transaction
MAX_RETENTION_DAYS = 3650


@dataclass(frozen=True)
class CaptureTarget:
    """What a serving plan needs to capture a request to a deployment."""

    deployment_id: str
    rate: float
    retention_days: int

    def chosen(self) -> bool:
        """Whether this request is in the sampled share."""
        return self.rate > 0 and random.random() < self.rate


def capture_target(deployment: Deployment) -> CaptureTarget | None:
    if deployment.capture_rate <= 0:
        return None
    return CaptureTarget(deployment.id, deployment.capture_rate, deployment.capture_retention_days)


def set_capture(
    session: Session, principal: Principal, deployment: Deployment, *, rate: float | None, retention_days: int | None
) -> Deployment:
    """Set a deployment's capture rate (0: off) and retention (None: unchanged), audited."""
    rate = deployment.capture_rate if rate is None else rate
    if not 0 <= rate <= 1:
        raise InvalidRequest(f"the capture rate is a share of requests from 0 to 1, not {rate}", param="rate")
    days = deployment.capture_retention_days if retention_days is None else retention_days
    if not 1 <= days <= MAX_RETENTION_DAYS:
        raise InvalidRequest(f"retention_days is from 1 to {MAX_RETENTION_DAYS}, not {days}", param="retention_days")
    before = {"rate": deployment.capture_rate, "retention_days": deployment.capture_retention_days}
    deployment.capture_rate, deployment.capture_retention_days = rate, days
    after = {"rate": rate, "retention_days": days}
    if before != after:
        record_audit(
            session, principal, "deployment.capture", "deployment", deployment.id, {"from": before, "to": after}
        )
    return deployment


# ---- the writer --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaptureRecord:
    """One served request, as the API saw it, waiting to be written."""

    id: str
    organization_id: str
    target: CaptureTarget
    revision: int
    model_ref: str
    kind: str
    request: dict[str, Any]
    response: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    created_at: datetime

    def row(self) -> Capture:
        return Capture(
            id=self.id,
            organization_id=self.organization_id,
            deployment_id=self.target.deployment_id,
            revision=self.revision,
            model_ref=self.model_ref,
            kind=self.kind,
            request=self.request,
            response=self.response,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            latency_ms=self.latency_ms,
            created_at=self.created_at,
            expires_at=self.created_at + timedelta(days=self.target.retention_days),
        )


class CaptureWriter:
    """Writes capture records on a thread of its own, in batches; `offer` never blocks."""

    def __init__(
        self,
        database: str,
        *,
        queue_size: int = QUEUE_SIZE,
        on_written: Callable[[int], None] | None = None,
        on_dropped: Callable[[], None] | None = None,
    ) -> None:
        self.database = database
        self.queue: queue.Queue[CaptureRecord] = queue.Queue(maxsize=queue_size)
        self.on_written = on_written or (lambda count: None)
        self.on_dropped = on_dropped or (lambda: None)
        self.written = self.dropped = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def offer(self, record: CaptureRecord) -> bool:
        """Queue a record for writing; False (and counted) when the queue is full."""
        self._start()
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            self.on_dropped()
            return False
        return True

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="capture-writer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            try:
                with session_scope(self.database) as session:
                    session.add_all(record.row() for record in batch)
                self.written += len(batch)
                self.on_written(len(batch))
            except Exception:  # a capture is never worth a request: log, count, go on
                log.exception("could not write %d captures; dropped", len(batch))
                self.dropped += len(batch)
                for _ in batch:
                    self.on_dropped()
            finally:
                for _ in batch:
                    self.queue.task_done()

    def flush(self) -> None:
        """Wait until every record offered so far is written or dropped (tests, shutdown)."""
        self.queue.join()


# ---- reading, and feedback ----------------------------------------------------------------------


def get_capture(session: Session, organization_id: str, capture_id: str) -> Capture:
    capture = session.get(Capture, capture_id)
    if capture is None or capture.organization_id != organization_id:
        raise NotFound(
            f"no captured completion {capture_id!r}: only requests to a deployment whose capture rate chose them are "
            "kept (PATCH /v1/deployments/{id}/capture), for its retention period",
            param="completion_id",
        )
    return capture


def list_captures(
    session: Session, organization_id: str, deployment_id: str, *, after: str | None, limit: int
) -> PageResult[Capture]:
    deployment = get_deployment(session, organization_id, deployment_id)
    query = select(Capture).where(Capture.deployment_id == deployment.id)
    return paginate(session, query, Capture, after=after, limit=limit)


def feedback_of(session: Session, capture_ids: list[str]) -> dict[str, list[Feedback]]:
    """Each capture's feedback, oldest first."""
    if not capture_ids:
        return {}
    rows = session.execute(
        select(Feedback).where(Feedback.capture_id.in_(capture_ids)).order_by(Feedback.created_at, Feedback.id)
    ).scalars()
    found: dict[str, list[Feedback]] = {capture_id: [] for capture_id in capture_ids}
    for row in rows:
        found[row.capture_id].append(row)
    return found


def add_feedback(
    session: Session,
    principal: Principal,
    capture_id: str,
    *,
    score: float | None,
    label: str | None,
    comment: str | None,
    correction: dict[str, Any] | None,
) -> Feedback:
    """Record feedback on a captured completion (any key of its organization, viewers too)."""
    capture = get_capture(session, principal.organization_id, capture_id)
    if score is None and label is None and comment is None and correction is None:
        raise InvalidRequest("give a score, a label, a comment or a correction", param="score")
    if correction is not None:
        expected = "message" if capture.kind == "chat" else "text"
        if set(correction) != {expected}:
            raise InvalidRequest(
                f"a correction of a {capture.kind} completion is {{{expected!r}: ...}}: the "
                + ("assistant message it should have been" if expected == "message" else "text it should have been"),
                param="correction",
            )
    feedback = Feedback(
        id=new_id("fb"),
        organization_id=capture.organization_id,
        capture_id=capture.id,
        score=score,
        label=label,
        comment=comment,
        correction=correction,
        created_by=principal.name,
    )
    session.add(feedback)
    session.flush()
    return feedback


def expire_captures(session: Session, *, now: datetime | None = None, batch: int = 500) -> list[str]:
    """Delete up to `batch` captures past their retention, with their feedback."""
    now = now or utcnow()
    ids = list(session.execute(select(Capture.id).where(Capture.expires_at <= now).limit(batch)).scalars())
    if ids:
        session.execute(delete(Feedback).where(Feedback.capture_id.in_(ids)))
        session.execute(delete(Capture).where(Capture.id.in_(ids)))
    return ids

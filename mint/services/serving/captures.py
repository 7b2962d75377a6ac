"""Production capture and feedback: what a deployment served, and what people said about it.

A deployment captures nothing until its capture rate is set (`PATCH
/v1/deployments/{id}/capture`): then that share of the requests served through it, chosen at
random, is recorded with the messages (or prompt), tools, the answer, the version that gave it,
tokens and latency, and kept for the deployment's retention period. A capture's id is the
completion's (`chatcmpl-...`), so whoever holds an answer can find its record and give feedback
on it: a score in [0, 1], a label, a comment, and the answer it should have been.

Capture never fails a request: the API hands each record to a `CaptureWriter`, whose thread
writes them in batches; a full queue (the database falling behind) drops the record and counts
it, and the request goes on. The answer of a captured completion is sent once its record is
committed (waiting at most `MINT_CAPTURE_WAIT_S`, 5 s), so whoever holds the answer can give
feedback on it at once, on any API replica: the row is there before the answer's last byte.
The wait is one batched commit, shared by the requests captured at the same moment; requests
their deployment did not choose never wait.

What people write is bounded: one feedback is at most `MAX_FEEDBACK_BYTES` (64 KiB) of JSON, a
capture keeps at most `MAX_FEEDBACK_PER_CAPTURE` (20) of them, and captures and feedback both
count against the organization's capture storage quota (`capture_storage_mib`,
`mint.services.billing.quotas`): past it, new captures are dropped and counted, and feedback is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import random
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, Protocol

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest, NotFound
from mint.schemas.auth import QuotaKind
from mint.schemas.captures import MAX_FEEDBACK_BYTES, MAX_FEEDBACK_PER_CAPTURE
from mint.services.audit import record_audit
from mint.services.billing.quotas import QuotaDefaults, hold, room
from mint.services.catalog import get_deployment
from mint.services.principal import Principal
from mint.storage.db import session_scope
from mint.storage.queries import PageResult, children_of, paginate
from mint.storage.tables import Capture, Deployment, Feedback, new_id, utcnow

log = logging.getLogger(__name__)

QUEUE_SIZE = 1000  # records waiting to be written; one more is dropped (and counted)
BATCH = 100  # records written per transaction
MAX_RETENTION_DAYS = 3650
STORAGE_QUOTA: QuotaKind = "capture_storage_mib"


def json_bytes(value: Any) -> int:
    """The size of `value` as compact JSON in UTF-8: what a capture or a feedback stores."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


@dataclass(frozen=True)
class CaptureTarget:
    """What a serving plan needs to capture a request to a deployment."""

    deployment_id: str
    rate: float
    retention_days: int
    tokens: bool = False  # the turns of marked episodes are recorded token-exact (`episodes`)

    def chosen(self) -> bool:
        """Whether this request is in the sampled share."""
        return self.rate > 0 and random.random() < self.rate


def capture_target(deployment: Deployment) -> CaptureTarget | None:
    if deployment.capture_rate <= 0:
        return None
    return CaptureTarget(
        deployment.id, deployment.capture_rate, deployment.capture_retention_days, bool(deployment.capture_tokens)
    )


def set_capture(
    session: Session,
    principal: Principal,
    deployment: Deployment,
    *,
    rate: float | None,
    retention_days: int | None,
    tokens: bool | None = None,
) -> Deployment:
    """Set a deployment's capture rate (0: off), retention and whether marked episodes are
    recorded token-exact (None: unchanged), audited."""
    rate = deployment.capture_rate if rate is None else rate
    if not 0 <= rate <= 1:
        raise InvalidRequest(f"the capture rate is a share of requests from 0 to 1, not {rate}", param="rate")
    days = deployment.capture_retention_days if retention_days is None else retention_days
    if not 1 <= days <= MAX_RETENTION_DAYS:
        raise InvalidRequest(f"retention_days is from 1 to {MAX_RETENTION_DAYS}, not {days}", param="retention_days")
    keep_tokens = bool(deployment.capture_tokens) if tokens is None else tokens
    before = {
        "rate": deployment.capture_rate,
        "retention_days": deployment.capture_retention_days,
        "tokens": bool(deployment.capture_tokens),
    }
    deployment.capture_rate, deployment.capture_retention_days = rate, days
    deployment.capture_tokens = keep_tokens
    after = {"rate": rate, "retention_days": days, "tokens": keep_tokens}
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

    @cached_property
    def stored_bytes(self) -> int:
        """What its row counts against the organization's capture storage quota."""
        return json_bytes(self.request) + json_bytes(self.response)

    def write(self, session: Session) -> None:
        session.add(self.row())

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
            stored_bytes=self.stored_bytes,
            created_at=self.created_at,
            expires_at=self.created_at + timedelta(days=self.target.retention_days),
        )


class Writable(Protocol):
    """What the writer writes: a captured completion (`CaptureRecord`), or an episode's turn
    (`mint.services.serving.episodes.EpisodeTurnRecord`)."""

    @property
    def organization_id(self) -> str: ...

    @property
    def stored_bytes(self) -> int: ...

    def write(self, session: Session) -> None: ...


@dataclass
class _Pending:
    """A record in the writer's queue, and the receipt its request may wait on."""

    record: Writable
    receipt: Future[bool] = field(default_factory=Future)

    def settle(self, written: bool) -> None:
        # Already settled, or cancelled by a caller that stopped waiting: nothing more to say.
        with contextlib.suppress(InvalidStateError):
            self.receipt.set_result(written)


class CaptureWriter:
    """Writes capture records on a thread of its own, in batches; `offer` never blocks.

    Each offered record comes with a receipt, settled True once its row is committed and False
    when it is dropped (the queue full, the organization past its capture storage quota, or the
    write failed); `landed` waits for it without holding the event loop. With `quotas`, records
    of an organization past its `capture_storage_mib` quota are dropped (checked per batch,
    without the organization's lock: replicas writing at once may pass it by a batch each)."""

    def __init__(
        self,
        database: str,
        *,
        quotas: QuotaDefaults | None = None,
        queue_size: int = QUEUE_SIZE,
        on_written: Callable[[int], None] | None = None,
        on_dropped: Callable[[], None] | None = None,
    ) -> None:
        self.database = database
        self.quotas = quotas
        self.queue: queue.Queue[_Pending] = queue.Queue(maxsize=queue_size)
        self.on_written = on_written or (lambda count: None)
        self.on_dropped = on_dropped or (lambda: None)
        self.written = self.dropped = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def offer(self, record: Writable) -> Future[bool]:
        """Queue a record for writing; its receipt is settled True once written, False if dropped
        (at once, and counted, when the queue is full)."""
        self._start()
        pending = _Pending(record)
        try:
            self.queue.put_nowait(pending)
        except queue.Full:
            self._drop([pending])
        return pending.receipt

    async def landed(self, receipt: Future[bool], timeout_s: float) -> bool:
        """Wait until the record of `receipt` is written (True) or dropped (False), at most
        `timeout_s` (then False; it may still be written later). Other requests go on meanwhile."""
        if receipt.done():
            return receipt.result()
        if timeout_s <= 0:
            return False
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(receipt)), timeout_s)
        except TimeoutError:
            log.warning("a capture was not written within %.1f s; its answer is sent without it", timeout_s)
            return False

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
                self._write(batch)
            finally:
                for _ in batch:
                    self.queue.task_done()

    def _write(self, batch: list[_Pending]) -> None:
        """Commit the rows of a batch (those within their organization's quota), then settle
        every receipt of it. A batch that fails is written again one record at a time, so a
        record that cannot be written drops only itself, not the records batched with it."""
        try:
            with session_scope(self.database) as session:
                kept, refused = self._within_quota(session, batch)
                for pending in kept:
                    pending.record.write(session)
        except Exception:  # a capture is never worth a request: log, count, go on
            if len(batch) > 1:
                log.warning("could not write a batch of %d captures; writing them one by one", len(batch))
                for pending in batch:
                    self._write([pending])
                return
            log.exception("could not write a capture; dropped")
            self._drop(batch)
            return
        self.written += len(kept)
        if kept:
            self.on_written(len(kept))
        for pending in kept:
            pending.settle(True)
        self._drop(refused)

    def _within_quota(self, session: Session, batch: list[_Pending]) -> tuple[list[_Pending], list[_Pending]]:
        """The records of a batch that fit their organization's capture storage quota, in order,
        and those that do not."""
        if self.quotas is None:
            return batch, []
        left: dict[str, int] = {}
        kept, refused = [], []
        for pending in batch:
            organization_id = pending.record.organization_id
            if organization_id not in left:
                left[organization_id] = room(session, organization_id, STORAGE_QUOTA, self.quotas)
            if pending.record.stored_bytes <= left[organization_id]:
                left[organization_id] -= pending.record.stored_bytes
                kept.append(pending)
            else:
                refused.append(pending)
        if refused:
            log.warning(
                "%d captures dropped: their organizations (%s) are at their %s quota",
                len(refused),
                ", ".join(sorted({pending.record.organization_id for pending in refused})),
                STORAGE_QUOTA,
            )
        return kept, refused

    def _drop(self, pendings: list[_Pending]) -> None:
        for pending in pendings:
            self.dropped += 1
            self.on_dropped()
            pending.settle(False)

    def flush(self) -> None:
        """Wait until every record offered so far is written or dropped (tests, shutdown)."""
        self.queue.join()


# ---- reading, and feedback ----------------------------------------------------------------------


def get_capture(session: Session, organization_id: str, capture_id: str) -> Capture:
    """A captured completion of the organization; NotFound says why a completion was not captured."""
    capture = session.get(Capture, capture_id)
    if capture is None or capture.organization_id != organization_id:
        raise not_captured(session, organization_id, capture_id)
    return capture


def not_captured(session: Session, organization_id: str, completion_id: str) -> NotFound:
    """The 404 of a completion with no capture in the organization, saying why from what the
    organization's deployments capture: none at all, or only the share each one's rate chooses.
    (A captured completion's row is written before its answer is sent, so this is never a capture
    still on its way.)"""
    where = f"completion {completion_id!r} was not captured"
    capturing = session.execute(
        select(Deployment.name, Deployment.capture_rate)
        .where(
            Deployment.organization_id == organization_id,
            Deployment.status == "active",
            Deployment.capture_rate > 0,
        )
        .order_by(Deployment.name)
    ).all()
    if not completion_id.startswith(("chatcmpl-", "cmpl-")):
        why = (
            "that is not a completion's id (an answer of /v1/chat/completions is `chatcmpl-...`, "
            "of /v1/completions `cmpl-...`)"
        )
    elif not capturing:
        why = (
            "capture is off on every deployment of this organization, so no completion is kept "
            "(PATCH /v1/deployments/{id}/capture sets the share of requests a deployment captures)"
        )
    else:
        shares = ", ".join(f"{name!r} a share of {rate:g}" for name, rate in capturing[:10])
        more = f" and {len(capturing) - 10} more" if len(capturing) > 10 else ""
        why = (
            f"only completions of a deployment with capture on are kept, each chosen at random at its rate "
            f"(here {shares}{more}); a completion of a base, an adapter version or a deployment with capture off, "
            "one its deployment's rate did not choose, or one dropped because the organization was at its "
            f"{STORAGE_QUOTA} quota, is not"
        )
    return NotFound(
        f"{where}: {why}. A capture is also deleted once its deployment's retention passes.",
        param="completion_id",
    )


def list_captures(
    session: Session, organization_id: str, deployment_id: str, *, after: str | None, limit: int
) -> PageResult[Capture]:
    deployment = get_deployment(session, organization_id, deployment_id)
    query = select(Capture).where(Capture.deployment_id == deployment.id)
    return paginate(session, query, Capture, after=after, limit=limit)


def feedback_of(session: Session, capture_ids: list[str]) -> dict[str, list[Feedback]]:
    """Each capture's feedback, oldest first."""
    return children_of(session, Feedback, Feedback.capture_id, capture_ids)


def add_feedback(
    session: Session,
    principal: Principal,
    capture_id: str,
    *,
    score: float | None,
    label: str | None,
    comment: str | None,
    correction: dict[str, Any] | None,
    quotas: QuotaDefaults,
) -> Feedback:
    """Record feedback on a captured completion (any key of its organization, viewers too).

    Bounded like every write: at most MAX_FEEDBACK_BYTES of JSON (400), at most
    MAX_FEEDBACK_PER_CAPTURE entries per capture (409), and within the organization's capture
    storage quota (429); the organization's row is locked meanwhile, so feedback posted at once
    cannot pass either count together."""
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
    size = json_bytes({"score": score, "label": label, "comment": comment, "correction": correction})
    if size > MAX_FEEDBACK_BYTES:
        raise InvalidRequest(
            f"a feedback is at most {MAX_FEEDBACK_BYTES // 1024} KiB ({MAX_FEEDBACK_BYTES} bytes) of JSON, its score, "
            f"label, comment and correction together; this one is {size} bytes. Send the answer it should have been "
            "(one message), not more",
            param="correction" if correction is not None else "comment",
        )
    hold(session, capture.organization_id, STORAGE_QUOTA, quotas, adding=size)
    given = session.execute(
        select(func.count()).select_from(Feedback).where(Feedback.capture_id == capture.id)
    ).scalar_one()
    if given >= MAX_FEEDBACK_PER_CAPTURE:
        raise Conflict(
            f"completion {capture.id!r} already has {given} feedback entries, the most one capture keeps "
            f"({MAX_FEEDBACK_PER_CAPTURE}); read them with GET /v1/captures/{capture.id}",
            param="completion_id",
        )
    feedback = Feedback(
        id=new_id("fb"),
        organization_id=capture.organization_id,
        capture_id=capture.id,
        score=score,
        label=label,
        comment=comment,
        correction=correction,
        stored_bytes=size,
        created_by=principal.name,
    )
    session.add(feedback)
    session.flush()
    return feedback


def expire_kept(
    session: Session, kept: Any, children: Any, parent_id: Any, *, now: datetime | None, batch: int
) -> list[str]:
    """Delete up to `batch` rows of `kept` (captures, episodes) past their `expires_at`, with the
    rows of `children` whose `parent_id` column names them (feedback, turns); their ids."""
    now = now or utcnow()
    ids = list(session.execute(select(kept.id).where(kept.expires_at <= now).limit(batch)).scalars())
    if ids:
        session.execute(delete(children).where(parent_id.in_(ids)))
        session.execute(delete(kept).where(kept.id.in_(ids)))
    return ids


def expire_captures(session: Session, *, now: datetime | None = None, batch: int = 500) -> list[str]:
    """Delete up to `batch` captures past their retention, with their feedback."""
    return expire_kept(session, Capture, Feedback, Feedback.capture_id, now=now, batch=batch)

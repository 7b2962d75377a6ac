"""Delivering webhook events (worker side of `mint.services.webhooks.events`): sign, POST, record the
attempt, and retry with exponential backoff until the delivery succeeds or runs out of attempts.

An attempt first claims the delivery by moving `next_attempt_at` past the longest an attempt
can take: a duplicate message finds it not due and returns, and a delivery whose worker died
mid-attempt becomes due again, so the resend sweep (`resend_due`, run by beat) sends it once
more. Delivery is therefore at least once; the `webhook-id` header (the event id) lets a
receiver drop a repeat. The POST runs outside any transaction, so no database connection is
held while a slow receiver answers.

Each attempt resolves the endpoint's host once, checks it and connects to the address it
checked (`mint.services.webhooks.egress`), follows no redirect, ends within `webhook_timeout_s` in all
however slowly the receiver answers, and reads at most RESPONSE_READ_BYTES of the answer's
body: deliveries run on the system worker every organization shares.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from standardwebhooks.webhooks import Webhook as Signer

from mint.config import Settings
from mint.services.dispatch import Dispatch
from mint.services.webhooks import egress
from mint.services.webhooks.events import send_delivery
from mint.storage.db import session_scope
from mint.storage.queries import rowcount
from mint.storage.tables import Webhook, WebhookDelivery, utcnow

log = logging.getLogger(__name__)

# The start of a receiver's answer kept in the log.
RESPONSE_EXCERPT_CHARS = 500
# The most of an answer's body an attempt reads (then it closes the connection): enough for the
# excerpt in any UTF-8, however long the answer.
RESPONSE_READ_BYTES = 4096
# A claimed attempt counts as lost (its worker died) this long after its deadline (which leaves
# room for the DNS lookup before it).
CLAIM_MARGIN_S = 30.0
USER_AGENT = "Mint-Webhooks/1"


@dataclass(frozen=True)
class Request:
    """What one attempt POSTs, read in the claim's transaction."""

    url: str
    secret: str
    event_id: str
    body: str
    attempt: int


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    response: str
    error: str | None
    duration_ms: float

    @property
    def ok(self) -> bool:
        return self.error is None


def retry_delay_s(settings: Settings, attempt: int) -> float:
    """The wait after failed attempt number `attempt` (1-based): doubling from `webhook_retry_s`."""
    return min(settings.webhook_retry_s * 2 ** (attempt - 1), settings.webhook_retry_max_s)


def signed_headers(secret: str, event_id: str, body: str) -> dict[str, str]:
    """The Standard Webhooks headers of one POST, signed now."""
    moment = utcnow()
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": event_id,
        "webhook-timestamp": str(int(moment.timestamp())),
        "webhook-signature": Signer(secret).sign(event_id, moment, body),
    }


def post(request: Request, settings: Settings) -> Outcome:
    """POST the signed event once to the address its host resolves to now, if that address may
    be sent to; a refused address, a network error, the deadline passing or a non-2xx answer is
    a failed attempt."""
    headers = signed_headers(request.secret, request.event_id, request.body)
    began = time.perf_counter()
    try:
        destination = egress.resolve(request.url, allow_private=settings.webhook_allow_private_networks)
        answer = egress.send(
            destination,
            method="POST",
            headers=headers,
            body=request.body.encode(),
            deadline_s=settings.webhook_timeout_s,
            answer_bytes=RESPONSE_READ_BYTES,
        )
    except egress.DeadlinePassed:
        error: str | None = (
            f"Timeout: the receiver sent no answer within {settings.webhook_timeout_s:g} s "
            "(the deadline of a delivery, MINT_WEBHOOK_TIMEOUT_S)"
        )
        return Outcome(None, "", error, (time.perf_counter() - began) * 1000)
    except egress.EgressError as exc:
        return Outcome(None, "", str(exc)[:RESPONSE_EXCERPT_CHARS], (time.perf_counter() - began) * 1000)
    duration_ms = (time.perf_counter() - began) * 1000
    ok = 200 <= answer.status_code < 300
    error = None if ok else f"the receiver answered HTTP {answer.status_code}"
    excerpt = answer.body_prefix.decode("utf-8", errors="replace")[:RESPONSE_EXCERPT_CHARS]
    return Outcome(answer.status_code, excerpt, error, duration_ms)


def _claim(session: Session, settings: Settings, delivery_id: str) -> Request | None:
    """Take the delivery's next attempt if it is pending and due; None otherwise. An endpoint
    deleted or disabled meanwhile ends the delivery as failed."""
    now = utcnow()
    lost_at = now + timedelta(seconds=settings.webhook_timeout_s + CLAIM_MARGIN_S)
    claimed = rowcount(
        session.execute(
            update(WebhookDelivery)
            .where(
                WebhookDelivery.id == delivery_id,
                WebhookDelivery.status == "pending",
                WebhookDelivery.next_attempt_at <= now,
            )
            .values(attempts=WebhookDelivery.attempts + 1, next_attempt_at=lost_at)
            .execution_options(synchronize_session=False)
        )
    )
    if not claimed:
        return None
    delivery = session.get(WebhookDelivery, delivery_id)
    assert delivery is not None
    session.refresh(delivery)
    webhook = session.get(Webhook, delivery.webhook_id)
    if webhook is None or not webhook.enabled:
        delivery.status, delivery.finished_at, delivery.next_attempt_at = "failed", now, None
        disabled = Outcome(None, "", "the endpoint is disabled; enable it and redeliver", 0.0)
        delivery.attempt_log = [*delivery.attempt_log, _entry(delivery.attempts, disabled)]
        return None
    body = json.dumps(delivery.payload, separators=(",", ":"))
    return Request(webhook.url, webhook.secret, delivery.event_id, body, delivery.attempts)


def _entry(attempt: int, outcome: Outcome) -> dict[str, object]:
    return {
        "attempt": attempt,
        "at": utcnow().isoformat(),
        "status_code": outcome.status_code,
        "response": outcome.response,
        "error": outcome.error,
        "duration_ms": round(outcome.duration_ms, 3),
    }


def _record(session: Session, settings: Settings, delivery_id: str, request: Request, outcome: Outcome) -> float | None:
    """Log the attempt and move the delivery on; the wait before the next attempt, or None if none follows."""
    delivery = session.get(WebhookDelivery, delivery_id)
    if delivery is None:  # its endpoint was deleted meanwhile
        return None
    delivery.attempt_log = [*delivery.attempt_log, _entry(request.attempt, outcome)]
    now = utcnow()
    if outcome.ok:
        delivery.status, delivery.finished_at, delivery.next_attempt_at = "succeeded", now, None
        return None
    if request.attempt >= settings.webhook_max_attempts:
        delivery.status, delivery.finished_at, delivery.next_attempt_at = "failed", now, None
        return None
    wait_s = retry_delay_s(settings, request.attempt)
    delivery.next_attempt_at = now + timedelta(seconds=wait_s)
    return wait_s


def deliver(settings: Settings, delivery_id: str, send: Dispatch | None) -> str:
    """Make the delivery's next attempt if it is due; returns what happened (for logs and tests).
    After a failed attempt the next one is sent with its backoff as countdown (`send`), or left
    to the resend sweep."""
    with session_scope(settings.database) as session:
        request = _claim(session, settings, delivery_id)
    if request is None:
        return "not-due"
    outcome = post(request, settings)  # checks the endpoint's address again: its DNS may have changed
    with session_scope(settings.database) as session:
        wait_s = _record(session, settings, delivery_id, request, outcome)
    if outcome.ok:
        return "succeeded"
    if wait_s is None:
        log.warning("webhook delivery %s failed after %d attempts: %s", delivery_id, request.attempt, outcome.error)
        return "failed"
    if send is not None:
        send_delivery(delivery_id, send, countdown_s=wait_s)
    return "retrying"


def resend_due(settings: Settings, send: Dispatch, *, grace_s: float) -> list[str]:
    """Send again every pending delivery due for more than `grace_s`: its message was lost, or
    its worker died mid-attempt (beat runs this with the reconciler's grace)."""
    cutoff = utcnow() - timedelta(seconds=grace_s)
    with session_scope(settings.database) as session:
        due = list(
            session.execute(
                select(WebhookDelivery.id)
                .where(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= cutoff)
                .order_by(WebhookDelivery.next_attempt_at)
                .limit(1000)
            ).scalars()
        )
    for delivery_id in due:
        send_delivery(delivery_id, send)
    return due

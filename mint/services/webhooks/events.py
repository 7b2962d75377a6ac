"""Webhooks: an organization's endpoints, the events they receive, and the log of deliveries.

Events are written with the outbox pattern: `emit` adds one `webhook_deliveries` row per
enabled endpoint subscribed to the event type, in the caller's transaction, so the event
exists exactly when the change it reports does (a crash loses neither). After that
transaction commits, each delivery's id is sent to the system queue; a delivery whose message
is lost is sent again by the resend sweep (`mint.services.webhooks.delivery.resend_due`). The
worker side (signing, POSTing, retrying) is `mint.services.webhooks.delivery`.

The signing secret is made here, in Standard Webhooks form (`whsec_` + base64 of 24 random
bytes), stored as it is (Mint must sign with it) and shown only at create and rotate.
"""

from __future__ import annotations

import base64
import logging
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, event, select
from sqlalchemy.orm import Session

from mint.errors import InvalidRequest
from mint.schemas.webhooks import EVENT_TYPES, TEST_EVENT
from mint.services.audit import record_audit
from mint.services.dispatch import Dispatch
from mint.services.principal import Principal
from mint.services.webhooks import egress
from mint.storage.queries import PageResult, get_owned, owned_by, paginate
from mint.storage.tables import (
    Deployment,
    DeploymentRevision,
    EvalRun,
    TrainingJob,
    Webhook,
    WebhookDelivery,
    new_id,
    utcnow,
)

log = logging.getLogger(__name__)

DELIVER_TASK = "mint.webhooks.deliver"
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 24
# Where a session keeps the deliveries it added, with the Dispatch to send them by, until it commits.
_OUTBOX_KEY = "mint.webhook_outbox"


def new_secret() -> str:
    """A signing secret as Standard Webhooks write one: `whsec_` and base64 of random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


# --- endpoints ----------------------------------------------------------------------------


def _audited(session: Session, principal: Principal, action: str, webhook: Webhook, **data: Any) -> None:
    record_audit(session, principal, f"webhook.{action}", "webhook", webhook.id, {"url": webhook.url, **data})


def create_webhook(
    session: Session,
    principal: Principal,
    *,
    url: str,
    events: Sequence[str],
    description: str,
    enabled: bool,
    allow_private: bool = False,
) -> Webhook:
    """Add an endpoint to the caller's organization with a new secret (developer or admin); its
    host must be public unless `allow_private` (`egress`)."""
    principal.require("developer")
    egress.check_public(url, allow_private=allow_private)
    webhook = Webhook(
        id=new_id("wh"),
        organization_id=principal.organization_id,
        url=url,
        description=description,
        event_types=sorted(set(events)),
        enabled=enabled,
        secret=new_secret(),
    )
    session.add(webhook)
    session.flush()
    _audited(session, principal, "create", webhook, events=webhook.event_types)
    return webhook


def get_webhook(session: Session, organization_id: str, webhook_id: str) -> Webhook:
    return get_owned(session, Webhook, webhook_id, organization_id=organization_id, noun="webhook")


def list_webhooks(session: Session, organization_id: str, *, after: str | None, limit: int) -> PageResult[Webhook]:
    return paginate(session, owned_by(Webhook, organization_id), Webhook, after=after, limit=limit)


def update_webhook(
    session: Session,
    principal: Principal,
    webhook_id: str,
    *,
    url: str | None = None,
    events: Sequence[str] | None = None,
    description: str | None = None,
    enabled: bool | None = None,
    allow_private: bool = False,
) -> Webhook:
    """Change the fields given; the others stay. A new URL is checked as at create."""
    principal.require("developer")
    webhook = get_webhook(session, principal.organization_id, webhook_id)
    changed: dict[str, Any] = {}
    if url is not None:
        egress.check_public(url, allow_private=allow_private)
        webhook.url = changed["url"] = url
    if events is not None:
        webhook.event_types = changed["events"] = sorted(set(events))
    if description is not None:
        webhook.description = changed["description"] = description
    if enabled is not None:
        webhook.enabled = changed["enabled"] = enabled
    webhook.updated_at = utcnow()
    _audited(session, principal, "update", webhook, changed=changed)
    return webhook


def delete_webhook(session: Session, principal: Principal, webhook_id: str) -> Webhook:
    """Remove an endpoint and its delivery log; pending deliveries are not sent."""
    principal.require("developer")
    webhook = get_webhook(session, principal.organization_id, webhook_id)
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook.id))
    _audited(session, principal, "delete", webhook)
    session.delete(webhook)
    session.flush()
    return webhook


def rotate_secret(session: Session, principal: Principal, webhook_id: str) -> Webhook:
    """Give the endpoint a new secret at once: deliveries from now on are signed with it only."""
    principal.require("developer")
    webhook = get_webhook(session, principal.organization_id, webhook_id)
    webhook.secret = new_secret()
    webhook.updated_at = utcnow()
    _audited(session, principal, "rotate_secret", webhook)
    return webhook


# --- events (the outbox) ------------------------------------------------------------------


def event_payload(event_id: str, event_type: str, created_at: datetime, data: dict[str, Any]) -> dict[str, Any]:
    """The body every delivery POSTs."""
    return {"id": event_id, "type": event_type, "created_at": created_at.isoformat(), "data": data}


def _new_delivery(webhook: Webhook, payload: dict[str, Any]) -> WebhookDelivery:
    return WebhookDelivery(
        id=new_id("whdel"),
        organization_id=webhook.organization_id,
        webhook_id=webhook.id,
        event_id=payload["id"],
        event_type=payload["type"],
        payload=payload,
        status="pending",
        attempts=0,
        next_attempt_at=utcnow(),
        attempt_log=[],
    )


def emit(
    session: Session, *, organization_id: str, event_type: str, data: dict[str, Any], send: Dispatch | None
) -> list[WebhookDelivery]:
    """Record `event_type` about `data` for every enabled endpoint of the organization that
    subscribes to it, in the caller's transaction; `send` (if given) sends them once it commits.
    Any service may call this, e.g. auto mode with `autotune.run.completed`."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown webhook event type {event_type!r}; add it to mint.schemas.webhooks.EventType")
    endpoints = session.execute(
        select(Webhook).where(Webhook.organization_id == organization_id, Webhook.enabled.is_(True))
    ).scalars()
    subscribed = [webhook for webhook in endpoints if event_type in webhook.event_types]
    if not subscribed:
        return []
    payload = event_payload(new_id("evt"), event_type, utcnow(), data)
    deliveries = [_new_delivery(webhook, payload) for webhook in subscribed]
    session.add_all(deliveries)
    send_after_commit(session, [delivery.id for delivery in deliveries], send)
    return deliveries


def send_delivery(delivery_id: str, send: Dispatch, *, countdown_s: float | None = None) -> None:
    """Publish one delivery's message; if the broker is down, the resend sweep sends it later."""
    try:
        send(DELIVER_TASK, args=[delivery_id], countdown_s=countdown_s)
    except Exception:  # noqa: BLE001 - the row is committed; resend_due sends it when it is due
        log.warning("could not send webhook delivery %s now; the resend sweep will", delivery_id, exc_info=True)


def _flush_outbox(session: Session) -> None:
    for delivery_id, send in session.info.pop(_OUTBOX_KEY, []):
        send_delivery(delivery_id, send)


def _drop_outbox(session: Session) -> None:
    session.info.pop(_OUTBOX_KEY, None)


def send_after_commit(session: Session, delivery_ids: list[str], send: Dispatch | None) -> None:
    """Send the deliveries when `session` commits (never before: a worker must find their rows);
    forget them if it rolls back. Without `send` the resend sweep sends them."""
    if send is None or not delivery_ids:
        return
    if not event.contains(session, "after_commit", _flush_outbox):
        event.listen(session, "after_commit", _flush_outbox)
        event.listen(session, "after_rollback", _drop_outbox)
    session.info.setdefault(_OUTBOX_KEY, []).extend((delivery_id, send) for delivery_id in delivery_ids)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def job_event(session: Session, job: TrainingJob, send: Dispatch | None, *, model: str | None = None) -> None:
    """`fine_tuning.job.<status>` for a job that just ended (`model`: its adapter version, if any)."""
    data = {
        "id": job.id,
        "object": "fine_tuning.job",
        "status": job.status,
        "model": job.base_model,
        "fine_tuned_model": model,
        "suffix": job.suffix,
        "completed_steps": job.completed_steps,
        "trained_tokens": job.trained_tokens,
        "error": job.error,
        "created_at": _iso(job.created_at),
        "finished_at": _iso(job.finished_at),
    }
    emit(session, organization_id=job.organization_id, event_type=f"fine_tuning.job.{job.status}", data=data, send=send)


def eval_run_event(session: Session, run: EvalRun, send: Dispatch | None) -> None:
    """`eval.run.completed` or `eval.run.failed` for a run that just ended."""
    data = {
        "id": run.id,
        "object": "eval.run",
        "status": run.status,
        "model": run.model_ref,
        "benchmark_version_id": run.benchmark_version_id,
        "split": run.split,
        "metrics": run.metrics,
        "error": run.error,
        "created_at": _iso(run.created_at),
        "finished_at": _iso(run.finished_at),
    }
    event_type = "eval.run.completed" if run.status == "succeeded" else "eval.run.failed"
    emit(session, organization_id=run.organization_id, event_type=event_type, data=data, send=send)


DEPLOYMENT_EVENTS = {
    "promote": "deployment.promoted",
    "rollback": "deployment.rolled_back",
    "withdraw": "deployment.withdrawn",
}


def deployment_event(
    session: Session, deployment: Deployment, revision: DeploymentRevision, send: Dispatch | None
) -> None:
    """`deployment.promoted`, `.rolled_back` or `.withdrawn` for a revision just added (others send nothing)."""
    event_type = DEPLOYMENT_EVENTS.get(revision.action)
    if event_type is None:
        return
    data = {
        "id": deployment.id,
        "object": "deployment",
        "name": deployment.name,
        "status": deployment.status,
        "base_model": deployment.base_model,
        "revision": revision.revision,
        "action": revision.action,
        "adapter_version_id": revision.adapter_version_id,
        "reason": revision.reason,
    }
    emit(session, organization_id=deployment.organization_id, event_type=event_type, data=data, send=send)


def autotune_event(
    session: Session, *, organization_id: str, data: dict[str, Any], completed: bool, send: Dispatch | None
) -> None:
    """`autotune.run.completed` or `autotune.run.failed`, for auto mode to call in the
    transaction that ends a run; `data` summarizes the run (at least its `id` and `status`)."""
    event_type = "autotune.run.completed" if completed else "autotune.run.failed"
    emit(session, organization_id=organization_id, event_type=event_type, data=data, send=send)


# --- the delivery log ---------------------------------------------------------------------


def list_deliveries(
    session: Session, organization_id: str, webhook_id: str, *, after: str | None, limit: int
) -> PageResult[WebhookDelivery]:
    """The endpoint's deliveries, newest first."""
    webhook = get_webhook(session, organization_id, webhook_id)
    query = owned_by(WebhookDelivery, organization_id).where(WebhookDelivery.webhook_id == webhook.id)
    return paginate(session, query, WebhookDelivery, after=after, limit=limit)


def redeliver(
    session: Session, principal: Principal, webhook_id: str, delivery_id: str, *, send: Dispatch
) -> WebhookDelivery:
    """Send a delivery's event again, as a new delivery (same event id, so receivers can tell)."""
    principal.require("developer")
    webhook = get_webhook(session, principal.organization_id, webhook_id)
    original = get_owned(
        session, WebhookDelivery, delivery_id, organization_id=principal.organization_id, noun="webhook delivery"
    )
    if original.webhook_id != webhook.id:
        raise InvalidRequest(
            f"delivery {delivery_id!r} belongs to another webhook; "
            f"list this one's with GET /v1/webhooks/{webhook.id}/deliveries",
            param="delivery_id",
        )
    delivery = _new_delivery(webhook, dict(original.payload))
    session.add(delivery)
    session.flush()
    send_after_commit(session, [delivery.id], send)
    return delivery


def send_test(session: Session, principal: Principal, webhook_id: str, *, send: Dispatch) -> WebhookDelivery:
    """A `webhook.test` event to this endpoint alone, whatever it subscribes to."""
    principal.require("developer")
    webhook = get_webhook(session, principal.organization_id, webhook_id)
    data = {"id": webhook.id, "object": "webhook", "url": webhook.url, "message": "A test event from Mint."}
    delivery = _new_delivery(webhook, event_payload(new_id("evt"), TEST_EVENT, utcnow(), data))
    session.add(delivery)
    session.flush()
    send_after_commit(session, [delivery.id], send)
    return delivery

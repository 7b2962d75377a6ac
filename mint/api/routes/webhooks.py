"""Webhooks: endpoints that receive signed events (jobs, eval runs, deployments, auto mode),
their delivery log, redelivery, and a test event.

Every delivery is signed as Standard Webhooks specify (`webhook-id`, `webhook-timestamp`,
`webhook-signature`); verify it with the secret shown at create or rotate, e.g.
`standardwebhooks.Webhook(secret).verify(body, headers)`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from mint.api.deps import CurrentPrincipal, DispatchDep, SessionDep, SettingsDep
from mint.api.pagination import After, Limit, id_path, page_of
from mint.schemas.common import Page
from mint.schemas.webhooks import DeliveryPublic, WebhookCreate, WebhookPublic, WebhookUpdate, WebhookWithSecret
from mint.services.webhooks import events as webhooks
from mint.storage.tables import Webhook, WebhookDelivery

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])

WebhookId = Annotated[str, id_path("The webhook's id, e.g. `wh_...`.")]
DeliveryId = Annotated[str, id_path("The delivery's id, e.g. `whdel_...`.")]


def _with_secret(webhook: Webhook) -> WebhookWithSecret:
    return WebhookWithSecret.model_validate(
        {**WebhookPublic.model_validate(webhook).model_dump(), "secret": webhook.secret}
    )


@router.post("", response_model=WebhookWithSecret, status_code=201)
def create_webhook(
    body: WebhookCreate, session: SessionDep, principal: CurrentPrincipal, settings: SettingsDep
) -> WebhookWithSecret:
    """Add an endpoint for the event types given. The signing secret is in this response only.
    Its host must resolve to public addresses (unless the operator allows private networks)."""
    webhook = webhooks.create_webhook(
        session,
        principal,
        url=body.url,
        events=body.events,
        description=body.description,
        enabled=body.enabled,
        allow_private=settings.webhook_allow_private_networks,
    )
    return _with_secret(webhook)


@router.get("", response_model=Page[WebhookPublic])
def list_webhooks(
    session: SessionDep, principal: CurrentPrincipal, after: After = None, limit: Limit = 20
) -> Page[WebhookPublic]:
    """This organization's endpoints, newest first, never their secrets."""
    return page_of(webhooks.list_webhooks(session, principal.organization_id, after=after, limit=limit), WebhookPublic)


@router.get("/{webhook_id}", response_model=WebhookPublic)
def get_webhook(webhook_id: WebhookId, session: SessionDep, principal: CurrentPrincipal) -> Webhook:
    return webhooks.get_webhook(session, principal.organization_id, webhook_id)


@router.post("/{webhook_id}", response_model=WebhookPublic)
def update_webhook(
    webhook_id: WebhookId, body: WebhookUpdate, session: SessionDep, principal: CurrentPrincipal, settings: SettingsDep
) -> Webhook:
    """Change the URL, the event types, the description or whether it is enabled; the rest stays."""
    return webhooks.update_webhook(
        session,
        principal,
        webhook_id,
        url=body.url,
        events=body.events,
        description=body.description,
        enabled=body.enabled,
        allow_private=settings.webhook_allow_private_networks,
    )


@router.delete("/{webhook_id}", response_model=WebhookPublic)
def delete_webhook(webhook_id: WebhookId, session: SessionDep, principal: CurrentPrincipal) -> WebhookPublic:
    """Remove the endpoint and its delivery log; events not yet delivered are dropped."""
    return WebhookPublic.model_validate(webhooks.delete_webhook(session, principal, webhook_id))


@router.post("/{webhook_id}/rotate_secret", response_model=WebhookWithSecret)
def rotate_secret(webhook_id: WebhookId, session: SessionDep, principal: CurrentPrincipal) -> WebhookWithSecret:
    """A new signing secret, at once: deliveries from now on are signed with it only."""
    return _with_secret(webhooks.rotate_secret(session, principal, webhook_id))


@router.get("/{webhook_id}/deliveries", response_model=Page[DeliveryPublic])
def list_deliveries(
    webhook_id: WebhookId, session: SessionDep, principal: CurrentPrincipal, after: After = None, limit: Limit = 20
) -> Page[DeliveryPublic]:
    """The endpoint's deliveries, newest first, each with every attempt it took."""
    result = webhooks.list_deliveries(session, principal.organization_id, webhook_id, after=after, limit=limit)
    return page_of(result, DeliveryPublic)


@router.post("/{webhook_id}/deliveries/{delivery_id}/redeliver", response_model=DeliveryPublic, status_code=201)
def redeliver(
    webhook_id: WebhookId, delivery_id: DeliveryId, session: SessionDep, principal: CurrentPrincipal, send: DispatchDep
) -> WebhookDelivery:
    """Send a delivery's event again, as a new delivery with the same event id."""
    return webhooks.redeliver(session, principal, webhook_id, delivery_id, send=send)


@router.post("/{webhook_id}/test", response_model=DeliveryPublic, status_code=201)
def send_test(
    webhook_id: WebhookId, session: SessionDep, principal: CurrentPrincipal, send: DispatchDep
) -> WebhookDelivery:
    """Send a `webhook.test` event to this endpoint (whatever event types it subscribes to)."""
    return webhooks.send_test(session, principal, webhook_id, send=send)

"""Webhooks: endpoints that receive Mint's events signed as Standard Webhooks specify.

```python
hook = client.webhooks.create("https://example.com/mint", events=["fine_tuning.job.succeeded"])
secret = hook.secret                     # shown this once; verify deliveries with it
for delivery in client.webhooks.deliveries(hook.id):
    print(delivery.event_type, delivery.status, delivery.attempts)
```

A receiver checks each POST with `standardwebhooks.Webhook(secret).verify(body, headers)`.
"""

from __future__ import annotations

import builtins
from typing import Any

from mint.schemas.common import Page
from mint.schemas.webhooks import DeliveryPublic, WebhookCreate, WebhookPublic, WebhookUpdate, WebhookWithSecret
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_model, request_body
from mint.sdk.pagination import AsyncPager, PageCall, SyncPager


def create_webhook(fields: dict[str, Any]) -> Call[WebhookWithSecret]:
    body = request_body(WebhookCreate, **fields)
    return Call("POST", "/v1/webhooks", parse_model(WebhookWithSecret), json=body)


def get_webhook(webhook_id: str) -> Call[WebhookPublic]:
    return Call("GET", f"/v1/webhooks/{webhook_id}", parse_model(WebhookPublic))


def list_webhooks(limit: int) -> PageCall:
    return lambda after: Call("GET", "/v1/webhooks", parse_model(Page[WebhookPublic]), {"after": after, "limit": limit})


def update_webhook(webhook_id: str, fields: dict[str, Any]) -> Call[WebhookPublic]:
    body = request_body(WebhookUpdate, **fields)
    return Call("POST", f"/v1/webhooks/{webhook_id}", parse_model(WebhookPublic), json=body)


def delete_webhook(webhook_id: str) -> Call[WebhookPublic]:
    return Call("DELETE", f"/v1/webhooks/{webhook_id}", parse_model(WebhookPublic))


def rotate_secret(webhook_id: str) -> Call[WebhookWithSecret]:
    return Call("POST", f"/v1/webhooks/{webhook_id}/rotate_secret", parse_model(WebhookWithSecret))


def send_test(webhook_id: str) -> Call[DeliveryPublic]:
    return Call("POST", f"/v1/webhooks/{webhook_id}/test", parse_model(DeliveryPublic))


def list_deliveries(webhook_id: str, limit: int) -> PageCall:
    path = f"/v1/webhooks/{webhook_id}/deliveries"
    return lambda after: Call("GET", path, parse_model(Page[DeliveryPublic]), {"after": after, "limit": limit})


def redeliver(webhook_id: str, delivery_id: str) -> Call[DeliveryPublic]:
    path = f"/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver"
    return Call("POST", path, parse_model(DeliveryPublic))


def _fields(
    url: str | None, events: builtins.list[str] | None, description: str | None, enabled: bool | None
) -> dict[str, Any]:
    return {"url": url, "events": events, "description": description, "enabled": enabled}


class Webhooks:
    """`/v1/webhooks`: endpoints, their secrets, and the log of what was delivered to them."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def create(
        self, url: str, *, events: builtins.list[str], description: str = "", enabled: bool = True
    ) -> WebhookWithSecret:
        """Add an endpoint for `events`; the answer's `secret` is shown this once."""
        return self._http.send(create_webhook(_fields(url, events, description or None, enabled)))

    def get(self, webhook_id: str) -> WebhookPublic:
        return self._http.send(get_webhook(webhook_id))

    def list(self, *, limit: int = 20) -> SyncPager[WebhookPublic]:
        return SyncPager(self._http, list_webhooks(limit))

    def update(
        self,
        webhook_id: str,
        *,
        url: str | None = None,
        events: builtins.list[str] | None = None,
        description: str | None = None,
        enabled: bool | None = None,
    ) -> WebhookPublic:
        """Change the fields given; the others stay."""
        return self._http.send(update_webhook(webhook_id, _fields(url, events, description, enabled)))

    def delete(self, webhook_id: str) -> WebhookPublic:
        return self._http.send(delete_webhook(webhook_id))

    def rotate_secret(self, webhook_id: str) -> WebhookWithSecret:
        """A new signing secret, in use at once; the old one stops verifying."""
        return self._http.send(rotate_secret(webhook_id))

    def test(self, webhook_id: str) -> DeliveryPublic:
        """Send a `webhook.test` event to the endpoint."""
        return self._http.send(send_test(webhook_id))

    def deliveries(self, webhook_id: str, *, limit: int = 20) -> SyncPager[DeliveryPublic]:
        """The endpoint's deliveries, newest first, each with its attempts."""
        return SyncPager(self._http, list_deliveries(webhook_id, limit))

    def redeliver(self, webhook_id: str, delivery_id: str) -> DeliveryPublic:
        return self._http.send(redeliver(webhook_id, delivery_id))


class AsyncWebhooks:
    """`/v1/webhooks`, for asyncio: the twin of `Webhooks`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def create(
        self, url: str, *, events: builtins.list[str], description: str = "", enabled: bool = True
    ) -> WebhookWithSecret:
        return await self._http.send(create_webhook(_fields(url, events, description or None, enabled)))

    async def get(self, webhook_id: str) -> WebhookPublic:
        return await self._http.send(get_webhook(webhook_id))

    def list(self, *, limit: int = 20) -> AsyncPager[WebhookPublic]:
        return AsyncPager(self._http, list_webhooks(limit))

    async def update(
        self,
        webhook_id: str,
        *,
        url: str | None = None,
        events: builtins.list[str] | None = None,
        description: str | None = None,
        enabled: bool | None = None,
    ) -> WebhookPublic:
        return await self._http.send(update_webhook(webhook_id, _fields(url, events, description, enabled)))

    async def delete(self, webhook_id: str) -> WebhookPublic:
        return await self._http.send(delete_webhook(webhook_id))

    async def rotate_secret(self, webhook_id: str) -> WebhookWithSecret:
        return await self._http.send(rotate_secret(webhook_id))

    async def test(self, webhook_id: str) -> DeliveryPublic:
        return await self._http.send(send_test(webhook_id))

    def deliveries(self, webhook_id: str, *, limit: int = 20) -> AsyncPager[DeliveryPublic]:
        return AsyncPager(self._http, list_deliveries(webhook_id, limit))

    async def redeliver(self, webhook_id: str, delivery_id: str) -> DeliveryPublic:
        return await self._http.send(redeliver(webhook_id, delivery_id))

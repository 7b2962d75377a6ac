"""`mint webhooks ...`: endpoints that receive signed events, their secrets, and the log of
deliveries. The secret is printed once, by `create` and `rotate-secret`."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

import typer

from mint.cli.options import LimitOpt, Remote, first, remote
from mint.cli.output import human
from mint.schemas.webhooks import EVENT_TYPES

app = typer.Typer(help="Webhooks: endpoints that receive signed events.", no_args_is_help=True)

COLUMNS = ["id", "url", "events", "enabled", "description"]
SECRET_COLUMNS = [*COLUMNS, "secret"]
DELIVERY_COLUMNS = ["id", "event_type", "status", "attempts", "last", "created_at"]
WebhookArg = Annotated[str, typer.Argument(help="The webhook's id (wh_...).")]
EventsOpt = Annotated[
    list[str],
    typer.Option("--event", help=f"An event type to receive (repeat the option): {', '.join(EVENT_TYPES)}."),
]


def delivery_row(delivery: Any) -> dict[str, Any]:
    """A delivery and how its last attempt went, for people."""
    last = delivery.attempt_log[-1] if delivery.attempt_log else None
    outcome = (last.error or f"HTTP {last.status_code}") if last else None
    return human(
        {
            "id": delivery.id,
            "event_type": delivery.event_type,
            "status": delivery.status,
            "attempts": delivery.attempts,
            "last": outcome,
            "created_at": delivery.created_at,
        }
    )


@app.command("create")
@remote
def create(
    api: Remote,
    url: Annotated[str, typer.Argument(help="Where events are POSTed (http or https).")],
    events: EventsOpt,
    description: Annotated[str, typer.Option("--description", help="A note for people.")] = "",
) -> None:
    """Add an endpoint; prints its signing secret, which is not shown again."""
    with api.client() as client:
        webhook = client.webhooks.create(url, events=events, description=description)
    api.show(webhook, SECRET_COLUMNS)


@app.command("list")
@remote
def list_webhooks(api: Remote, limit: LimitOpt = 20) -> None:
    """The organization's endpoints, newest first."""
    with api.client() as client:
        rows = first(client.webhooks.list, limit)
    api.table(rows, COLUMNS, title="webhooks")


@app.command("delete")
@remote
def delete(api: Remote, webhook_id: WebhookArg) -> None:
    """Remove an endpoint and its delivery log."""
    with api.client() as client:
        webhook = client.webhooks.delete(webhook_id)
    api.show(webhook, COLUMNS)


@app.command("rotate-secret")
@remote
def rotate_secret(api: Remote, webhook_id: WebhookArg) -> None:
    """Give the endpoint a new signing secret at once; prints it."""
    with api.client() as client:
        webhook = client.webhooks.rotate_secret(webhook_id)
    api.show(webhook, SECRET_COLUMNS)


@app.command("test")
@remote
def send_test(api: Remote, webhook_id: WebhookArg) -> None:
    """Send a `webhook.test` event to the endpoint; `mint webhooks deliveries` shows how it went."""
    with api.client() as client:
        delivery = client.webhooks.test(webhook_id)
    api.show(delivery, delivery_row(delivery))


@app.command("deliveries")
@remote
def deliveries(api: Remote, webhook_id: WebhookArg, limit: LimitOpt = 20) -> None:
    """The endpoint's deliveries, newest first, with how the last attempt of each went."""
    with api.client() as client:
        rows = first(partial(client.webhooks.deliveries, webhook_id), limit)
    api.table(rows, DELIVERY_COLUMNS, title=f"deliveries of {webhook_id}", row=delivery_row)


@app.command("redeliver")
@remote
def redeliver(api: Remote, webhook_id: WebhookArg, delivery_id: Annotated[str, typer.Argument()]) -> None:
    """Send a delivery's event again (a new delivery, the same event id)."""
    with api.client() as client:
        delivery = client.webhooks.redeliver(webhook_id, delivery_id)
    api.show(delivery, delivery_row(delivery))

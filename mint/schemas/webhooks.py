"""Wire types for webhooks: the event catalogue, endpoints, and the log of their deliveries.

A delivery is signed as Standard Webhooks specify (`webhook-id`, `webhook-timestamp`,
`webhook-signature` headers); its body is an event: `{"id", "type", "created_at", "data"}`,
where `data` summarizes the resource the event is about.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import AfterValidator, AliasChoices, ConfigDict, Field

from mint.schemas.common import RequestModel, WireModel

EventType = Literal[
    "fine_tuning.job.succeeded",
    "fine_tuning.job.failed",
    "fine_tuning.job.cancelled",
    "eval.run.completed",
    "eval.run.failed",
    "deployment.promoted",
    "deployment.rolled_back",
    "deployment.withdrawn",
    "autotune.run.completed",
    "autotune.run.failed",
]
# The events an endpoint can subscribe to; `webhook.test` is sent on request only (`/test`).
EVENT_TYPES: tuple[str, ...] = get_args(EventType)
TEST_EVENT = "webhook.test"
MAX_URL_LENGTH = 2000


def _http_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host, e.g. https://example.com/mint-events")
    return url


WebhookUrl = Annotated[
    str,
    Field(min_length=1, max_length=MAX_URL_LENGTH, description="Where events are POSTed (http or https)."),
    AfterValidator(_http_url),
]
EventTypes = Annotated[
    list[EventType],
    Field(min_length=1, max_length=len(EVENT_TYPES), description="The event types this endpoint receives."),
]
Description = Annotated[str, Field(max_length=2000, pattern=r"^[^\x00]*$", description="A note for people.")]


class _Request(RequestModel):
    model_config = ConfigDict(extra="forbid")


class WebhookCreate(_Request):
    url: WebhookUrl
    events: EventTypes
    description: Description = ""
    enabled: bool = True


class WebhookUpdate(_Request):
    """Only the fields given change."""

    url: WebhookUrl | None = None
    events: EventTypes | None = None
    description: Description | None = None
    enabled: bool | None = None


class WebhookPublic(WireModel):
    """An endpoint as lists show it: never its secret."""

    id: str
    object: Literal["webhook"] = "webhook"
    url: str
    description: str
    events: list[str] = Field(validation_alias=AliasChoices("event_types", "events"))
    enabled: bool
    created_at: datetime
    updated_at: datetime


class WebhookWithSecret(WebhookPublic):
    """The answer to a create or a secret rotation: the only time the secret is shown."""

    secret: str = Field(description="The signing secret (`whsec_...`). Store it now: it is not shown again.")


class DeliveryAttempt(WireModel):
    attempt: int
    at: datetime
    status_code: int | None = Field(description="The receiver's HTTP status; None when no answer came.")
    response: str = Field(description="The start of the receiver's answer.")
    error: str | None = Field(description="Why the attempt failed: a network error or a non-2xx status.")
    duration_ms: float


class DeliveryPublic(WireModel):
    id: str
    object: Literal["webhook.delivery"] = "webhook.delivery"
    webhook_id: str
    event_id: str
    event_type: str
    status: Literal["pending", "succeeded", "failed"]
    attempts: int
    next_attempt_at: datetime | None
    attempt_log: list[DeliveryAttempt]
    payload: dict[str, Any]
    created_at: datetime
    finished_at: datetime | None

"""Wire types for reward endpoints: the servers a team hosts that the `remote` grader calls.

Mint POSTs `{"type": "reward.request", "items": [...]}` to the endpoint's URL, signed as
webhooks are (Standard Webhooks headers, the endpoint's `whsec_...` secret), and reads back
`{"rewards": [float, ...], "details": [str | null, ...]?}`, one finite reward per item. The
protocol's constants live here, for both of its sides: Mint's caller
(`mint.services.evals.remote_rewards`) and the team's server (`mint.integrations.reward_server`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from mint.schemas.common import RequestModel, WireModel
from mint.schemas.webhooks import Description, WebhookUrl

# The `type` of every request Mint POSTs to a reward endpoint.
REWARD_REQUEST_TYPE = "reward.request"
# The largest answer Mint reads; a server drops its details rather than answer longer.
MAX_REWARD_ANSWER_BYTES = 1024 * 1024

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"

EndpointName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=100,
        pattern=NAME_PATTERN,
        description="How graders name this endpoint (`remote` grader's `endpoint`), unique in the organization: "
        "letters, digits, '_', '.' or '-', e.g. `math-verify`.",
    ),
]


class _Request(RequestModel):
    model_config = ConfigDict(extra="forbid")


class RewardEndpointCreate(_Request):
    name: EndpointName
    url: WebhookUrl
    description: Description = ""


class RewardEndpointUpdate(_Request):
    """Only the fields given change."""

    url: WebhookUrl | None = None
    description: Description | None = None


class RewardEndpointPublic(WireModel):
    """An endpoint as lists show it: never its secret."""

    id: str
    object: Literal["reward_endpoint"] = "reward_endpoint"
    name: str
    url: str
    description: str
    created_at: datetime
    updated_at: datetime


class RewardEndpointWithSecret(RewardEndpointPublic):
    """The answer to a create or a secret rotation: the only time the secret is shown."""

    secret: str = Field(description="The signing secret (`whsec_...`). Store it now: it is not shown again.")

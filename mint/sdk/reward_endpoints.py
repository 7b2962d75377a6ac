"""Reward endpoints: the servers a team hosts that `remote` graders call to score outputs.

```python
endpoint = client.reward_endpoints.create("math-verify", "https://rewards.example.com/score")
secret = endpoint.secret                 # shown this once; the server verifies requests with it
grader = {"type": "remote", "config": {"endpoint": "math-verify"}}
```

A server checks each POST with `standardwebhooks.Webhook(secret).verify(body, headers)`
(`mint reward-server` does).
"""

from __future__ import annotations

from typing import Any

from mint.schemas.common import Page
from mint.schemas.reward_endpoints import (
    RewardEndpointCreate,
    RewardEndpointPublic,
    RewardEndpointUpdate,
    RewardEndpointWithSecret,
)
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_model, request_body
from mint.sdk.pagination import AsyncPager, PageCall, SyncPager

PATH = "/v1/reward_endpoints"


def create_endpoint(fields: dict[str, Any]) -> Call[RewardEndpointWithSecret]:
    body = request_body(RewardEndpointCreate, **fields)
    return Call("POST", PATH, parse_model(RewardEndpointWithSecret), json=body)


def get_endpoint(ref: str) -> Call[RewardEndpointPublic]:
    return Call("GET", f"{PATH}/{ref}", parse_model(RewardEndpointPublic))


def list_endpoints(limit: int) -> PageCall:
    return lambda after: Call("GET", PATH, parse_model(Page[RewardEndpointPublic]), {"after": after, "limit": limit})


def update_endpoint(ref: str, fields: dict[str, Any]) -> Call[RewardEndpointPublic]:
    body = request_body(RewardEndpointUpdate, **fields)
    return Call("PATCH", f"{PATH}/{ref}", parse_model(RewardEndpointPublic), json=body)


def delete_endpoint(ref: str) -> Call[RewardEndpointPublic]:
    return Call("DELETE", f"{PATH}/{ref}", parse_model(RewardEndpointPublic))


def rotate_secret(ref: str) -> Call[RewardEndpointWithSecret]:
    return Call("POST", f"{PATH}/{ref}/rotate_secret", parse_model(RewardEndpointWithSecret))


class RewardEndpoints:
    """`/v1/reward_endpoints`: reward servers by name, and their signing secrets. `ref` is an id or a name."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def create(self, name: str, url: str, *, description: str = "") -> RewardEndpointWithSecret:
        """Add an endpoint that graders name `name`; the answer's `secret` is shown this once."""
        return self._http.send(create_endpoint({"name": name, "url": url, "description": description or None}))

    def get(self, ref: str) -> RewardEndpointPublic:
        return self._http.send(get_endpoint(ref))

    def list(self, *, limit: int = 20) -> SyncPager[RewardEndpointPublic]:
        return SyncPager(self._http, list_endpoints(limit))

    def update(self, ref: str, *, url: str | None = None, description: str | None = None) -> RewardEndpointPublic:
        """Change the fields given; the others stay."""
        return self._http.send(update_endpoint(ref, {"url": url, "description": description}))

    def delete(self, ref: str) -> RewardEndpointPublic:
        return self._http.send(delete_endpoint(ref))

    def rotate_secret(self, ref: str) -> RewardEndpointWithSecret:
        """A new signing secret, in use at once; the old one stops verifying."""
        return self._http.send(rotate_secret(ref))


class AsyncRewardEndpoints:
    """`/v1/reward_endpoints`, for asyncio: the twin of `RewardEndpoints`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def create(self, name: str, url: str, *, description: str = "") -> RewardEndpointWithSecret:
        return await self._http.send(create_endpoint({"name": name, "url": url, "description": description or None}))

    async def get(self, ref: str) -> RewardEndpointPublic:
        return await self._http.send(get_endpoint(ref))

    def list(self, *, limit: int = 20) -> AsyncPager[RewardEndpointPublic]:
        return AsyncPager(self._http, list_endpoints(limit))

    async def update(self, ref: str, *, url: str | None = None, description: str | None = None) -> RewardEndpointPublic:
        return await self._http.send(update_endpoint(ref, {"url": url, "description": description}))

    async def delete(self, ref: str) -> RewardEndpointPublic:
        return await self._http.send(delete_endpoint(ref))

    async def rotate_secret(self, ref: str) -> RewardEndpointWithSecret:
        return await self._http.send(rotate_secret(ref))

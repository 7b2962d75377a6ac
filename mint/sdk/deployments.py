"""Deployments: a stable model name that serves one adapter version (or a mixture) and changes
only by revisions: create, promote, roll back, withdraw, each recorded with its reason.

Send the deployment's name as `model` to `client.chat.create`; each answer says which adapter
version served it. A gated deployment refuses a promotion whose eval falls short with a
`ConflictError` whose `verdict` holds the gate's numbers.
"""

from __future__ import annotations

import builtins
from typing import Any

from mint.schemas.captures import CapturePublic, CaptureUpdate
from mint.schemas.common import Page
from mint.schemas.deployments import (
    DeploymentCreate,
    DeploymentPublic,
    PromoteRequest,
    RevisionPublic,
    RollbackRequest,
    WithdrawRequest,
)
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_list, parse_model, request_body
from mint.sdk.pagination import AsyncPager, PageCall, SyncPager


def create_deployment(fields: dict[str, Any]) -> Call[DeploymentPublic]:
    return Call("POST", "/v1/deployments", parse_model(DeploymentPublic), json=request_body(DeploymentCreate, **fields))


def get_deployment(deployment: str) -> Call[DeploymentPublic]:
    return Call("GET", f"/v1/deployments/{deployment}", parse_model(DeploymentPublic))


def list_deployments(limit: int) -> PageCall:
    return lambda after: Call(
        "GET", "/v1/deployments", parse_model(Page[DeploymentPublic]), {"after": after, "limit": limit}
    )


def change(deployment: str, action: str, schema: type[Any], fields: dict[str, Any]) -> Call[DeploymentPublic]:
    body = request_body(schema, **fields)
    return Call("POST", f"/v1/deployments/{deployment}/{action}", parse_model(DeploymentPublic), json=body)


def set_capture(deployment: str, fields: dict[str, Any]) -> Call[DeploymentPublic]:
    body = request_body(CaptureUpdate, **fields)
    return Call("PATCH", f"/v1/deployments/{deployment}/capture", parse_model(DeploymentPublic), json=body)


def list_captures(deployment: str, limit: int) -> PageCall:
    return lambda after: Call(
        "GET",
        f"/v1/deployments/{deployment}/captures",
        parse_model(Page[CapturePublic]),
        {"after": after, "limit": limit},
    )


def list_revisions(deployment: str) -> Call[list[RevisionPublic]]:
    return Call("GET", f"/v1/deployments/{deployment}/revisions", parse_list(RevisionPublic))


class Deployments:
    """`/v1/deployments`: serve adapter versions under stable names; every change a revision.

    Methods take the deployment's id (`deploy_...`) or its name.
    """

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def create(
        self,
        name: str,
        *,
        model: str | None = None,
        mixture: dict[str, Any] | None = None,
        gate: dict[str, Any] | None = None,
        reason: str = "",
    ) -> DeploymentPublic:
        """Serve `model` (an adapter version, `name@N`) or a `mixture` under `name`; revision 1.

        A `gate` (`{benchmark, min_pass_rate?, max_regression?, ...}`) is then required of every
        promotion.
        """
        fields = {"name": name, "model": model, "mixture": mixture, "gate": gate, "reason": reason or None}
        return self._http.send(create_deployment(fields))

    def get(self, deployment: str) -> DeploymentPublic:
        return self._http.send(get_deployment(deployment))

    def list(self, *, limit: int = 20) -> SyncPager[DeploymentPublic]:
        return SyncPager(self._http, list_deployments(limit))

    def promote(
        self, deployment: str, *, model: str | None = None, mixture: dict[str, Any] | None = None, reason: str = ""
    ) -> DeploymentPublic:
        """Serve another version (or mixture); a gated deployment checks it first."""
        fields = {"model": model, "mixture": mixture, "reason": reason or None}
        return self._http.send(change(deployment, "promote", PromoteRequest, fields))

    def rollback(self, deployment: str, *, to_revision: int | None = None, reason: str = "") -> DeploymentPublic:
        """Serve again what an earlier revision served (the previous one by default)."""
        fields = {"to_revision": to_revision, "reason": reason or None}
        return self._http.send(change(deployment, "rollback", RollbackRequest, fields))

    def withdraw(self, deployment: str, *, reason: str = "") -> DeploymentPublic:
        """Stop serving until a version is promoted again."""
        return self._http.send(change(deployment, "withdraw", WithdrawRequest, {"reason": reason or None}))

    def revisions(self, deployment: str) -> builtins.list[RevisionPublic]:
        """Every revision, newest first: what served, why, and the gate's verdict."""
        return self._http.send(list_revisions(deployment))

    def set_capture(
        self,
        deployment: str,
        *,
        rate: float | None = None,
        retention_days: int | None = None,
        tokens: bool | None = None,
    ) -> DeploymentPublic:
        """Record `rate` (0 to 1; 0 stops) of the requests it serves, each kept `retention_days`;
        with `tokens`, also the turns of the episodes its clients mark (`X-Mint-Episode`),
        token-exact, for online RL (see `client.episodes`). An argument left out is unchanged."""
        fields = {"rate": rate, "retention_days": retention_days, "tokens": tokens}
        return self._http.send(set_capture(deployment, fields))

    def captures(self, deployment: str, *, limit: int = 20) -> SyncPager[CapturePublic]:
        """The requests it captured, newest first, each with its feedback."""
        return SyncPager(self._http, list_captures(deployment, limit))


class AsyncDeployments:
    """`/v1/deployments`, for asyncio: the twin of `Deployments`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def create(
        self,
        name: str,
        *,
        model: str | None = None,
        mixture: dict[str, Any] | None = None,
        gate: dict[str, Any] | None = None,
        reason: str = "",
    ) -> DeploymentPublic:
        fields = {"name": name, "model": model, "mixture": mixture, "gate": gate, "reason": reason or None}
        return await self._http.send(create_deployment(fields))

    async def get(self, deployment: str) -> DeploymentPublic:
        return await self._http.send(get_deployment(deployment))

    def list(self, *, limit: int = 20) -> AsyncPager[DeploymentPublic]:
        return AsyncPager(self._http, list_deployments(limit))

    async def promote(
        self, deployment: str, *, model: str | None = None, mixture: dict[str, Any] | None = None, reason: str = ""
    ) -> DeploymentPublic:
        fields = {"model": model, "mixture": mixture, "reason": reason or None}
        return await self._http.send(change(deployment, "promote", PromoteRequest, fields))

    async def rollback(self, deployment: str, *, to_revision: int | None = None, reason: str = "") -> DeploymentPublic:
        fields = {"to_revision": to_revision, "reason": reason or None}
        return await self._http.send(change(deployment, "rollback", RollbackRequest, fields))

    async def withdraw(self, deployment: str, *, reason: str = "") -> DeploymentPublic:
        return await self._http.send(change(deployment, "withdraw", WithdrawRequest, {"reason": reason or None}))

    async def set_capture(
        self,
        deployment: str,
        *,
        rate: float | None = None,
        retention_days: int | None = None,
        tokens: bool | None = None,
    ) -> DeploymentPublic:
        fields = {"rate": rate, "retention_days": retention_days, "tokens": tokens}
        return await self._http.send(set_capture(deployment, fields))

    def captures(self, deployment: str, *, limit: int = 20) -> AsyncPager[CapturePublic]:
        return AsyncPager(self._http, list_captures(deployment, limit))

    async def revisions(self, deployment: str) -> builtins.list[RevisionPublic]:
        return await self._http.send(list_revisions(deployment))

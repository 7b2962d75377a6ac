"""Wire types of the health endpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class CheckResult(BaseModel):
    ok: bool
    detail: str = ""
    latency_ms: float


class BaseServing(BaseModel):
    """Whether a base can serve: how many live serving nodes have loaded it."""

    ready: bool
    live_nodes: int
    detail: str = ""


class Readiness(BaseModel):
    """`/readyz`: every backing service checked; `failed` names those that are down. `serving`
    lists the bases it waits for (MINT_READY_BASES) and those with live nodes; `loading` names
    the bases it waits for that no live node has loaded yet."""

    status: Literal["ok", "unavailable"]
    checks: dict[str, CheckResult]
    failed: list[str]
    serving: dict[str, BaseServing] = {}
    loading: list[str] = []


class Liveness(BaseModel):
    status: Literal["ok"] = "ok"
    version: str

"""Wire types of the health endpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class CheckResult(BaseModel):
    ok: bool
    detail: str = ""
    latency_ms: float


class Readiness(BaseModel):
    """`/readyz`: every backing service checked; `failed` names those that are down."""

    status: Literal["ok", "unavailable"]
    checks: dict[str, CheckResult]
    failed: list[str]


class Liveness(BaseModel):
    status: Literal["ok"] = "ok"
    version: str

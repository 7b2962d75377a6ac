"""Wire types for deployments and their revisions."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from mint.schemas.captures import CaptureSettings
from mint.schemas.common import ID_PATTERN, MAX_VERSION, FiniteJson, RequestModel, WireModel

DeploymentName = str


class _Request(RequestModel):
    model_config = ConfigDict(extra="forbid")


class DeploymentCreate(_Request):
    name: str = Field(
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="The model name clients send, e.g. `support-prod` (no `@`: that marks a version).",
    )
    model: str | None = Field(
        default=None, max_length=300, pattern=ID_PATTERN, description="An adapter version, e.g. `support-bot@3`."
    )
    mixture: FiniteJson | None = Field(
        default=None, description="A Mixture-of-LoRA: `{adapters: [...], policy: {type: embedding|rules|...}}`."
    )
    gate: FiniteJson | None = Field(
        default=None,
        description="Required of every promotion: `{benchmark, min_pass_rate?, max_regression?, "
        "require_no_significant_regression?}`.",
    )
    reason: str = Field(default="", max_length=2000)


class PromoteRequest(_Request):
    model: str | None = Field(default=None, max_length=300, pattern=ID_PATTERN)
    mixture: FiniteJson | None = None
    reason: str = Field(default="", max_length=2000)


class RollbackRequest(_Request):
    to_revision: int | None = Field(
        default=None, ge=1, le=MAX_VERSION, description="The revision to serve again; the previous one by default."
    )
    reason: str = Field(default="", max_length=2000)


class WithdrawRequest(_Request):
    reason: str = Field(default="", max_length=2000)


class RevisionPublic(WireModel):
    id: str
    object: Literal["deployment.revision"] = "deployment.revision"
    revision: int
    action: Literal["create", "promote", "rollback", "withdraw", "update"]
    adapter_version_id: str | None
    routing: dict[str, Any]
    gate_verdict: dict[str, Any] | None
    reason: str
    created_by_key_id: str | None
    created_at: datetime


class DeploymentPublic(WireModel):
    id: str
    object: Literal["deployment"] = "deployment"
    name: str
    kind: Literal["single", "mixture"]
    base_model: str
    status: Literal["active", "withdrawn"]
    current_revision: int
    gate: dict[str, Any] | None
    serving: RevisionPublic | None = Field(default=None, description="The current revision.")
    capture: CaptureSettings | None = Field(default=None, description="Production capture (rate 0: off).")
    created_at: datetime
    updated_at: datetime

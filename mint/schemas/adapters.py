"""Wire types for adapters and their immutable versions."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from mint.schemas.common import RequestModel, WireModel


class AdapterPublic(WireModel):
    id: str
    object: Literal["adapter"] = "adapter"
    name: str
    base_model: str
    description: str
    created_at: datetime


class AdapterVersionPublic(WireModel):
    """One version in the object store, named by its sha256: a PEFT adapter, or a whole model."""

    id: str
    object: Literal["adapter.version"] = "adapter.version"
    adapter_id: str
    version: int
    model: str | None = None
    kind: Literal["lora", "full"] = Field(
        default="lora",
        description="`lora`: a PEFT adapter on the base, served and deployed by name. `full`: the whole model a "
        "full-parameter job trained (training_type 'full'; rank and alpha 0), a transformers checkpoint; it is "
        "evaluated on a worker of its base and downloaded, but not served or deployed.",
    )
    sha256: str
    size_bytes: int
    base_model: str
    rank: int
    alpha: float
    targets: dict[str, Any]
    training_job_id: str | None
    parent_version_id: str | None = Field(
        default=None, description="The version this one was trained from (warm start or an earlier stage)."
    )
    metrics: dict[str, Any]
    status: str = Field(description="validating (an upload a worker has not loaded yet), ready, invalid, withdrawn.")
    error: str | None = Field(default=None, description="Why an uploaded version is invalid.")
    created_at: datetime


class ReplayCreate(RequestModel):
    """Train a version's recipe again on another base."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(max_length=100, description="The base to replay onto, e.g. `tiny-qwen3-moe`.")
    suffix: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="The new adapter's name (default: `<adapter>-<base>`).",
    )


# An adapter's name: what `adapter@version` references start with.
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"

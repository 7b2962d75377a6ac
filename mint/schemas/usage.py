"""Wire types of usage reports."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mint.schemas.common import RequestModel


class UsageLine(BaseModel):
    kind: Literal["trained", "sampled", "served", "device_seconds"] = Field(
        description="Tokens trained, sampled or served; `device_seconds`: full-parameter training, by device time."
    )
    base_model: str
    tokens: int = Field(description="Tokens; seconds for `device_seconds`.")
    records: int
    cost_usd: float = Field(description="What these tokens cost, each record at the price of its day.")


class UsageSummary(BaseModel):
    object: Literal["usage_summary"] = "usage_summary"
    since: datetime | None
    until: datetime | None
    data: list[UsageLine]
    total_cost_usd: float


class SpendLimits(BaseModel):
    """The organization's spend limits (null: none) and what it spent this calendar month (UTC)."""

    object: Literal["organization.spend_limits"] = "organization.spend_limits"
    organization_id: str
    month_usd: float | None = Field(description="The most the organization may spend in a calendar month (UTC).")
    job_usd: float | None = Field(description="The most one fine-tuning job may cost.")
    spent_this_month_usd: float
    month_started_at: datetime


class SpendLimitsUpdate(RequestModel):
    """The limits to change: a number sets one, null removes it, an absent field is unchanged."""

    model_config = ConfigDict(extra="forbid")

    month_usd: float | None = Field(default=None, ge=0, le=1e9)
    job_usd: float | None = Field(default=None, ge=0, le=1e9)


class PriceLine(BaseModel):
    base_model: str
    usd_per_million_trained: float
    usd_per_million_sampled: float
    usd_per_million_served: float
    usd_per_gpu_hour: float = Field(description="Full-parameter training, by the GPU-hour.")
    is_default: bool = Field(description="True when the base has no price of its own and the defaults apply.")


class PriceTable(BaseModel):
    object: Literal["list"] = "list"
    data: list[PriceLine]

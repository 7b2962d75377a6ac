"""Wire types of usage reports."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel


class UsageLine(BaseModel):
    kind: Literal["trained", "sampled", "served"]
    base_model: str
    tokens: int
    records: int


class UsageSummary(BaseModel):
    object: Literal["usage_summary"] = "usage_summary"
    since: datetime | None
    until: datetime | None
    data: list[UsageLine]

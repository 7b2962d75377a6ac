"""Interim prices (replaced by the price table): a flat rate per million tokens."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mint.schemas.fine_tuning import FineTuningJobCreate
from mint.storage.tables import EvalRun, TrainingJob, UsageRecord

USD_PER_MILLION = 1.0


@dataclass(frozen=True)
class JobEstimate:
    tokens: int
    steps: int
    seconds: float
    cost_usd: float


def estimate_job(session: Session, organization_id: str, body: FineTuningJobCreate) -> JobEstimate:
    steps = body.steps or 8
    tokens = steps * 8 * 128
    return JobEstimate(tokens, steps, steps * 1.0, tokens * USD_PER_MILLION / 1e6)


def job_cost(session: Session, job: TrainingJob) -> float:
    return job.trained_tokens * USD_PER_MILLION / 1e6


def eval_cost(session: Session, run: EvalRun) -> float:
    tokens = session.execute(
        select(func.coalesce(func.sum(UsageRecord.tokens), 0)).where(
            UsageRecord.resource_type == "eval_run", UsageRecord.resource_id == run.id
        )
    ).scalar_one()
    return int(tokens) * USD_PER_MILLION / 1e6

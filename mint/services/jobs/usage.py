"""What an attempt at a fine-tuning job has used and not billed yet: the tokens it trained and
sampled (a LoRA job) or the seconds it held its device (a full-parameter job), kept on its
`JobContext` and recorded as usage at each checkpoint and at the end, priced then. Between
records the job's cost is what was billed plus `unbilled_cost`, so a budget sees every step."""

from __future__ import annotations

from sqlalchemy.orm import Session

from mint.services.billing import prices as pricing
from mint.services.billing.usage import record_usage
from mint.services.jobs.context import JobContext


def unbilled_cost(context: JobContext, prices: pricing.Prices) -> float:
    """What the usage not recorded yet costs at `prices`."""
    return (
        prices.of("trained", context.unbilled_trained)
        + prices.of("sampled", context.unbilled_sampled)
        + prices.device_seconds(context.unbilled_device_s)
    )


def bill(session: Session, context: JobContext, model_ref: str) -> None:
    """Record the usage of the steps trained since the last record, priced now. Device time
    is recorded in whole seconds; the fraction left waits for the next record."""
    device_s = int(context.unbilled_device_s)
    context.unbilled_device_s -= device_s
    usage = (("trained", context.unbilled_trained), ("sampled", context.unbilled_sampled))
    for kind, tokens in (*usage, ("device_seconds", device_s)):
        if tokens:
            record_usage(
                session,
                organization_id=context.organization_id,
                kind=kind,
                tokens=tokens,
                base_model=context.base_model,
                model_ref=model_ref,
                resource_type="training_job",
                resource_id=context.job_id,
            )
    context.unbilled_trained = context.unbilled_sampled = 0

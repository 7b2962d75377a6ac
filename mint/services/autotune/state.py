"""Reading an auto run's record: its typed state, its trials in order, how long it has run.

The bottom of the auto-mode package: the tick, the phases and the API's view of a run (`runs`)
all read a run through these, and this module imports none of them, so the imports between the
package's modules point one way (runs -> driver -> phases -> tick -> state).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.schemas.autotune_state import AutotuneState
from mint.storage.tables import AutotuneRun, AutotuneTrial, utcnow

# A job or an eval run in one of these will not change any more.
FINISHED = ("succeeded", "failed", "cancelled")


def state_of(run: AutotuneRun) -> AutotuneState:
    """The run's `state` column, validated."""
    return AutotuneState.model_validate(run.state)


def trials_of(session: Session, run: AutotuneRun) -> list[AutotuneTrial]:
    """The run's trials, by number."""
    return list(
        session.execute(
            select(AutotuneTrial).where(AutotuneTrial.run_id == run.id).order_by(AutotuneTrial.number)
        ).scalars()
    )


def trial_score(trial: AutotuneTrial) -> float:
    """What the search maximises: the dev pass rate, mean score breaking ties; 0 for a failed trial."""
    if trial.dev_pass_rate is None:
        return 0.0
    return trial.dev_pass_rate + 1e-3 * (trial.dev_mean_score or 0.0)


def elapsed_s(run: AutotuneRun) -> float:
    """Seconds since the run started (or was created, while queued): what `budget.seconds` counts."""
    started = run.started_at or run.created_at
    return (utcnow() - aware(started)).total_seconds()


def aware(moment: datetime) -> datetime:
    """`moment` with a time zone (a database without them gives naive UTC times)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)

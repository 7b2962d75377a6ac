"""What one tick of an auto run works with, built once (`Tick.of`) and handed to every phase.

A tick's context is the database session, the object store, how to send work, the quota
defaults and the settings, and the run itself: its typed state (read from the row once, written
back by `save` after every change, so that what a later error or commit sees is the row as the
tick left it), its trials, its request and the principal its jobs and eval runs are created as.
Every phase logs its choices with `decide` and ends the run with `finish`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlalchemy.orm import Session

from mint.config import Settings
from mint.schemas.autotune import AutotuneCreate
from mint.schemas.autotune_state import AutotuneState
from mint.services.autotune.state import state_of, trials_of
from mint.services.billing.quotas import QuotaDefaults
from mint.services.dispatch import Dispatch
from mint.services.principal import Principal
from mint.services.webhooks import events
from mint.storage.objects import ObjectStore, object_store_for
from mint.storage.tables import AutotuneRun, AutotuneTrial, utcnow


@dataclass
class Tick:
    """One tick's context. `trials` is read once: within a tick only the driver adds trials
    (`add_trial`), and it changes them in place."""

    session: Session
    store: ObjectStore
    send: Dispatch
    quotas: QuotaDefaults
    settings: Settings
    run: AutotuneRun
    state: AutotuneState
    trials: list[AutotuneTrial]

    @classmethod
    def of(cls, session: Session, settings: Settings, send: Dispatch, run: AutotuneRun) -> Tick:
        """The context of a tick of `run`, as its row is now."""
        return cls(
            session=session,
            store=object_store_for(settings),
            send=send,
            quotas=QuotaDefaults.of(settings),
            settings=settings,
            run=run,
            state=state_of(run),
            trials=trials_of(session, run),
        )

    @cached_property
    def request(self) -> AutotuneCreate:
        """What the run was asked to do (parsed on first use: ending a run does not need it)."""
        return AutotuneCreate.model_validate(self.run.request)

    @cached_property
    def principal(self) -> Principal:
        """Who started the run: its jobs and eval runs are created in that key's name."""
        made = self.run.created_by
        return Principal(
            organization_id=self.run.organization_id, key_id=made.get("key_id"), role=made["role"], name=made["name"]
        )

    def save(self) -> None:
        """Write the state back to the run's row."""
        self.run.state = self.state.stored()

    def add_trial(self, trial: AutotuneTrial) -> None:
        self.session.add(trial)
        self.trials.append(trial)

    def decide(self, decision: str, reason: str) -> None:
        """Log a decision with its reason on the run (shown by the API and the dashboard)."""
        self.run.decisions = [*self.run.decisions, {"at": utcnow().isoformat(), "decision": decision, "reason": reason}]

    def finish(self, status: str, reason: str, *, error: dict[str, Any] | None = None) -> bool:
        """End the run with `status`, saying why; its webhook event is written in the same
        transaction. True (the run is finished), for the phases to return."""
        run = self.run
        run.status = status
        run.finished_at = utcnow()
        run.error = error
        self.state.phase, self.state.stop_reason = "done", reason
        self.save()
        self.decide(f"finish: {status}", reason)
        best = self.state.best.stored() if self.state.best is not None else None
        data = {"id": run.id, "status": status, "reason": reason, "best": best, "cost_usd": run.cost_usd}
        events.autotune_event(
            self.session, organization_id=run.organization_id, data=data, completed=status != "failed", send=self.send
        )
        return True

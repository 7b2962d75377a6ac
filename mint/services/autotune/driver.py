"""The auto-mode driver: one step of an auto run's state machine per tick.

A run moves through four phases, each tick doing what it can without waiting and returning:

- `baseline` (`baseline`): settle the benchmark version (one without a dev split gets a new
  version whose `dev` is a quarter of `train`, by task-id hash), evaluate the base on train, dev
  and held-out (and, for a delta target, the deployment's version on dev and held-out); then
  mine the base's train failures into datasets (SFT rows, DPO pairs, RL prompts) and choose the
  methods (`search.choose_methods`), each choice logged with its reason.
- `search` (`trials`): one trial at a time. A trial is an ordinary fine-tuning job with the
  parameters the search chose, then an ordinary eval run of its version on dev. Before a trial
  starts, the budget must cover its job's estimate and its dev evaluation, on top of the money
  held back for the final held-out evaluation (`spend.heldout_reserve`: the held-out tasks at the
  most a task of any evaluation so far cost); a running trial whose cost passes what the search
  may spend is cancelled, and a best version whose held-out evaluation the budget cannot pay for
  is named without it.
  The search stops when the best dev pass rate reaches the target, at `max_trials`, after
  `patience` trials without a better dev score, at the deadline, or at the budget.
- `final` (`final`): the best version (if any) is evaluated on held-out and compared with the
  base (and production), task by task with a paired bootstrap: the run `succeeded` if the
  held-out target is met, else it `stopped`, naming the best version so far and why it stopped.
- `done`.

Everything a tick learns is in the database (the run's `state`, its trials, the jobs and eval
runs themselves), so ticks are idempotent and a driver that dies loses nothing: the next tick,
or the reconciler's re-send, carries on from the rows. A tick's context (`tick.Tick`) is built
once from those rows and handed to the phase.
"""

from __future__ import annotations

from mint.errors import MintError, QuotaExceeded
from mint.services.autotune.baseline import baseline
from mint.services.autotune.final import final
from mint.services.autotune.running_trial import cancel_running_trial
from mint.services.autotune.spend import spent
from mint.services.autotune.tick import Tick
from mint.services.autotune.trials import search
from mint.storage.tables import utcnow


def advance(tick: Tick) -> bool:
    """Move the tick's run on as far as it can go now; True when it is finished."""
    run = tick.run
    if run.status in ("succeeded", "stopped", "failed", "cancelled"):
        return True
    if run.status == "queued":
        run.status, run.started_at = "running", utcnow()
        tick.state.phase = "baseline"
        tick.save()
    run.cost_usd = spent(tick)
    if run.cancel_requested_at is not None:
        cancel_running_trial(tick)
        return tick.finish("cancelled", "cancelled on request")
    try:
        phase = tick.state.phase
        if phase == "baseline":
            return baseline(tick)
        if phase == "search":
            return search(tick)
        if phase == "final":
            return final(tick)
        return True
    except QuotaExceeded as exc:  # the organization's jobs or eval runs are at their quota: wait
        tick.state.waiting = exc.message
        tick.save()
        return False
    except MintError as exc:
        return tick.finish("failed", exc.message, error={"type": exc.type, "message": exc.message})

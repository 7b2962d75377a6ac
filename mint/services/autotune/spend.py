"""What an auto run spends: money so far, what evaluating costs, the money held back for the
final held-out evaluation, and whether the budget (money, time, deadline) covers more.

Costs are measured, never guessed: a run's cost is its trials' jobs and its eval runs at the
price table, and the held-out reserve is the held-out tasks at the most a task of any finished
evaluation cost so far (a trained version may answer at greater length than the base).
"""

from __future__ import annotations

from sqlalchemy import select

from mint.services.autotune.state import aware, elapsed_s
from mint.services.autotune.tick import Tick
from mint.services.billing import prices
from mint.storage.tables import EvalRun, TrainingJob, utcnow


def spent(tick: Tick) -> float:
    """What the run has cost so far: its trials' jobs and its eval runs, at the price table."""
    session = tick.session
    job_ids = [t.job_id for t in tick.trials if t.job_id is not None]
    jobs = list(session.execute(select(TrainingJob).where(TrainingJob.id.in_(job_ids))).scalars()) if job_ids else []
    eval_ids = _eval_ids(tick)
    runs = list(session.execute(select(EvalRun).where(EvalRun.id.in_(eval_ids))).scalars()) if eval_ids else []
    return sum(job.cost_usd for job in jobs) + sum(prices.eval_cost(session, r) for r in runs)


def _eval_ids(tick: Tick) -> list[str]:
    state = tick.state
    ids = [*state.base_evals.values(), *state.production_evals.values()]
    ids += [run_id for evals_of in state.other_base_evals.values() for run_id in evals_of.values()]
    ids += [t.eval_run_id for t in tick.trials if t.eval_run_id is not None]
    if state.final_eval:
        ids.append(state.final_eval)
    return ids


def eval_cost_per_task(tick: Tick) -> float:
    """What evaluating one task costs, as measured so far: the most per task of the base's eval
    runs and of every finished trial's dev run (a trained version may answer at greater length,
    or in more tool steps, than the base). Zero before any has finished."""
    session = tick.session
    ids = list(tick.state.base_evals.values())
    ids += [t.eval_run_id for t in tick.trials if t.eval_run_id is not None]
    rates = [0.0]
    for eval_run in session.execute(select(EvalRun).where(EvalRun.id.in_(ids))).scalars() if ids else []:
        tasks = int(eval_run.metrics.get("tasks", 0)) if eval_run.status == "succeeded" else 0
        if tasks:
            rates.append(prices.eval_cost(session, eval_run) / tasks)
    return max(rates)


def tasks_in(tick: Tick, role: str) -> int:
    """Tasks of the base's eval run on `role`'s split (dev or heldout): what a trial's dev run,
    or the final held-out run, evaluates."""
    eval_run = tick.session.get(EvalRun, tick.state.base_evals.get(role, ""))
    return int(eval_run.metrics.get("tasks", 0)) if eval_run is not None else 0


def heldout_reserve(tick: Tick) -> float:
    """What the final held-out evaluation of the best version should cost: the held-out tasks at
    the measured cost per task (`eval_cost_per_task`). Measured, never guessed; it grows when a
    trained version's evaluation costs more per task than anything before."""
    return eval_cost_per_task(tick) * tasks_in(tick, "heldout")


def update_reserve(tick: Tick) -> float:
    """Hold back more for the held-out evaluation when a trial's dev evaluation showed that a
    trained version costs more per task to evaluate than anything measured before; returns the
    cost per task it is based on (`eval_cost_per_task`)."""
    before = tick.state.heldout_reserve
    per_task = eval_cost_per_task(tick)
    reserve = per_task * tasks_in(tick, "heldout")
    if reserve > before:
        tick.state.heldout_reserve = reserve
        tick.save()
        if tick.request.budget.usd is not None:
            tick.decide(
                f"hold back ${reserve:.3g} of the budget (was ${before:.3g})",
                "a trained version's evaluation costs more per task than the base's: the held-out evaluation "
                f"of {tasks_in(tick, 'heldout')} tasks at ${per_task:.3g} a task",
            )
    return per_task


def out_of_budget(tick: Tick, next_cost: float = 0.0) -> str | None:
    """Why the run cannot spend `next_cost` more (money, time or deadline), or None. The money
    held back for the final held-out evaluation (`heldout_reserve`) is not the search's to spend."""
    run, request = tick.run, tick.request
    budget = request.budget
    reserve = tick.state.heldout_reserve
    if budget.usd is not None and run.cost_usd + next_cost + reserve > budget.usd:
        return (
            f"the budget of ${budget.usd:.4f} is spent: ${run.cost_usd:.4f} so far"
            + (f", the next trial (job and dev evaluation) is estimated at ${next_cost:.4f}" if next_cost else "")
            + (f", and ${reserve:.3g} is held back for the held-out evaluation" if reserve else "")
        )
    if budget.seconds is not None and elapsed_s(run) >= budget.seconds:
        return f"the time budget of {budget.seconds} s is spent ({elapsed_s(run):.0f} s so far)"
    deadline = request.constraints.deadline
    if deadline is not None and utcnow() >= aware(deadline):
        return f"the deadline {deadline.isoformat()} has passed"
    return None

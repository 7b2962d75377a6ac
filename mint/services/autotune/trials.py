"""The search phase of an auto run: one trial at a time, until a reason to stop.

A tick follows the running trial (`running_trial`); with none running, it decides whether the
search stops (the best dev pass rate reached the target, `max_trials`, `patience` trials without
a better dev score, the deadline or the budget) and, if not, starts the next trial with the
parameters the search chose (`search.next_params`). Before a trial starts, the budget must cover
its job's estimate and its dev evaluation on top of the money held back for the final held-out
evaluation; a full-parameter trial the budget cannot pay for is trained with LoRA instead.
"""

from __future__ import annotations

from typing import Any

from mint.errors import SpendLimitExceeded
from mint.services.autotune.final import final
from mint.services.autotune.running_trial import follow
from mint.services.autotune.search import next_params, why_params
from mint.services.autotune.spend import out_of_budget, tasks_in, update_reserve
from mint.services.autotune.state import trial_score
from mint.services.autotune.tick import Tick
from mint.services.autotune.trial_jobs import priced, training_type
from mint.services.jobs import fine_tuning
from mint.storage.tables import AutotuneTrial, new_id


def search(tick: Tick) -> bool:
    """One tick of the search phase; True when the run finished."""
    run, request, trials = tick.run, tick.request, tick.trials
    current = next((t for t in trials if t.status in ("training", "evaluating")), None)
    if current is not None:
        follow(tick, current)
        return False
    per_task = update_reserve(tick)
    reason = _stop_reason(tick)
    if reason is not None:
        return _stop(tick, reason, reason)
    finished = [(t.params, trial_score(t)) for t in trials if t.status in ("done", "failed")]
    number = len(trials) + 1
    params = _next_params(tick, finished)
    dev_eval = per_task * tasks_in(tick, "dev")
    body, estimate = priced(tick, params, number)
    if params.get("training_type") == "full" and out_of_budget(tick, estimate.cost_usd + dev_eval):
        # The budget decides between LoRA and full parameters: what is left does not pay for this one.
        cost = (
            f"${estimate.cost_usd:.4f} ({estimate.seconds:.0f} s of device time) and its dev evaluation ${dev_eval:.4f}"
        )
        if not any(done.get("training_type") == "full" for done, _ in finished):
            tick.state.choose_full = False
            tick.save()
            tick.decide(
                "skip full-parameter training",
                f"the full-parameter default is estimated at {cost}, more than the budget has left; the search "
                "goes on with LoRA",
            )
            params = _next_params(tick, finished)
        else:
            tick.decide(
                "train LoRA instead of full parameters",
                f"the full-parameter trial is estimated at {cost}, more than the budget has left",
            )
            params = {**params, "training_type": "lora"}
        body, estimate = priced(tick, params, number)
    over = out_of_budget(tick, estimate.cost_usd + dev_eval)
    if over is not None:
        return _stop(tick, over, over)
    try:
        job = fine_tuning.create_job(tick.session, tick.principal, body, send=tick.send, quotas=tick.quotas)
    except SpendLimitExceeded as refused:  # the organization's limits, not the run's budget
        return _stop(tick, refused.message, f"the next trial is refused: {refused.message}")
    tick.add_trial(
        AutotuneTrial(
            id=new_id("trial"),
            run_id=run.id,
            number=number,
            method=params["method"],
            params=params,
            status="training",
            job_id=job.id,
            estimated_usd=estimate.cost_usd,
        )
    )
    full = training_type(request, params) == "full"
    tick.decide(
        f"start trial {number}: {params['method']}" + (" (full-parameter)" if full else ""),
        f"learning-rate multiplier {params['learning_rate_multiplier']:.3g}, "
        + ("every weight" if full else f"rank {params['rank']}")
        + f", {params['steps']} steps (job {job.id}, estimated ${estimate.cost_usd:.4f}, {estimate.seconds:.0f} s); "
        + why_params(finished, tick.state.bases, tick.state.choose_full),
    )
    return False


def _stop(tick: Tick, stop_reason: str, why: str) -> bool:
    """End the search (`stop_reason` is what the result says, `why` what the decision log says)
    and go on to the final phase in the same tick."""
    tick.state.phase, tick.state.stop_reason = "final", stop_reason
    tick.save()
    tick.decide("stop the search", why)
    return final(tick)


def _next_params(tick: Tick, finished: list[tuple[dict[str, Any], float]]) -> dict[str, Any]:
    constraints = tick.request.constraints
    return next_params(
        finished,
        tick.state.methods,
        max_rank=constraints.max_rank,
        max_steps=constraints.max_steps,
        seed=tick.request.seed,
        bases=tick.state.bases,
        choose_full=tick.state.choose_full,
    )


def _stop_reason(tick: Tick) -> str | None:
    """Why the search stops now, or None."""
    request, trials = tick.request, tick.trials
    done = [t for t in trials if t.status in ("done", "failed")]
    best = max(done, key=trial_score, default=None)
    if best is not None:
        dev_target = tick.state.dev_target
        assert dev_target is not None, "the baseline sets the dev target"
        if (best.dev_pass_rate or 0.0) >= dev_target:
            return (
                f"trial {best.number} reached the target on {request.splits.dev}: pass rate "
                f"{best.dev_pass_rate:.3f} >= {dev_target:.3f}"
            )
    if len(trials) >= request.constraints.max_trials:
        return f"all {request.constraints.max_trials} trials allowed have run"
    if best is not None:
        since_best = sum(1 for t in done if t.number > best.number)
        if since_best >= request.constraints.patience:
            return f"{since_best} trials in a row did not beat trial {best.number} on {request.splits.dev}"
    return out_of_budget(tick)

"""The final phase of an auto run: the best version's held-out evaluation and the verdict.

The best version (if any) is evaluated on held-out and compared with its base (and production),
task by task with a paired bootstrap: the run `succeeded` if the held-out target is met, else it
`stopped`, naming the best version so far and why the search stopped. Where the budget cannot
pay for the held-out evaluation, the run stops naming the best version without it.
"""

from __future__ import annotations

from typing import Any

from mint.schemas.autotune_state import AutotuneComparison, AutotuneResult
from mint.services.autotune.evaluations import eval_run, evaluate, runs_done
from mint.services.autotune.spend import heldout_reserve
from mint.services.autotune.tick import Tick
from mint.services.evals import runs as evals


def final(tick: Tick) -> bool:
    """One tick of the final phase; True when the run finished."""
    run, request, state = tick.run, tick.request, tick.state
    best = state.best
    reason = state.stop_reason or ""
    if best is None:
        return tick.finish("stopped", f"{reason}; no trial produced a version that could be evaluated")
    base_model = best.base or run.base_model
    if state.final_eval is None and request.budget.usd is not None:
        reserve = heldout_reserve(tick)
        if run.cost_usd + reserve > request.budget.usd:
            # The budget is a cap: the held-out evaluation is left for the team to run.
            state.result = AutotuneResult(
                model=best.model, base_model=base_model, heldout_pass_rate=None, stop_reason=reason
            )
            tick.save()
            return tick.finish(
                "stopped",
                f"{reason}. Best version {best.model} (dev pass rate {best.dev_pass_rate:.3f}); its held-out "
                f"evaluation would cost about ${reserve:.4f}, more than the ${request.budget.usd - run.cost_usd:.4f} "
                f"left: evaluate it with POST /v1/evals (model {best.model}, split {request.splits.heldout})",
            )
    if state.final_eval is None:
        state.final_eval = evaluate(tick, best.model, request.splits.heldout)
        tick.save()
        tick.decide("evaluate the best version on held-out", f"{best.model} (trial {best.trial})")
        return False
    done = runs_done(tick.session, {"held-out": state.final_eval})
    if done is None:
        return False
    heldout = done["held-out"]
    session, org = tick.session, run.organization_id
    base_heldout = (
        state.base_evals["heldout"] if base_model == run.base_model else state.other_base_evals[base_model]["heldout"]
    )
    against_base = evals.compare_eval_runs(session, org, base_heldout, heldout.id)
    result = AutotuneResult(
        model=best.model,
        base_model=base_model,
        heldout_pass_rate=heldout.metrics.get("accuracy", 0.0),
        base_heldout_pass_rate=float(eval_run(session, base_heldout).metrics.get("accuracy", 0.0)),
        against_base=_comparison_summary(against_base),
        stop_reason=reason,
    )
    assert result.heldout_pass_rate is not None
    target = request.target
    if target.pass_rate is not None:
        met = result.heldout_pass_rate >= target.pass_rate
        goal = f"held-out pass rate {result.heldout_pass_rate:.3f} against the target {target.pass_rate:.3f}"
    else:
        against_production = evals.compare_eval_runs(session, org, state.production_evals["heldout"], heldout.id)
        result.against_production = _comparison_summary(against_production)
        result.production = state.production
        assert target.delta_over_production is not None
        met = against_production.accuracy_delta >= target.delta_over_production
        goal = (
            f"held-out gain over production {against_production.accuracy_delta:+.3f} against the target "
            f"{target.delta_over_production:+.3f}"
        )
    state.result = result
    tick.save()
    verdict = "met" if met else "not met"
    return tick.finish(
        "succeeded" if met else "stopped",
        f"{reason}. Best version {best.model}: {goal} ({verdict}); against the base "
        f"{against_base.accuracy_delta:+.3f} [{against_base.interval.low:+.3f}, {against_base.interval.high:+.3f}]",
    )


def _comparison_summary(comparison: Any) -> AutotuneComparison:
    return AutotuneComparison(
        accuracy_delta=comparison.accuracy_delta,
        interval=[comparison.interval.low, comparison.interval.high],
        significant=comparison.significant,
        fixed=len(comparison.fixed),
        broken=len(comparison.broken),
        tasks=comparison.tasks,
    )

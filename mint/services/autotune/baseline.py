"""The baseline phase of an auto run: the starting point every trial is measured against.

It settles the benchmark version (`dev_split`), evaluates the base on train, dev and held-out
(and the other bases and, for a delta target, the deployment's version on dev and held-out),
holds back the money for the final held-out evaluation, mines the base's train failures into
datasets (`mining`) and chooses the methods (`search.choose_methods`), each choice logged with
its reason. Each tick starts what it can and returns; the phase ends when the search can begin.
"""

from __future__ import annotations

from mint.errors import InvalidRequest
from mint.services.autotune.dev_split import settle_version
from mint.services.autotune.evaluations import evaluate, runs_done
from mint.services.autotune.mining import mine
from mint.services.autotune.search import choose_methods, full_choice
from mint.services.autotune.spend import heldout_reserve, tasks_in
from mint.services.autotune.tick import Tick
from mint.services.catalog import current_revision, get_deployment, model_ref_of_id
from mint.storage.tables import EvalRun


def baseline(tick: Tick) -> bool:
    """One tick of the baseline phase; True when the run finished (nothing to train on)."""
    request, state = tick.request, tick.state
    splits = request.splits
    if state.version is None:
        settle_version(tick)
    if not state.base_evals:
        _evaluate_bases(tick)
        return False
    base = runs_done(tick.session, state.base_evals)
    production = runs_done(tick.session, state.production_evals)
    others_done = {other: runs_done(tick.session, evals_of) for other, evals_of in state.other_base_evals.items()}
    if base is None or production is None or any(done is None for done in others_done.values()):
        return False
    if others_done:
        _order_bases(tick, base["dev"], {other: done["dev"] for other, done in others_done.items() if done})
    dev = base["dev"].metrics
    dev_target = _dev_target(tick, production)
    state.base_dev = {"accuracy": dev.get("accuracy", 0.0), "mean_score": dev.get("mean_score", 0.0)}
    state.dev_target = dev_target
    tick.save()
    state.heldout_reserve = heldout_reserve(tick)
    tick.save()
    if request.budget.usd is not None:
        tick.decide(
            f"hold back ${state.heldout_reserve:.3g} of the budget",
            f"for the final evaluation of the best version on {splits.heldout}: its "
            f"{tasks_in(tick, 'heldout')} tasks at the most a task of the base's evaluations cost; "
            "the search spends the rest",
        )
    mined = mine(tick, base["train"])
    choice = choose_methods(request.constraints.methods, state.base_dev, mined)
    for decision, reason in choice.reasons:
        tick.decide(decision, reason)
    if not choice.methods:
        return tick.finish(
            "stopped",
            "no allowed method has data to train on: the base's train failures gave no rows for "
            f"{', '.join(request.constraints.methods)}",
        )
    methods, types = choice.methods, request.constraints.training_types
    if types == ["full"] and methods != ["sft"]:
        methods = [method for method in methods if method == "sft"]
        tick.decide(
            "train SFT only",
            "the only training type allowed is full-parameter, which trains supervised stages only (DPO and RL "
            "score against a frozen reference copy of the base)",
        )
    choose_full = full_choice(methods, types)
    if choose_full:
        tick.decide(
            "consider full-parameter training",
            "the constraints allow LoRA and full-parameter training: after the LoRA default, the default SFT trial "
            "trains every weight when its estimate (device time at the GPU-hour price) fits the budget",
        )
    state.phase, state.datasets, state.methods, state.choose_full = "search", mined, methods, choose_full
    tick.save()
    return False


def _evaluate_bases(tick: Tick) -> None:
    """Start the base's eval runs (train, dev, held-out), the other bases' and production's (dev,
    held-out)."""
    run, state, splits = tick.run, tick.state, tick.request.splits
    production = _production_model(tick)
    base_evals = {role: evaluate(tick, run.base_model, getattr(splits, role)) for role in ("train", "dev")}
    base_evals["heldout"] = evaluate(tick, run.base_model, splits.heldout)
    others = tick.request.constraints.bases
    other_base_evals = {
        other: {role: evaluate(tick, other, getattr(splits, role)) for role in ("dev", "heldout")} for other in others
    }
    production_evals = (
        {role: evaluate(tick, production, getattr(splits, role)) for role in ("dev", "heldout")}
        if production is not None
        else {}
    )
    # Recorded once all are started: a tick stopped half-way (at a quota) starts them all again.
    state.base_evals = base_evals
    if others:
        state.other_base_evals = other_base_evals
    if production is not None:
        state.production, state.production_evals = production, production_evals
    tick.save()
    tick.decide(
        "evaluate the base",
        f"{run.base_model} on {splits.train}, {splits.dev} and {splits.heldout}"
        + (f", and production ({production}) on {splits.dev} and {splits.heldout}" if production else "")
        + (f", and the other bases ({', '.join(others)}) on {splits.dev} and {splits.heldout}" if others else "")
        + ": the starting point every trial is measured against",
    )


def _production_model(tick: Tick) -> str | None:
    """The adapter version the target deployment serves now (None without a delta target)."""
    target = tick.request.target
    if target.deployment is None:
        return None
    deployment = get_deployment(tick.session, tick.run.organization_id, target.deployment)
    revision = current_revision(tick.session, deployment)
    if revision.adapter_version_id is None:
        raise InvalidRequest(
            f"deployment {deployment.name!r} serves no single adapter version (a mixture or the base): "
            "give target.pass_rate instead",
            param="target.deployment",
        )
    return model_ref_of_id(tick.session, revision.adapter_version_id)


def _order_bases(tick: Tick, own_dev: EvalRun, other_devs: dict[str, EvalRun]) -> None:
    """The bases the search tries, best dev result first (pass rate, then mean score; the run's
    own base first among equals), each with its default trial before anything else is tried."""
    devs = {tick.run.base_model: own_dev, **other_devs}

    def result(name: str) -> tuple[float, float]:
        metrics = devs[name].metrics
        return (float(metrics.get("accuracy", 0.0)), float(metrics.get("mean_score", 0.0)))

    ordered = sorted(devs, key=lambda name: result(name), reverse=True)
    tick.state.bases = ordered
    tick.save()
    tick.decide(
        f"consider {len(ordered)} bases",
        "their default trials first, in the order of their dev results: "
        + ", ".join(f"{name} (pass rate {result(name)[0]:.3f}, mean score {result(name)[1]:.3f})" for name in ordered),
    )


def _dev_target(tick: Tick, production: dict[str, EvalRun] | None) -> float:
    """The dev pass rate that stops the search: the target itself, or production's dev pass
    rate plus the delta."""
    target = tick.request.target
    if target.pass_rate is not None:
        return target.pass_rate
    assert production is not None and target.delta_over_production is not None
    return min(1.0, production["dev"].metrics.get("accuracy", 0.0) + target.delta_over_production)

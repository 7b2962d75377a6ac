"""The auto-mode driver: one step of an auto run's state machine per tick.

A run moves through four phases, each tick doing what it can without waiting and returning:

- `baseline`: settle the benchmark version (one without a dev split gets a new version whose
  `dev` is a quarter of `train`, by task-id hash), evaluate the base on train, dev and held-out
  (and, for a delta target, the deployment's version on dev and held-out); then mine the base's
  train failures into datasets (SFT rows, DPO pairs, RL prompts) and choose the methods
  (`autotune_search.choose_methods`), each choice logged with its reason.
- `search`: one trial at a time. A trial is an ordinary fine-tuning job with the parameters the
  search chose, then an ordinary eval run of its version on dev. Before a trial starts, the
  budget must cover its job's estimate and its dev evaluation, on top of the money held back for
  the final held-out evaluation (`heldout_reserve`: the held-out tasks at the most a task of any
  evaluation so far cost); a running trial whose cost passes what the search may spend is
  cancelled, and a best version whose held-out evaluation the budget cannot pay for is named
  without it.
  The search stops when the best dev pass rate reaches the target, at `max_trials`, after
  `patience` trials without a better dev score, at the deadline, or at the budget.
- `final`: the best version (if any) is evaluated on held-out and compared with the base (and
  production), task by task with a paired bootstrap: the run `succeeded` if the held-out
  target is met, else it `stopped`, naming the best version so far and why it stopped.
- `done`.

Everything a tick learns is in the database (the run's `state`, its trials, the jobs and eval
runs themselves), so ticks are idempotent and a driver that dies loses nothing: the next tick,
or the reconciler's re-send, carries on from the rows.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import InvalidRequest, MintError, QuotaExceeded, SpendLimitExceeded
from mint.schemas.autotune import AutotuneCreate
from mint.schemas.evals import EvalRunCreate, FromFailuresCreate
from mint.schemas.fine_tuning import FineTuningJobCreate
from mint.services import benchmarks
from mint.services.autotune.runs import trials_of
from mint.services.autotune.search import DATA_OF_METHOD, choose_methods, full_choice, next_params, why_params
from mint.services.billing import prices
from mint.services.billing.quotas import QuotaDefaults
from mint.services.dispatch import Dispatch
from mint.services.evals import runs as evals
from mint.services.jobs import fine_tuning
from mint.services.principal import Principal
from mint.services.serving import deployments
from mint.services.webhooks import events
from mint.storage.objects import ObjectStore
from mint.storage.tables import AutotuneRun, AutotuneTrial, EvalRun, TrainingJob, new_id, utcnow

# Share of the train split that becomes dev when the version has none.
DEV_PERCENT = 25
FINISHED = ("succeeded", "failed", "cancelled")


class Tick:
    """What one tick works with: the database session, the object store, how to send work,
    the quota defaults, the settings."""

    def __init__(
        self, session: Session, store: ObjectStore, send: Dispatch, quotas: QuotaDefaults, settings: Settings
    ) -> None:
        self.session, self.store, self.send, self.quotas, self.settings = session, store, send, quotas, settings


def decide(run: AutotuneRun, decision: str, reason: str) -> None:
    """Log a decision with its reason on the run (shown by the API and the dashboard)."""
    run.decisions = [*run.decisions, {"at": utcnow().isoformat(), "decision": decision, "reason": reason}]


def _principal(run: AutotuneRun) -> Principal:
    made = run.created_by
    return Principal(
        organization_id=run.organization_id, key_id=made.get("key_id"), role=made["role"], name=made["name"]
    )


def _request(run: AutotuneRun) -> AutotuneCreate:
    return AutotuneCreate.model_validate(run.request)


def _set_state(run: AutotuneRun, **changes: Any) -> None:
    run.state = {**run.state, **changes}


def finish(tick: Tick, run: AutotuneRun, status: str, reason: str, *, error: dict[str, Any] | None = None) -> bool:
    """End the run with `status`, saying why; its webhook event is written in the same transaction."""
    run.status = status
    run.finished_at = utcnow()
    run.error = error
    _set_state(run, phase="done", stop_reason=reason)
    decide(run, f"finish: {status}", reason)
    data = {"id": run.id, "status": status, "reason": reason, "best": run.state.get("best"), "cost_usd": run.cost_usd}
    events.autotune_event(
        tick.session, organization_id=run.organization_id, data=data, completed=status != "failed", send=tick.send
    )
    return True


def advance(tick: Tick, run: AutotuneRun) -> bool:
    """Move `run` on as far as it can go now; True when it is finished."""
    if run.status in ("succeeded", "stopped", "failed", "cancelled"):
        return True
    if run.status == "queued":
        run.status, run.started_at = "running", utcnow()
        _set_state(run, phase="baseline")
    run.cost_usd = spent(tick.session, run)
    if run.cancel_requested_at is not None:
        _cancel_running_trial(tick, run)
        return finish(tick, run, "cancelled", "cancelled on request")
    try:
        phase = run.state.get("phase", "baseline")
        if phase == "baseline":
            return _baseline(tick, run)
        if phase == "search":
            return _search(tick, run)
        if phase == "final":
            return _final(tick, run)
        return True
    except QuotaExceeded as exc:  # the organization's jobs or eval runs are at their quota: wait
        _set_state(run, waiting=exc.message)
        return False
    except MintError as exc:
        return finish(tick, run, "failed", exc.message, error={"type": exc.type, "message": exc.message})


# ---- money and time -------------------------------------------------------------------------


def spent(session: Session, run: AutotuneRun) -> float:
    """What the run has cost so far: its trials' jobs and its eval runs, at the price table."""
    job_ids = [t.job_id for t in trials_of(session, run) if t.job_id is not None]
    jobs = session.execute(select(TrainingJob).where(TrainingJob.id.in_(job_ids))).scalars() if job_ids else []
    eval_ids = _eval_ids(session, run)
    runs = session.execute(select(EvalRun).where(EvalRun.id.in_(eval_ids))).scalars() if eval_ids else []
    return sum(job.cost_usd for job in jobs) + sum(prices.eval_cost(session, r) for r in runs)


def _eval_ids(session: Session, run: AutotuneRun) -> list[str]:
    state = run.state
    ids = [*state.get("base_evals", {}).values(), *state.get("production_evals", {}).values()]
    ids += [run_id for evals_of in state.get("other_base_evals", {}).values() for run_id in evals_of.values()]
    ids += [t.eval_run_id for t in trials_of(session, run) if t.eval_run_id is not None]
    if state.get("final_eval"):
        ids.append(state["final_eval"])
    return ids


def elapsed_s(run: AutotuneRun) -> float:
    started = run.started_at or run.created_at
    return (utcnow() - _aware(started)).total_seconds()


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _out_of_budget(run: AutotuneRun, request: AutotuneCreate, next_cost: float = 0.0) -> str | None:
    """Why the run cannot spend `next_cost` more (money, time or deadline), or None. The money
    held back for the final held-out evaluation (`heldout_reserve`) is not the search's to spend."""
    budget = request.budget
    reserve = float(run.state.get("heldout_reserve", 0.0))
    if budget.usd is not None and run.cost_usd + next_cost + reserve > budget.usd:
        return (
            f"the budget of ${budget.usd:.4f} is spent: ${run.cost_usd:.4f} so far"
            + (f", the next trial (job and dev evaluation) is estimated at ${next_cost:.4f}" if next_cost else "")
            + (f", and ${reserve:.3g} is held back for the held-out evaluation" if reserve else "")
        )
    if budget.seconds is not None and elapsed_s(run) >= budget.seconds:
        return f"the time budget of {budget.seconds} s is spent ({elapsed_s(run):.0f} s so far)"
    deadline = request.constraints.deadline
    if deadline is not None and utcnow() >= _aware(deadline):
        return f"the deadline {deadline.isoformat()} has passed"
    return None


# ---- baseline -------------------------------------------------------------------------------


def eval_cost_per_task(session: Session, run: AutotuneRun) -> float:
    """What evaluating one task costs, as measured so far: the most per task of the base's eval
    runs and of every finished trial's dev run (a trained version may answer at greater length,
    or in more tool steps, than the base). Zero before any has finished."""
    ids = list(run.state.get("base_evals", {}).values())
    ids += [t.eval_run_id for t in trials_of(session, run) if t.eval_run_id is not None]
    rates = [0.0]
    for eval_run in session.execute(select(EvalRun).where(EvalRun.id.in_(ids))).scalars() if ids else []:
        tasks = int(eval_run.metrics.get("tasks", 0)) if eval_run.status == "succeeded" else 0
        if tasks:
            rates.append(prices.eval_cost(session, eval_run) / tasks)
    return max(rates)


def _tasks_in(session: Session, run: AutotuneRun, role: str) -> int:
    """Tasks of the base's eval run on `role`'s split (dev or heldout): what a trial's dev run,
    or the final held-out run, evaluates."""
    eval_run = session.get(EvalRun, run.state.get("base_evals", {}).get(role, ""))
    return int(eval_run.metrics.get("tasks", 0)) if eval_run is not None else 0


def heldout_reserve(session: Session, run: AutotuneRun) -> float:
    """What the final held-out evaluation of the best version should cost: the held-out tasks at
    the measured cost per task (`eval_cost_per_task`). Measured, never guessed; it grows when a
    trained version's evaluation costs more per task than anything before."""
    return eval_cost_per_task(session, run) * _tasks_in(session, run, "heldout")


def _evaluate(tick: Tick, run: AutotuneRun, model: str, split: str) -> str:
    request = _request(run)
    body = EvalRunCreate(
        benchmark_id=run.benchmark_id,
        version=run.state["version"],
        model=model,
        split=split,
        max_tokens=request.eval_max_tokens,
        seed=request.seed,
    )
    created = evals.create_eval_run(
        tick.session, _principal(run), body, send=tick.send, quotas=tick.quotas, store=tick.store
    )
    return created.id


def _runs_done(session: Session, ids: dict[str, str]) -> dict[str, EvalRun] | None:
    """The eval runs by role once all finished (None while one runs); a failed one raises."""
    rows = {role: session.get(EvalRun, run_id) for role, run_id in ids.items()}
    if any(row is None or row.status not in FINISHED for row in rows.values()):
        return None
    for role, row in rows.items():
        assert row is not None
        if row.status != "succeeded":
            raise InvalidRequest(f"the {role} eval run {row.id} {row.status}: {row.error}", param="benchmark_id")
    return rows  # type: ignore[return-value]


def _settle_version(tick: Tick, run: AutotuneRun) -> None:
    """Pick the benchmark version, giving it a dev split if it has none."""
    request = _request(run)
    benchmark = benchmarks.get_benchmark(tick.session, run.organization_id, run.benchmark_id)
    version = benchmarks.get_version(tick.session, benchmark, request.version)
    splits = request.splits
    for role, name in (("train", splits.train), ("heldout", splits.heldout)):
        if version.splits.get(name, 0) == 0:
            raise InvalidRequest(
                f"version {version.version} of benchmark {benchmark.name!r} has no {name!r} split for {role}; its "
                f"splits: {version.splits}. Name the splits to use in `splits`",
                param=f"splits.{role}",
            )
    if version.splits.get(splits.dev, 0) == 0:
        tasks = benchmarks.load_tasks(tick.store, version.object_key, version.sha256)
        carved = [
            task.model_copy(update={"split": splits.dev})
            if task.split == splits.train and _bucket(task.id) < DEV_PERCENT
            else task
            for task in tasks
        ]
        moved = sum(task.split == splits.dev for task in carved)
        if moved == 0 or moved == version.splits[splits.train]:
            raise InvalidRequest(
                f"the {splits.train!r} split of benchmark {benchmark.name!r} has too few tasks "
                f"({version.splits[splits.train]}) to set a dev split apart; add a {splits.dev!r} split",
                param="splits.dev",
            )
        derived = benchmarks.add_version_of_tasks(tick.session, tick.store, benchmark, carved, version.grader)
        decide(
            run,
            f"use benchmark {benchmark.name!r} version {derived.version}",
            f"version {version.version} has no {splits.dev!r} split: version {derived.version} has the same tasks, "
            f"with {moved} of the {version.splits[splits.train]} {splits.train!r} tasks (by task-id hash) as "
            f"{splits.dev!r} for choosing among trials; {splits.heldout!r} is untouched",
        )
        version = derived
    _set_state(run, version=version.version, benchmark_version_id=version.id, grader=version.grader)


def _bucket(task_id: str) -> int:
    return int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) % 100


def _production_model(tick: Tick, run: AutotuneRun) -> str | None:
    target = _request(run).target
    if target.deployment is None:
        return None
    deployment = deployments.get_deployment(tick.session, run.organization_id, target.deployment)
    revision = deployments.current_revision(tick.session, deployment)
    if revision.adapter_version_id is None:
        raise InvalidRequest(
            f"deployment {deployment.name!r} serves no single adapter version (a mixture or the base): "
            "give target.pass_rate instead",
            param="target.deployment",
        )
    from mint.services.models.adapters import model_ref_of_id

    return model_ref_of_id(tick.session, revision.adapter_version_id)


def _baseline(tick: Tick, run: AutotuneRun) -> bool:
    request = _request(run)
    splits = request.splits
    if "version" not in run.state:
        _settle_version(tick, run)
    if "base_evals" not in run.state:
        production = _production_model(tick, run)
        base_evals = {role: _evaluate(tick, run, run.base_model, getattr(splits, role)) for role in ("train", "dev")}
        base_evals["heldout"] = _evaluate(tick, run, run.base_model, splits.heldout)
        state: dict[str, Any] = {"base_evals": base_evals}
        others = request.constraints.bases
        if others:
            state["other_base_evals"] = {
                other: {role: _evaluate(tick, run, other, getattr(splits, role)) for role in ("dev", "heldout")}
                for other in others
            }
        if production is not None:
            state["production"] = production
            state["production_evals"] = {
                role: _evaluate(tick, run, production, getattr(splits, role)) for role in ("dev", "heldout")
            }
        _set_state(run, **state)
        decide(
            run,
            "evaluate the base",
            f"{run.base_model} on {splits.train}, {splits.dev} and {splits.heldout}"
            + (f", and production ({production}) on {splits.dev} and {splits.heldout}" if production else "")
            + (f", and the other bases ({', '.join(others)}) on {splits.dev} and {splits.heldout}" if others else "")
            + ": the starting point every trial is measured against",
        )
        return False
    base = _runs_done(tick.session, run.state["base_evals"])
    production = _runs_done(tick.session, run.state.get("production_evals", {}))
    others_done = {
        other: _runs_done(tick.session, evals_of) for other, evals_of in run.state.get("other_base_evals", {}).items()
    }
    if base is None or production is None or any(done is None for done in others_done.values()):
        return False
    if others_done:
        _order_bases(run, base["dev"], {other: done["dev"] for other, done in others_done.items() if done})
    dev = base["dev"].metrics
    _set_state(
        run,
        base_dev={"accuracy": dev.get("accuracy", 0.0), "mean_score": dev.get("mean_score", 0.0)},
        dev_target=_dev_target(run, production),
    )
    _set_state(run, heldout_reserve=heldout_reserve(tick.session, run))
    if request.budget.usd is not None:
        decide(
            run,
            f"hold back ${run.state['heldout_reserve']:.3g} of the budget",
            f"for the final evaluation of the best version on {splits.heldout}: its "
            f"{_tasks_in(tick.session, run, 'heldout')} tasks at the most a task of the base's evaluations cost; "
            "the search spends the rest",
        )
    mined = _mine(tick, run, base["train"])
    choice = choose_methods(request.constraints.methods, run.state["base_dev"], mined)
    for decision, reason in choice.reasons:
        decide(run, decision, reason)
    if not choice.methods:
        return finish(
            tick,
            run,
            "stopped",
            "no allowed method has data to train on: the base's train failures gave no rows for "
            f"{', '.join(request.constraints.methods)}",
        )
    methods, types = choice.methods, request.constraints.training_types
    if types == ["full"] and methods != ["sft"]:
        methods = [method for method in methods if method == "sft"]
        decide(
            run,
            "train SFT only",
            "the only training type allowed is full-parameter, which trains supervised stages only (DPO and RL "
            "score against a frozen reference copy of the base)",
        )
    choose_full = full_choice(methods, types)
    if choose_full:
        decide(
            run,
            "consider full-parameter training",
            "the constraints allow LoRA and full-parameter training: after the LoRA default, the default SFT trial "
            "trains every weight when its estimate (device time at the GPU-hour price) fits the budget",
        )
    _set_state(run, phase="search", datasets=mined, methods=methods, choose_full=choose_full)
    return False


def _order_bases(run: AutotuneRun, own_dev: EvalRun, other_devs: dict[str, EvalRun]) -> None:
    """The bases the search tries, best dev result first (pass rate, then mean score; the run's
    own base first among equals), each with its default trial before anything else is tried."""
    devs = {run.base_model: own_dev, **other_devs}

    def result(name: str) -> tuple[float, float]:
        metrics = devs[name].metrics
        return (float(metrics.get("accuracy", 0.0)), float(metrics.get("mean_score", 0.0)))

    ordered = sorted(devs, key=lambda name: result(name), reverse=True)
    _set_state(run, bases=ordered)
    decide(
        run,
        f"consider {len(ordered)} bases",
        "their default trials first, in the order of their dev results: "
        + ", ".join(f"{name} (pass rate {result(name)[0]:.3f}, mean score {result(name)[1]:.3f})" for name in ordered),
    )


def _dev_target(run: AutotuneRun, production: dict[str, EvalRun] | None) -> float:
    """The dev pass rate that stops the search: the target itself, or production's dev pass
    rate plus the delta."""
    target = _request(run).target
    if target.pass_rate is not None:
        return target.pass_rate
    assert production is not None and target.delta_over_production is not None
    return min(1.0, production["dev"].metrics.get("accuracy", 0.0) + target.delta_over_production)


def _mine(tick: Tick, run: AutotuneRun, train_run: EvalRun) -> dict[str, str | None]:
    """Datasets mined from the base's train failures, by kind (None: none could be written)."""
    wanted = {DATA_OF_METHOD[method] for method in _request(run).constraints.methods}
    mined: dict[str, str | None] = {}
    for kind in ("chat", "preference", "prompts"):
        if kind not in wanted:
            continue
        try:
            dataset, result = evals.dataset_from_failures(
                tick.session, tick.store, _principal(run), FromFailuresCreate(eval_id=train_run.id, kind=kind)
            )
        except InvalidRequest as exc:
            decide(run, f"no {kind} data", exc.message)
            mined[kind] = None
            continue
        mined[kind] = dataset.id
        decide(
            run,
            f"mine {kind} data",
            f"{dataset.row_count} rows from the base's failed {train_run.split} tasks ({dataset.id}); "
            f"{len(result.skipped)} tasks gave none",
        )
    return mined


# ---- search ---------------------------------------------------------------------------------


def trial_score(trial: AutotuneTrial) -> float:
    """What the search maximises: the dev pass rate, mean score breaking ties; 0 for a failed trial."""
    if trial.dev_pass_rate is None:
        return 0.0
    return trial.dev_pass_rate + 1e-3 * (trial.dev_mean_score or 0.0)


def _search(tick: Tick, run: AutotuneRun) -> bool:
    request = _request(run)
    trials = trials_of(tick.session, run)
    current = next((t for t in trials if t.status in ("training", "evaluating")), None)
    if current is not None:
        _follow(tick, run, current, request)
        return False
    per_task = _update_reserve(tick.session, run, request)
    reason = _stop_reason(run, request, trials)
    if reason is not None:
        _set_state(run, phase="final", stop_reason=reason)
        decide(run, "stop the search", reason)
        return _final(tick, run)
    finished = [(t.params, trial_score(t)) for t in trials if t.status in ("done", "failed")]
    number = len(trials) + 1
    params = _next_params(run, request, finished)
    dev_eval = per_task * _tasks_in(tick.session, run, "dev")
    body, estimate = _priced(tick, run, request, params, number)
    if params.get("training_type") == "full" and _out_of_budget(run, request, estimate.cost_usd + dev_eval):
        # The budget decides between LoRA and full parameters: what is left does not pay for this one.
        cost = (
            f"${estimate.cost_usd:.4f} ({estimate.seconds:.0f} s of device time) and its dev evaluation ${dev_eval:.4f}"
        )
        if not any(done.get("training_type") == "full" for done, _ in finished):
            _set_state(run, choose_full=False)
            decide(
                run,
                "skip full-parameter training",
                f"the full-parameter default is estimated at {cost}, more than the budget has left; the search "
                "goes on with LoRA",
            )
            params = _next_params(run, request, finished)
        else:
            decide(
                run,
                "train LoRA instead of full parameters",
                f"the full-parameter trial is estimated at {cost}, more than the budget has left",
            )
            params = {**params, "training_type": "lora"}
        body, estimate = _priced(tick, run, request, params, number)
    over = _out_of_budget(run, request, estimate.cost_usd + dev_eval)
    if over is not None:
        _set_state(run, phase="final", stop_reason=over)
        decide(run, "stop the search", over)
        return _final(tick, run)
    try:
        job = fine_tuning.create_job(tick.session, _principal(run), body, send=tick.send, quotas=tick.quotas)
    except SpendLimitExceeded as refused:  # the organization's limits, not the run's budget
        _set_state(run, phase="final", stop_reason=refused.message)
        decide(run, "stop the search", f"the next trial is refused: {refused.message}")
        return _final(tick, run)
    tick.session.add(
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
    full = _training_type(request, params) == "full"
    decide(
        run,
        f"start trial {number}: {params['method']}" + (" (full-parameter)" if full else ""),
        f"learning-rate multiplier {params['learning_rate_multiplier']:.3g}, "
        + ("every weight" if full else f"rank {params['rank']}")
        + f", {params['steps']} steps (job {job.id}, estimated ${estimate.cost_usd:.4f}, {estimate.seconds:.0f} s); "
        + why_params(finished, run.state.get("bases", ()), bool(run.state.get("choose_full"))),
    )
    return False


def _training_type(request: AutotuneCreate, params: dict[str, Any]) -> str:
    """A trial's training type: its own where trials choose; else full only where the constraints
    allow nothing else (a run that dropped full-parameter training, or whose methods are not SFT,
    trains LoRA whatever order the constraints list the types in)."""
    chosen = params.get("training_type")
    if chosen is not None:
        return str(chosen)
    return "full" if request.constraints.training_types == ["full"] else "lora"


def _next_params(
    run: AutotuneRun, request: AutotuneCreate, finished: list[tuple[dict[str, Any], float]]
) -> dict[str, Any]:
    return next_params(
        finished,
        run.state["methods"],
        max_rank=request.constraints.max_rank,
        max_steps=request.constraints.max_steps,
        seed=request.seed,
        bases=run.state.get("bases", ()),
        choose_full=bool(run.state.get("choose_full")),
    )


def _priced(
    tick: Tick, run: AutotuneRun, request: AutotuneCreate, params: dict[str, Any], number: int
) -> tuple[FineTuningJobCreate, Any]:
    """The trial's job request and its estimate (checked as a create would check it)."""
    body = _job_body(run, request, params, number)
    return body, fine_tuning.check_job(tick.session, run.organization_id, body).estimate


def _update_reserve(session: Session, run: AutotuneRun, request: AutotuneCreate) -> float:
    """Hold back more for the held-out evaluation when a trial's dev evaluation showed that a
    trained version costs more per task to evaluate than anything measured before; returns the
    cost per task it is based on (`eval_cost_per_task`)."""
    before = float(run.state.get("heldout_reserve", 0.0))
    per_task = eval_cost_per_task(session, run)
    reserve = per_task * _tasks_in(session, run, "heldout")
    if reserve > before:
        _set_state(run, heldout_reserve=reserve)
        if request.budget.usd is not None:
            decide(
                run,
                f"hold back ${reserve:.3g} of the budget (was ${before:.3g})",
                "a trained version's evaluation costs more per task than the base's: the held-out evaluation "
                f"of {_tasks_in(session, run, 'heldout')} tasks at ${per_task:.3g} a task",
            )
    return per_task


def _stop_reason(run: AutotuneRun, request: AutotuneCreate, trials: list[AutotuneTrial]) -> str | None:
    done = [t for t in trials if t.status in ("done", "failed")]
    best = max(done, key=trial_score, default=None)
    if best is not None and (best.dev_pass_rate or 0.0) >= run.state["dev_target"]:
        return (
            f"trial {best.number} reached the target on {request.splits.dev}: pass rate "
            f"{best.dev_pass_rate:.3f} >= {run.state['dev_target']:.3f}"
        )
    if len(trials) >= request.constraints.max_trials:
        return f"all {request.constraints.max_trials} trials allowed have run"
    if best is not None:
        since_best = sum(1 for t in done if t.number > best.number)
        if since_best >= request.constraints.patience:
            return f"{since_best} trials in a row did not beat trial {best.number} on {request.splits.dev}"
    return _out_of_budget(run, request)


def _job_body(run: AutotuneRun, request: AutotuneCreate, params: dict[str, Any], number: int) -> FineTuningJobCreate:
    datasets = run.state["datasets"]
    method = params["method"]
    multiplier = params["learning_rate_multiplier"]
    rl = {"type": "reinforcement", "reinforcement": {"grader": run.state["grader"] or {"type": "exact"}}}
    base = params.get("base", run.base_model)
    suffix = request.suffix or f"auto-{run.id.removeprefix('auto_')[:12].lower()}"
    if base != run.base_model:  # an adapter belongs to one base: each base's trials get their own
        suffix = f"{suffix}-{re.sub(r'[^a-z0-9-]', '-', base.lower())}"[:48]
    common: dict[str, Any] = {
        "model": base,
        "seed": (request.seed + number) % (2**31 - 1),
        "suffix": suffix,
        "metadata": {"autotune_run": run.id, "trial": str(number)},
    }
    if _training_type(request, params) == "full":
        common["training_type"] = "full"
    else:
        common["lora"] = {"rank": params["rank"], "alpha": 2 * params["rank"]}
    if method == "sft_rl":
        half = max(1, params["steps"] // 2)
        hyper = {"hyperparameters": {"learning_rate_multiplier": multiplier}}
        stages = [
            {"method": {"type": "supervised", "supervised": hyper}, "training_file": datasets["chat"], "steps": half},
            {
                "method": {**rl, "reinforcement": {**rl["reinforcement"], **hyper}},
                "training_file": datasets["prompts"],
                "steps": half,
            },
        ]
        return FineTuningJobCreate.model_validate({**common, "stages": stages})
    kinds = {"sft": "supervised", "dpo": "dpo", "rl": "reinforcement"}
    section: dict[str, Any] = {"hyperparameters": {"learning_rate_multiplier": multiplier}}
    if method == "rl":
        section["grader"] = rl["reinforcement"]["grader"]
    return FineTuningJobCreate.model_validate(
        {
            **common,
            "training_file": datasets[DATA_OF_METHOD[method]],
            "steps": params["steps"],
            "method": {"type": kinds[method], kinds[method]: section},
        }
    )


def _follow(tick: Tick, run: AutotuneRun, trial: AutotuneTrial, request: AutotuneCreate) -> None:
    """Move a running trial on: its job to its dev eval, its dev eval to its score."""
    session = tick.session
    if trial.status == "training":
        job = session.get(TrainingJob, trial.job_id)
        assert job is not None
        trial.cost_usd = job.cost_usd
        if job.status == "succeeded":
            trial.model_ref = fine_tuning.fine_tuned_model_of(session, job)
            assert trial.model_ref is not None
            trial.eval_run_id = _evaluate(tick, run, trial.model_ref, request.splits.dev)
            trial.status = "evaluating"
        elif job.status in ("failed", "cancelled"):
            _end_trial(run, trial, "failed", f"job {job.id} {job.status}: {(job.error or {}).get('message', '')}")
        else:
            over = _out_of_budget(run, request)
            if over is not None:
                fine_tuning.cancel_job(session, _principal(run), job.id)
                decide(run, f"cancel trial {trial.number}", over)
        return
    result = session.get(EvalRun, trial.eval_run_id)
    assert result is not None
    if result.status == "succeeded":
        trial.dev_pass_rate = float(result.metrics.get("accuracy", 0.0))
        trial.dev_mean_score = float(result.metrics.get("mean_score", 0.0))
        best = max((t for t in trials_of(session, run) if t.status == "done"), key=trial_score, default=None)
        better = best is None or trial_score(trial) > trial_score(best)
        if better:
            _set_state(
                run,
                best={
                    "trial": trial.number,
                    "model": trial.model_ref,
                    "base": trial.params.get("base", run.base_model),
                    "dev_pass_rate": trial.dev_pass_rate,
                    "dev_mean_score": trial.dev_mean_score,
                },
            )
        _end_trial(
            run,
            trial,
            "done",
            f"{trial.model_ref}: {request.splits.dev} pass rate {trial.dev_pass_rate:.3f}, mean score "
            f"{trial.dev_mean_score:.3f}" + (" (best so far)" if better else ""),
        )
    elif result.status in ("failed", "cancelled"):
        _end_trial(run, trial, "failed", f"dev eval run {result.id} {result.status}")


def _end_trial(run: AutotuneRun, trial: AutotuneTrial, status: str, reason: str) -> None:
    trial.status, trial.finished_at = status, utcnow()
    decide(run, f"trial {trial.number} {status}", reason)


def _cancel_running_trial(tick: Tick, run: AutotuneRun) -> None:
    for trial in trials_of(tick.session, run):
        if trial.status == "training" and trial.job_id is not None:
            job = tick.session.get(TrainingJob, trial.job_id)
            if job is not None and job.status not in FINISHED:
                fine_tuning.cancel_job(tick.session, _principal(run), job.id)
            _end_trial(run, trial, "failed", "the run was cancelled")


# ---- final ----------------------------------------------------------------------------------


def _final(tick: Tick, run: AutotuneRun) -> bool:
    request = _request(run)
    best = run.state.get("best")
    reason = run.state.get("stop_reason", "")
    if best is None:
        return finish(tick, run, "stopped", f"{reason}; no trial produced a version that could be evaluated")
    base_model = best.get("base", run.base_model)
    if "final_eval" not in run.state and request.budget.usd is not None:
        reserve = heldout_reserve(tick.session, run)
        if run.cost_usd + reserve > request.budget.usd:
            # The budget is a cap: the held-out evaluation is left for the team to run.
            _set_state(
                run,
                result={
                    "model": best["model"],
                    "base_model": base_model,
                    "heldout_pass_rate": None,
                    "stop_reason": reason,
                },
            )
            return finish(
                tick,
                run,
                "stopped",
                f"{reason}. Best version {best['model']} (dev pass rate {best['dev_pass_rate']:.3f}); its held-out "
                f"evaluation would cost about ${reserve:.4f}, more than the ${request.budget.usd - run.cost_usd:.4f} "
                f"left: evaluate it with POST /v1/evals (model {best['model']}, split {request.splits.heldout})",
            )
    if "final_eval" not in run.state:
        _set_state(run, final_eval=_evaluate(tick, run, best["model"], request.splits.heldout))
        decide(run, "evaluate the best version on held-out", f"{best['model']} (trial {best['trial']})")
        return False
    done = _runs_done(tick.session, {"held-out": run.state["final_eval"]})
    if done is None:
        return False
    final = done["held-out"]
    session, org = tick.session, run.organization_id
    base_heldout = (
        run.state["base_evals"]["heldout"]
        if base_model == run.base_model
        else run.state["other_base_evals"][base_model]["heldout"]
    )
    against_base = evals.compare_eval_runs(session, org, base_heldout, final.id)
    result: dict[str, Any] = {
        "model": best["model"],
        "base_model": base_model,
        "heldout_pass_rate": final.metrics.get("accuracy", 0.0),
        "base_heldout_pass_rate": float(_eval_run(session, base_heldout).metrics.get("accuracy", 0.0)),
        "against_base": _comparison_summary(against_base),
        "stop_reason": reason,
    }
    target = request.target
    if target.pass_rate is not None:
        met = result["heldout_pass_rate"] >= target.pass_rate
        goal = f"held-out pass rate {result['heldout_pass_rate']:.3f} against the target {target.pass_rate:.3f}"
    else:
        production_run = run.state["production_evals"]["heldout"]
        against_production = evals.compare_eval_runs(session, org, production_run, final.id)
        result["against_production"] = _comparison_summary(against_production)
        result["production"] = run.state["production"]
        assert target.delta_over_production is not None
        met = against_production.accuracy_delta >= target.delta_over_production
        goal = (
            f"held-out gain over production {against_production.accuracy_delta:+.3f} against the target "
            f"{target.delta_over_production:+.3f}"
        )
    _set_state(run, result=result)
    verdict = "met" if met else "not met"
    return finish(
        tick,
        run,
        "succeeded" if met else "stopped",
        f"{reason}. Best version {best['model']}: {goal} ({verdict}); against the base "
        f"{against_base.accuracy_delta:+.3f} [{against_base.interval.low:+.3f}, {against_base.interval.high:+.3f}]",
    )


def _eval_run(session: Session, run_id: str) -> EvalRun:
    found = session.get(EvalRun, run_id)
    assert found is not None, run_id
    return found


def _comparison_summary(comparison: Any) -> dict[str, Any]:
    return {
        "accuracy_delta": comparison.accuracy_delta,
        "interval": [comparison.interval.low, comparison.interval.high],
        "significant": comparison.significant,
        "fixed": len(comparison.fixed),
        "broken": len(comparison.broken),
        "tasks": comparison.tasks,
    }

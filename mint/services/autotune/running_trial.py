"""A running trial of an auto run: its job, then its dev eval run, then its score.

A trial is `training` while its job runs (cancelled when its cost passes what the search may
spend), `evaluating` while its version is evaluated on dev, and ends `done` (scored, and the
run's best if it beats it) or `failed`. At most one trial runs at a time.
"""

from __future__ import annotations

from mint.schemas.autotune_state import AutotuneBest
from mint.services.autotune.evaluations import evaluate
from mint.services.autotune.spend import out_of_budget
from mint.services.autotune.state import FINISHED, trial_score
from mint.services.autotune.tick import Tick
from mint.services.jobs import fine_tuning, versions
from mint.storage.tables import AutotuneTrial, EvalRun, TrainingJob, utcnow


def follow(tick: Tick, trial: AutotuneTrial) -> None:
    """Move a running trial on: its job to its dev eval, its dev eval to its score."""
    session, run, request = tick.session, tick.run, tick.request
    if trial.status == "training":
        job = session.get(TrainingJob, trial.job_id)
        assert job is not None
        trial.cost_usd = job.cost_usd
        if job.status == "succeeded":
            trial.model_ref = versions.fine_tuned_model_of(session, job)
            assert trial.model_ref is not None
            trial.eval_run_id = evaluate(tick, trial.model_ref, request.splits.dev)
            trial.status = "evaluating"
        elif job.status in ("failed", "cancelled"):
            end_trial(tick, trial, "failed", f"job {job.id} {job.status}: {(job.error or {}).get('message', '')}")
        else:
            over = out_of_budget(tick)
            if over is not None:
                fine_tuning.cancel_job(session, tick.principal, job.id)
                tick.decide(f"cancel trial {trial.number}", over)
        return
    result = session.get(EvalRun, trial.eval_run_id)
    assert result is not None
    if result.status == "succeeded":
        trial.dev_pass_rate = float(result.metrics.get("accuracy", 0.0))
        trial.dev_mean_score = float(result.metrics.get("mean_score", 0.0))
        best = max((t for t in tick.trials if t.status == "done"), key=trial_score, default=None)
        better = best is None or trial_score(trial) > trial_score(best)
        if better:
            assert trial.model_ref is not None  # set when its job succeeded
            tick.state.best = AutotuneBest(
                trial=trial.number,
                model=trial.model_ref,
                base=trial.params.get("base", run.base_model),
                dev_pass_rate=trial.dev_pass_rate,
                dev_mean_score=trial.dev_mean_score,
            )
            tick.save()
        end_trial(
            tick,
            trial,
            "done",
            f"{trial.model_ref}: {request.splits.dev} pass rate {trial.dev_pass_rate:.3f}, mean score "
            f"{trial.dev_mean_score:.3f}" + (" (best so far)" if better else ""),
        )
    elif result.status in ("failed", "cancelled"):
        end_trial(tick, trial, "failed", f"dev eval run {result.id} {result.status}")


def end_trial(tick: Tick, trial: AutotuneTrial, status: str, reason: str) -> None:
    trial.status, trial.finished_at = status, utcnow()
    tick.decide(f"trial {trial.number} {status}", reason)


def cancel_running_trial(tick: Tick) -> None:
    """Cancel the job of the trial in training (the run is being cancelled) and fail the trial."""
    for trial in tick.trials:
        if trial.status == "training" and trial.job_id is not None:
            job = tick.session.get(TrainingJob, trial.job_id)
            if job is not None and job.status not in FINISHED:
                fine_tuning.cancel_job(tick.session, tick.principal, job.id)
            end_trial(tick, trial, "failed", "the run was cancelled")

"""Auto runs (`/v1/autotune`): create, read, list, cancel, and the ticks that drive them.

A run is driven by a chain of `mint.autotune.tick` messages on the system queue: each tick
claims the run by its `tick_id` (compare and set), builds its context once (`tick.Tick.of`),
advances it one step (`driver.advance`), and sends the next tick with a new id after
`autotune_poll_s`. A duplicate message finds the id moved on and does nothing; a chain that
broke (a worker died between commit and send) is restarted by the reconciler
(`resend_quiet_runs`).
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import Conflict, InvalidRequest, NotFound
from mint.schemas.autotune import AutotuneCreate
from mint.schemas.autotune_state import AutotuneState
from mint.services import benchmarks
from mint.services.agreement import judge_warnings
from mint.services.autotune import driver
from mint.services.autotune.state import elapsed_s, state_of, trials_of
from mint.services.autotune.tick import Tick
from mint.services.catalog import get_deployment, resolve_model_ref
from mint.services.dispatch import Dispatch
from mint.services.principal import Principal
from mint.storage.db import session_scope
from mint.storage.queries import PageResult, get_owned, owned_by, paginate, rowcount
from mint.storage.tables import AutotuneRun, new_id, utcnow

TICK_TASK = "mint.autotune.tick"
ACTIVE = ("queued", "running")
# Ticks in a row that may raise an unexpected error (a database blip, a worker restart) before
# the run fails with that error instead of retrying for ever.
MAX_TICK_ERRORS = 5


def _new_tick_id() -> str:
    return f"tick-{secrets.token_hex(8)}"


def send_tick(run: AutotuneRun, send: Dispatch, *, countdown_s: float | None = None) -> None:
    assert run.tick_id is not None
    send(TICK_TASK, args=[run.id, run.tick_id], task_id=run.tick_id, countdown_s=countdown_s)


def create_run(session: Session, principal: Principal, body: AutotuneCreate, *, send: Dispatch) -> AutotuneRun:
    """Check the goal (base, benchmark, deployment), record the run (queued) and send its first tick."""
    principal.require("developer")
    model = resolve_model_ref(session, principal.organization_id, body.model)
    if model.adapter_version is not None:
        raise InvalidRequest(
            f"{body.model!r} is an adapter version; auto mode starts from a base model (e.g. {model.base_model!r})",
            param="model",
        )
    for index, name in enumerate(body.constraints.bases):
        try:
            other = resolve_model_ref(session, principal.organization_id, name)
        except (NotFound, InvalidRequest) as exc:
            raise InvalidRequest(f"constraints.bases[{index}]: {exc.message}", param="constraints.bases") from exc
        if other.adapter_version is not None or other.base_model in (model.base_model, *body.constraints.bases[:index]):
            raise InvalidRequest(
                f"constraints.bases[{index}] ({name!r}) must be a base model other than {body.model!r} "
                "and named once; adapter versions are not bases",
                param="constraints.bases",
            )
    benchmark = benchmarks.get_benchmark(session, principal.organization_id, body.benchmark_id)
    benchmarks.get_version(session, benchmark, body.version)  # it exists
    if body.target.deployment is not None:
        get_deployment(session, principal.organization_id, body.target.deployment)
    run = AutotuneRun(
        id=new_id("auto"),
        organization_id=principal.organization_id,
        base_model=model.base_model,
        benchmark_id=benchmark.id,
        status="queued",
        request=body.model_dump(mode="json"),
        created_by={"key_id": principal.key_id, "role": principal.role, "name": principal.name},
        state=AutotuneState(phase="baseline").stored(),
        decisions=[],
        tick_id=_new_tick_id(),
    )
    session.add(run)
    session.commit()  # visible to the driver before its message exists
    send_tick(run, send)
    return run


def get_run(session: Session, organization_id: str, run_id: str) -> AutotuneRun:
    return get_owned(session, AutotuneRun, run_id, organization_id=organization_id, noun="auto run")


def list_runs(session: Session, organization_id: str, *, after: str | None, limit: int) -> PageResult[AutotuneRun]:
    return paginate(session, owned_by(AutotuneRun, organization_id), AutotuneRun, after=after, limit=limit)


def cancel_run(session: Session, principal: Principal, run_id: str) -> AutotuneRun:
    """Ask the driver to stop: it cancels the running trial's job and finishes the run."""
    principal.require("developer")
    run = get_run(session, principal.organization_id, run_id)
    if run.status not in ACTIVE:
        raise Conflict(f"auto run {run.id} already {run.status}; only queued or running runs can be cancelled")
    run.cancel_requested_at = utcnow()
    session.flush()
    return run


def run_view(session: Session, run: AutotuneRun) -> dict[str, Any]:
    """The API's view of a run: status, phase, money and time so far, best, result, decisions, trials."""
    state = state_of(run)
    return {
        "id": run.id,
        "model": run.base_model,
        "benchmark_id": run.benchmark_id,
        "status": run.status,
        "phase": state.phase,
        "request": run.request,
        "cost_usd": run.cost_usd,
        "elapsed_s": elapsed_s(run),
        "best": state.best.stored() if state.best is not None else None,
        "result": (state.result.stored() if state.result is not None else None)
        or ({"stop_reason": state.stop_reason} if state.stop_reason is not None else None),
        "decisions": run.decisions,
        "trials": [
            {
                "number": t.number,
                "method": t.method,
                "params": t.params,
                "status": t.status,
                "job_id": t.job_id,
                "eval_id": t.eval_run_id,
                "model": t.model_ref,
                "dev_pass_rate": t.dev_pass_rate,
                "dev_mean_score": t.dev_mean_score,
                "estimated_usd": t.estimated_usd,
                "cost_usd": t.cost_usd,
            }
            for t in trials_of(session, run)
        ],
        "error": run.error,
        "warnings": _judge_warnings(session, run),
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
    }


def _judge_warnings(session: Session, run: AutotuneRun) -> list[str]:
    """The judges the experts disagree with, on the benchmark version the run asked for and on
    the one it settled on (a version with a dev split it made from the first): the run's dev and
    held-out pass rates are read through their grades."""
    benchmark = benchmarks.get_benchmark(session, run.organization_id, run.benchmark_id)
    asked = benchmarks.get_version(session, benchmark, run.request.get("version")).id
    settled = state_of(run).benchmark_version_id
    found: list[str] = []
    for version_id in dict.fromkeys(filter(None, (asked, settled))):
        found += judge_warnings(session, run.organization_id, version_id)
    return found


def tick(settings: Settings, run_id: str, tick_id: str, send: Dispatch) -> str:
    """One tick of a run's driver (the Celery task's body); what it did, for the logs."""
    following = _new_tick_id()
    with session_scope(settings.database) as session:
        claimed = rowcount(
            session.execute(
                update(AutotuneRun)
                .where(AutotuneRun.id == run_id, AutotuneRun.tick_id == tick_id, AutotuneRun.status.in_(ACTIVE))
                .values(tick_id=following, advanced_at=utcnow())
                .execution_options(synchronize_session=False)
            )
        )
        session.commit()
        if not claimed:
            return "not this tick's run (a duplicate, or the run is finished)"
        run = session.get(AutotuneRun, run_id)
        assert run is not None
        try:
            ticking = Tick.of(session, settings, send, run)
            done = driver.advance(ticking)
        except Exception as exc:
            session.rollback()
            run = session.get(AutotuneRun, run_id)
            assert run is not None
            run.tick_id = following
            ticking = Tick.of(session, settings, send, run)  # the run as it was before this tick
            ticking.state.tick_errors += 1
            ticking.save()
            if ticking.state.tick_errors >= MAX_TICK_ERRORS:
                _fail_on_error(ticking, exc)
                session.commit()
                raise
            # Keep the chain: the next tick tries again from what the database holds.
            session.commit()
            send_tick(run, send, countdown_s=settings.autotune_poll_s)
            raise
        if ticking.state.tick_errors:  # this tick went through: the errors in a row start again from none
            run.state = ticking.state.model_dump(mode="json", exclude_unset=True, exclude={"tick_errors"})
        session.commit()
        if not done:
            send_tick(run, send, countdown_s=settings.autotune_poll_s)
        return f"{run.status} ({ticking.state.phase})"


def _fail_on_error(ticking: Tick, exc: Exception) -> None:
    """End the run as failed after `MAX_TICK_ERRORS` ticks in a row raised `exc`'s kind of error."""
    message = f"the driver failed {MAX_TICK_ERRORS} ticks in a row, last with {type(exc).__name__}: {exc}"
    ticking.finish("failed", message, error={"type": "internal_error", "message": message})


def resend_quiet_runs(session: Session, send: Dispatch, *, quiet_s: float) -> list[str]:
    """Restart the driver of every active run that has not ticked for `quiet_s` (its chain of
    messages broke); returns their ids."""
    cutoff = utcnow() - timedelta(seconds=quiet_s)
    quiet = session.execute(
        select(AutotuneRun).where(
            AutotuneRun.status.in_(ACTIVE),
            (AutotuneRun.advanced_at.is_(None) & (AutotuneRun.created_at < cutoff))
            | (AutotuneRun.advanced_at < cutoff),
        )
    ).scalars()
    restarted = []
    for run in quiet:
        run.tick_id = _new_tick_id()
        run.advanced_at = utcnow()
        session.commit()
        send_tick(run, send)
        restarted.append(run.id)
    return restarted

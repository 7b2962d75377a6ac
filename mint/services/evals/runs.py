"""Eval runs, the API half: create and send, read, cancel, compare, mine, gate.

The row is the truth (DESIGN.md section 2). Each status change has one owner:
- the API: creates the run `queued` and may cancel it (`queued | running -> cancelled`);
- the worker: `queued -> running -> succeeded | failed`, each move conditional on the row
  still being queued or running, so a cancel always wins.
A run is committed before its message is sent, so a worker never looks for a row that is not
there. The message carries only the run's id.

A run records, at creation, the benchmark version's object key and sha256 (after locking the
version), and the worker evaluates exactly that content. Trajectories are written a batch at
a time and are unique per (run, task): a redelivered message skips the tasks already written
and samples the rest with the same per-task seeds, so a run resumed after a worker died gives
the trajectories an uninterrupted one would.

The worker half (claiming a run, sampling through a serving node or the worker's sampler,
writing trajectories) is `mint.services.evals.runner`; this module imports no evals runtime.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest
from mint.evals.compare import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Comparison,
    compare_runs,
)
from mint.evals.mining import MiningKind, MiningResult, mine_failures
from mint.schemas.evals import EvalRunCreate, FromFailuresCreate
from mint.services import benchmarks, catalog
from mint.services.billing import spend
from mint.services.billing.quotas import QuotaDefaults, hold
from mint.services.datasets import dataset_of_mined
from mint.services.dispatch import Dispatch
from mint.services.evals.judges import resolve_judges
from mint.services.evals.reward_endpoints import check_version
from mint.services.leases import gave_up
from mint.services.principal import Principal
from mint.services.serving import inference
from mint.services.serving.nodes import live_nodes
from mint.services.webhooks import events
from mint.storage.objects import ObjectStore
from mint.storage.queries import PageResult, owned_by, paginate, rowcount
from mint.storage.tables import (
    AdapterVersion,
    Benchmark,
    BenchmarkVersion,
    Dataset,
    EvalRun,
    Trajectory,
    new_id,
    utcnow,
)

log = logging.getLogger(__name__)

RUN_EVAL_TASK = "mint.evals.run"
ACTIVE = ("queued", "running")
FINISHED = ("succeeded", "failed", "cancelled")


# ---- creating and reading runs ---------------------------------------------------------------


def evaluated_model(
    session: Session, organization_id: str, ref: str
) -> tuple[catalog.ResolvedModel, dict[str, Any] | None]:
    """What an eval of `ref` measures: a base, an adapter version, or what a deployment serves
    now (its current revision's version, and the deployment and revision, kept in the run's
    config), so the ruler measures what is in production.

    A mixture deployment is measured as it serves: each task goes through its router, on a
    serving node of the base, and its trajectory records the adapter chosen at each step and
    why. The revision's spec and versions are pinned in the config, so a later promotion does
    not change what the run measures."""
    found = catalog.deployment_of_model(session, organization_id, ref) if "@" not in ref else None
    if found is None:
        return catalog.resolve_model_ref(session, organization_id, ref), None
    deployment, revision = found
    production = {"name": deployment.name, "id": deployment.id, "revision": revision.revision}
    if revision.adapter_version_id is None:
        if not live_nodes(session, deployment.base_model):
            raise InvalidRequest(
                f"deployment {deployment.name!r} routes among several versions (a mixture); it is evaluated "
                f"through a serving node of base {deployment.base_model!r}, where its router runs, and none is "
                f"live: start one with `mint serve --base {deployment.base_model}`",
                param="model",
            )
        mixture = inference.plan_for(session, organization_id, deployment.name).mixture
        assert mixture is not None
        production["mixture"] = mixture.model_dump(mode="json")
        return catalog.ResolvedModel(deployment.name, deployment.base_model, None), production
    version = session.get(AdapterVersion, revision.adapter_version_id)
    assert version is not None
    adapter_ref = catalog.model_ref_of_id(session, version.id)
    model = catalog.ResolvedModel(ref=adapter_ref, base_model=deployment.base_model, adapter_version=version)
    return model, production


def create_eval_run(
    session: Session,
    principal: Principal,
    body: EvalRunCreate,
    *,
    send: Dispatch,
    quotas: QuotaDefaults,
    store: ObjectStore,
) -> EvalRun:
    """Check the request, lock the benchmark version, record the run (queued) and send it to its base's workers.

    An organization at its eval runs quota is refused (QuotaExceeded), and nothing is recorded
    or locked. The models the version's judge graders name are resolved in the organization and
    pinned in the run's config (`mint.services.evals.judges`); one that is not there is a 400.
    """
    benchmark = benchmarks.get_benchmark(session, principal.organization_id, body.benchmark_id)
    model, production = evaluated_model(session, principal.organization_id, body.model)
    # Locked first, then read: the split and content recorded are the locked version's. Any
    # refusal below rolls the lock back with the rest of the request.
    version = benchmarks.lock_version(session, benchmarks.get_version(session, benchmark, body.version))
    if body.split is not None and body.split not in version.splits:
        have = ", ".join(f"{name} ({count} tasks)" for name, count in version.splits.items()) or "none"
        raise InvalidRequest(
            f"version {version.version} of benchmark {benchmark.name!r} has no split {body.split!r}; "
            f"its splits: {have}. Omit split to run every task",
            param="split",
        )
    task_count = version.splits[body.split] if body.split is not None else version.task_count
    judges = resolve_judges(session, principal.organization_id, store, version, base_model=model.base_model)
    check_version(session, principal.organization_id, store, version)
    organization = hold(session, principal.organization_id, "eval_runs", quotas)
    spend.check_month_open(session, organization, "eval run")
    run = EvalRun(
        id=new_id("eval"),
        organization_id=principal.organization_id,
        benchmark_version_id=version.id,
        model_ref=model.ref,
        adapter_version_id=model.adapter_version.id if model.adapter_version is not None else None,
        split=body.split,
        status="queued",
        config={
            "base_model": model.base_model,
            "benchmark_id": benchmark.id,
            "benchmark_name": benchmark.name,
            "version": version.version,
            "object_key": version.object_key,
            "sha256": version.sha256,
            "task_count": task_count,
            "max_tokens": body.max_tokens,
            "temperature": body.temperature,
            "seed": body.seed,
            "max_steps": body.max_steps,
            **({"judges": judges} if judges else {}),
            **({"deployment": production} if production else {}),
        },
    )
    mark_queued(run)
    session.add(run)
    session.commit()  # visible to the worker before its message exists
    send_run(run, send)
    return run


def mark_queued(run: EvalRun) -> None:
    """Give the run a new queue message id and queue it; the caller commits, then sends."""
    run.status = "queued"
    run.task_id = f"{run.id}:{uuid.uuid4().hex[:12]}"
    run.enqueued_at = utcnow()
    run.worker_id = None
    run.heartbeat_at = None


def give_up(session: Session, run: EvalRun, last_error: str, send: Dispatch | None = None) -> None:
    """Fail a run that has had all its attempts, with its last error; the caller commits (and
    `send` then sends the webhook deliveries of its failure)."""
    run.status, run.finished_at = "failed", utcnow()
    run.worker_id, run.heartbeat_at = None, None
    run.error = {"type": "max_attempts_exceeded", "message": gave_up(run.attempts, last_error)}
    events.eval_run_event(session, run, send)


def send_run(run: EvalRun, send: Dispatch, *, countdown_s: float | None = None) -> None:
    """Publish the run's message (to run after `countdown_s`). A failure is left to the
    reconciler: the row is committed."""
    try:
        send(
            RUN_EVAL_TASK,
            args=[run.id],
            task_id=run.task_id,
            base_model=run.config["base_model"],
            countdown_s=countdown_s,
        )
    except Exception:  # noqa: BLE001 - the broker may be down; the reconciler re-sends queued runs
        log.warning("could not send eval run %s now; the reconciler will", run.id, exc_info=True)


def list_eval_runs(
    session: Session, organization_id: str, *, benchmark_id: str | None, after: str | None, limit: int
) -> PageResult[EvalRun]:
    query = owned_by(EvalRun, organization_id)
    if benchmark_id is not None:
        query = query.join(BenchmarkVersion, BenchmarkVersion.id == EvalRun.benchmark_version_id).where(
            BenchmarkVersion.benchmark_id == benchmark_id
        )
    return paginate(session, query, EvalRun, after=after, limit=limit)


def run_views(session: Session, runs: Sequence[EvalRun]) -> list[dict[str, Any]]:
    """Runs as the API shows them, with their benchmark and version number (one query for all)."""
    ids = {run.benchmark_version_id for run in runs}
    versions = {
        row.id: row for row in session.execute(select(BenchmarkVersion).where(BenchmarkVersion.id.in_(ids))).scalars()
    }
    written = dict(
        session.execute(
            select(Trajectory.eval_run_id, func.count())
            .where(Trajectory.eval_run_id.in_([run.id for run in runs]))
            .group_by(Trajectory.eval_run_id)
        ).all()
    )
    return [
        {
            "id": run.id,
            "benchmark_id": versions[run.benchmark_version_id].benchmark_id,
            "benchmark_version_id": run.benchmark_version_id,
            "version": versions[run.benchmark_version_id].version,
            "model": run.model_ref,
            "base_model": run.config.get("base_model", ""),
            "adapter_version_id": run.adapter_version_id,
            "split": run.split,
            "status": run.status,
            "config": run.config,
            "metrics": run.metrics,
            "tasks_done": int(written.get(run.id, 0)),
            "attempts": run.attempts,
            "error": run.error,
            "created_at": run.created_at,
            "started_at": run.started_at,
            "finished_at": run.finished_at,
        }
        for run in runs
    ]


def cancel_eval_run(session: Session, principal: Principal, eval_id: str) -> EvalRun:
    """Stop a queued or running run; its worker stops at the next batch. A finished run is a conflict."""
    run = catalog.get_eval_run(session, principal.organization_id, eval_id)
    changed = session.execute(
        update(EvalRun)
        .where(EvalRun.id == run.id, EvalRun.status.in_(ACTIVE))
        .values(status="cancelled", finished_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.refresh(run)
    if not rowcount(changed):
        raise Conflict(f"eval run {run.id} has already {run.status}; only queued or running runs can be cancelled")
    return run


def list_trajectories(
    session: Session,
    run: EvalRun,
    *,
    passed: bool | None,
    after: str | None,
    limit: int,
    task_id: str | None = None,
) -> PageResult[Trajectory]:
    """A run's trajectories in the order they were written, optionally only passed or failed
    ones, or only those of one task."""
    query = select(Trajectory).where(Trajectory.eval_run_id == run.id)
    if passed is not None:
        query = query.where(Trajectory.passed.is_(passed))
    if task_id is not None:
        query = query.where(Trajectory.task_id == task_id)
    return paginate(session, query, Trajectory, after=after, limit=limit, newest_first=False)


# ---- comparing, gating and mining ------------------------------------------------------------


def _describe_version(session: Session, run: EvalRun) -> str:
    version = session.get(BenchmarkVersion, run.benchmark_version_id)
    benchmark = session.get(Benchmark, version.benchmark_id) if version is not None else None
    if version is None or benchmark is None:
        return run.benchmark_version_id
    return f"benchmark {benchmark.name!r} version {version.version}"


def compare_eval_runs(
    session: Session,
    organization_id: str,
    a_id: str,
    b_id: str,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Comparison:
    """B against A, task by task, with a paired bootstrap interval; both runs on one benchmark version."""
    a = catalog.succeeded_run(catalog.get_eval_run(session, organization_id, a_id, param="a"), "a")
    b = catalog.succeeded_run(catalog.get_eval_run(session, organization_id, b_id, param="b"), "b")
    if a.benchmark_version_id != b.benchmark_version_id:
        raise InvalidRequest(
            f"eval run {a.id} evaluated {_describe_version(session, a)} and {b.id} evaluated "
            f"{_describe_version(session, b)}: a comparison needs the same tasks and graders. Run both models "
            "on one version (POST /v1/evals with `version`)",
            param="b",
        )
    return compare_runs(
        catalog.run_outcomes(session, a), catalog.run_outcomes(session, b), resamples=resamples, seed=seed
    )


def mine_run(session: Session, store: ObjectStore, run: EvalRun, kind: MiningKind) -> MiningResult:
    """Rows of `kind` from a finished run's failed trajectories."""
    catalog.succeeded_run(run, "eval_id")
    failed = list(
        session.execute(
            select(Trajectory)
            .where(Trajectory.eval_run_id == run.id, Trajectory.passed.is_(False))
            .order_by(Trajectory.created_at, Trajectory.id)
        ).scalars()
    )
    if not failed:
        raise InvalidRequest(f"eval run {run.id} has no failed trajectories: nothing to mine", param="eval_id")
    tasks = benchmarks.load_tasks(store, run.config["object_key"], run.config["sha256"])
    return mine_failures(kind, tasks, failed)


def dataset_from_failures(
    session: Session, store: ObjectStore, principal: Principal, body: FromFailuresCreate
) -> tuple[Dataset, MiningResult]:
    """A dataset of SFT rows, DPO pairs or RL prompts mined from a run's failures (the same rows: the same dataset)."""
    run = catalog.get_eval_run(session, principal.organization_id, body.eval_id, param="eval_id")
    result = mine_run(session, store, run, body.kind)
    dataset = dataset_of_mined(
        session,
        store,
        result,
        organization_id=principal.organization_id,
        what=f"the {len(result.skipped)} failed tasks of eval run {run.id}",
        filename=body.filename or f"{run.id}-failures-{body.kind}.jsonl",
        source_eval_run_id=run.id,
    )
    return dataset, result

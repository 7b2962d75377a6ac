"""Eval runs: create and send, run on the worker that holds the base, read, compare, mine, gate.

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
"""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import Conflict, InvalidRequest, MintError, NotFound
from mint.evals.benchmark import BenchmarkTask, select_split
from mint.evals.compare import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Comparison,
    RunOutcomes,
    TaskOutcome,
    compare_runs,
)
from mint.evals.gates import GateSpec, GateVerdict, evaluate_gate
from mint.evals.mining import MiningResult, mine_failures
from mint.evals.runner import (
    Generate,
    GenerateRequest,
    Generation,
    SamplerGenerate,
    TrajectoryRecord,
    run_batch,
    summarize,
)
from mint.schemas.evals import EvalRunCreate, FromFailuresCreate
from mint.schemas.inference import AdapterOnNode
from mint.services import adapters, benchmarks, node_client
from mint.services.auth import Principal
from mint.services.datasets import create_dataset_from_rows
from mint.services.leases import LeaseKeeper, claim_values, held_by
from mint.services.serving_nodes import live_nodes, node_for
from mint.services.usage import record_usage
from mint.serving.completion import NodeCompletion
from mint.storage.db import session_scope
from mint.storage.objects import ObjectStore, object_store_for
from mint.storage.queries import PageResult, get_owned, owned_by, paginate
from mint.storage.tables import (
    Adapter,
    AdapterVersion,
    Benchmark,
    BenchmarkVersion,
    Dataset,
    EvalRun,
    Trajectory,
    new_id,
    utcnow,
)

if TYPE_CHECKING:
    from mint.trainer.session import ResidentBase

log = logging.getLogger(__name__)

RUN_EVAL_TASK = "mint.evals.run"
ACTIVE = ("queued", "running")
FINISHED = ("succeeded", "failed", "cancelled")
# Tasks run together in one batched step and written in one transaction: the most work a
# redelivered message repeats, and how often a cancel is noticed.
BATCH_TASKS = 16

# Sends a task by name with string arguments to the queue of the workers that hold
# `base_model` (`send(task, args=[...], base_model=...)`; see mint.worker.dispatch.TaskSender).
SendTask = Callable[..., None]
LoadBase = Callable[[str], "ResidentBase"]


# ---- creating and reading runs ---------------------------------------------------------------


def create_eval_run(session: Session, principal: Principal, body: EvalRunCreate, *, send: SendTask) -> EvalRun:
    """Check the request, lock the benchmark version, record the run (queued) and send it to its base's workers."""
    benchmark = benchmarks.get_benchmark(session, principal.organization_id, body.benchmark_id)
    model = adapters.resolve_model_ref(session, principal.organization_id, body.model)
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


def send_run(run: EvalRun, send: SendTask) -> None:
    """Publish the run's message. A failure is left to the reconciler: the row is committed."""
    try:
        send(RUN_EVAL_TASK, args=[run.id], task_id=run.task_id, base_model=run.config["base_model"])
    except Exception:  # noqa: BLE001 - the broker may be down; the reconciler re-sends queued runs
        log.warning("could not send eval run %s now; the reconciler will", run.id, exc_info=True)


def get_eval_run(session: Session, organization_id: str, eval_id: str, *, param: str = "id") -> EvalRun:
    try:
        return get_owned(session, EvalRun, eval_id, organization_id=organization_id, noun="eval run")
    except NotFound as exc:
        raise NotFound(exc.message, param=param) from None


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
        session.execute(  # type: ignore[arg-type]
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
            "error": run.error,
            "created_at": run.created_at,
            "started_at": run.started_at,
            "finished_at": run.finished_at,
        }
        for run in runs
    ]


def cancel_eval_run(session: Session, principal: Principal, eval_id: str) -> EvalRun:
    """Stop a queued or running run; its worker stops at the next batch. A finished run is a conflict."""
    run = get_eval_run(session, principal.organization_id, eval_id)
    changed = session.execute(
        update(EvalRun)
        .where(EvalRun.id == run.id, EvalRun.status.in_(ACTIVE))
        .values(status="cancelled", finished_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.refresh(run)
    if not changed.rowcount:  # type: ignore[attr-defined]
        raise Conflict(f"eval run {run.id} has already {run.status}; only queued or running runs can be cancelled")
    return run


def list_trajectories(
    session: Session, run: EvalRun, *, passed: bool | None, after: str | None, limit: int
) -> PageResult[Trajectory]:
    """A run's trajectories in the order they were written, optionally only passed or failed ones."""
    query = select(Trajectory).where(Trajectory.eval_run_id == run.id)
    if passed is not None:
        query = query.where(Trajectory.passed.is_(passed))
    return paginate(session, query, Trajectory, after=after, limit=limit, newest_first=False)


# ---- comparing, gating and mining ------------------------------------------------------------


def _outcomes(session: Session, run: EvalRun) -> RunOutcomes:
    rows = session.execute(
        select(
            Trajectory.task_id,
            Trajectory.passed,
            Trajectory.score,
            Trajectory.steps,
            Trajectory.tokens_in,
            Trajectory.tokens_out,
            Trajectory.latency_ms,
        )
        .where(Trajectory.eval_run_id == run.id)
        .order_by(Trajectory.created_at, Trajectory.id)
    ).all()
    return RunOutcomes(
        run_id=run.id,
        benchmark_version_id=run.benchmark_version_id,
        outcomes=[TaskOutcome(*row) for row in rows],
    )


def _succeeded(run: EvalRun, param: str) -> EvalRun:
    if run.status != "succeeded":
        raise Conflict(f"eval run {run.id} is {run.status}; use runs that have succeeded", param=param)
    return run


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
    a = _succeeded(get_eval_run(session, organization_id, a_id, param="a"), "a")
    b = _succeeded(get_eval_run(session, organization_id, b_id, param="b"), "b")
    if a.benchmark_version_id != b.benchmark_version_id:
        raise InvalidRequest(
            f"eval run {a.id} evaluated {_describe_version(session, a)} and {b.id} evaluated "
            f"{_describe_version(session, b)}: a comparison needs the same tasks and graders. Run both models "
            "on one version (POST /v1/evals with `version`)",
            param="b",
        )
    return compare_runs(_outcomes(session, a), _outcomes(session, b), resamples=resamples, seed=seed)


def check_gate(
    session: Session, organization_id: str, spec: GateSpec, *, candidate_id: str, production_id: str | None
) -> GateVerdict:
    """A deployment gate's verdict for a candidate's run against production's run (None: nothing in production)."""
    candidate = _succeeded(get_eval_run(session, organization_id, candidate_id, param="candidate"), "candidate")
    production = None
    if production_id is not None:
        production = _succeeded(get_eval_run(session, organization_id, production_id, param="production"), "production")
    return evaluate_gate(
        spec,
        benchmark_name=str(candidate.config.get("benchmark_name", "")),
        candidate=_outcomes(session, candidate),
        production=_outcomes(session, production) if production is not None else None,
    )


def mine_run(session: Session, store: ObjectStore, run: EvalRun, kind: str) -> MiningResult:
    """Rows of `kind` from a finished run's failed trajectories."""
    _succeeded(run, "eval_id")
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
    return mine_failures(kind, tasks, failed)  # type: ignore[arg-type]


def dataset_from_failures(
    session: Session, store: ObjectStore, principal: Principal, body: FromFailuresCreate
) -> tuple[Dataset, MiningResult]:
    """A dataset of SFT rows, DPO pairs or RL prompts mined from a run's failures (the same rows: the same dataset)."""
    run = get_eval_run(session, principal.organization_id, body.eval_id, param="eval_id")
    result = mine_run(session, store, run, body.kind)
    if not result.rows:
        reasons = "; ".join(f"{task_id}: {why}" for task_id, why in result.skipped[:3])
        raise InvalidRequest(
            f"none of the {len(result.skipped)} failed tasks of eval run {run.id} gives a {body.kind} row ({reasons})",
            param="kind",
        )
    dataset = create_dataset_from_rows(
        session,
        store,
        organization_id=principal.organization_id,
        kind=body.kind,
        rows=result.rows,
        filename=body.filename or f"{run.id}-failures-{body.kind}.jsonl",
        source_eval_run_id=run.id,
    )
    return dataset, result


# ---- running on the worker -------------------------------------------------------------------


def _finish(session: Session, eval_run_id: str, worker_id: str, status: str, **values: Any) -> bool:
    """Move the run this worker holds to `status`; False if it was cancelled, or queued again
    after this worker's lease ran out, meanwhile."""
    changed = session.execute(
        update(EvalRun)
        .where(*held_by(EvalRun, eval_run_id, worker_id))
        .values(status=status, finished_at=utcnow(), **values)
        .execution_options(synchronize_session=False)
    )
    return bool(changed.rowcount)  # type: ignore[attr-defined]


def _still_held(settings: Settings, eval_run_id: str, worker_id: str) -> bool:
    """Whether this worker still holds the run (not cancelled, not queued again after a lost lease)."""
    with session_scope(settings.database) as session:
        held = session.execute(select(EvalRun.id).where(*held_by(EvalRun, eval_run_id, worker_id)))
        return held.scalar_one_or_none() is not None


def _write(settings: Settings, run: EvalRun, records: Sequence[TrajectoryRecord]) -> list[TrajectoryRecord]:
    """Insert the records of tasks not written yet; returns those inserted.

    Two deliveries of one message running at once would race on the unique (run, task)
    constraint: the loser reads what the winner wrote and inserts only the rest.
    """
    for _attempt in range(3):
        try:
            with session_scope(settings.database) as session:
                written = set(
                    session.execute(
                        select(Trajectory.task_id).where(
                            Trajectory.eval_run_id == run.id, Trajectory.task_id.in_([r.task_id for r in records])
                        )
                    ).scalars()
                )
                fresh = [record for record in records if record.task_id not in written]
                for record in fresh:
                    session.add(
                        Trajectory(
                            id=new_id("traj"),
                            eval_run_id=run.id,
                            task_id=record.task_id,
                            messages=record.messages,
                            output=record.output,
                            score=record.score,
                            passed=record.passed,
                            steps=record.steps,
                            tokens_in=record.tokens_in,
                            tokens_out=record.tokens_out,
                            latency_ms=record.latency_ms,
                            error=record.error,
                        )
                    )
                tokens = sum(record.tokens_in + record.tokens_out for record in fresh)
                if tokens:
                    record_usage(
                        session,
                        organization_id=run.organization_id,
                        kind="sampled",
                        tokens=tokens,
                        base_model=str(run.config["base_model"]),
                        model_ref=run.model_ref,
                        resource_type="eval_run",
                        resource_id=run.id,
                    )
            return fresh
        except IntegrityError:
            log.info("trajectories of eval run %s were written concurrently; retrying the rest", run.id)
    raise Conflict(f"could not write the trajectories of eval run {run.id}: they keep being written concurrently")


class NodeGenerate:
    """`Generate` through a serving node of the run's base: a batch's requests are sent at once
    and the node's engine runs them together (the base computed once per step, each request
    on its adapter), instead of one prompt after another on the worker's sampler. Replies are
    text, parsed for tool calls by the runner exactly as the sampler's are."""

    def __init__(self, url: str, adapter: AdapterOnNode | None, *, max_tokens: int, temperature: float) -> None:
        self.url, self.adapter = url, adapter
        self.max_tokens, self.temperature = max_tokens, temperature

    def __call__(self, requests: Sequence[GenerateRequest]) -> list[Generation]:
        with ThreadPoolExecutor(max_workers=max(1, len(requests))) as pool:
            return list(pool.map(self._one, requests))

    def _one(self, request: GenerateRequest) -> Generation:
        body = NodeCompletion(
            messages=[dict(message) for message in request.messages],
            tools=[dict(tool) for tool in request.tools] if request.tools else None,
            adapter=self.adapter,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=request.seed,
        )
        started = time.perf_counter()
        try:
            lines = node_client.complete(self.url, body)
        except InvalidRequest as refused:  # this task's prompt (e.g. too long): its trajectory says so
            latency_ms = 1000 * (time.perf_counter() - started)
            return Generation(text="", tokens_in=0, tokens_out=0, latency_ms=latency_ms, error=refused.message)
        latency_ms = 1000 * (time.perf_counter() - started)
        usage = lines[-1].get("usage") or {}
        text = "".join(line.get("text", "") for line in lines[1:])
        return Generation(
            text=text,
            tokens_in=int(usage.get("prompt_tokens", 0)),
            tokens_out=int(usage.get("completion_tokens", 0)),
            latency_ms=latency_ms,
        )


class _Model:
    """The run's model: through a live serving node of its base when there is one (batched on
    the node's engine), else on this worker's resident base (the base itself, or the adapter
    version opened as a session)."""

    def __init__(self, settings: Settings, run: EvalRun, load_base: LoadBase) -> None:
        self.settings = settings
        self.run = run
        self.load_base = load_base
        self.base: Any = None
        self.session_id: str | None = None
        self.generator = "trainer-sampler"

    def _node(self) -> tuple[str, AdapterOnNode | None] | None:
        base_model = str(self.run.config["base_model"])
        with session_scope(self.settings.database) as session:
            adapter = None
            if self.run.adapter_version_id is not None:
                version = self._version(session)
                adapter_row = session.get(Adapter, version.adapter_id)
                assert adapter_row is not None
                adapter = AdapterOnNode(
                    ref=adapters.model_ref_of(adapter_row, version),
                    sha256=version.sha256,
                    object_key=version.object_key,
                )
            if not live_nodes(session, base_model):
                return None
            url = node_for(session, base_model, adapter.sha256 if adapter else base_model).url
        try:  # a node that stopped without unregistering is skipped, not waited for
            httpx.get(f"{url}/healthz", timeout=2.0).raise_for_status()
        except httpx.HTTPError:
            log.warning("serving node %s does not answer; evaluating on this worker", url)
            return None
        return url, adapter

    def _version(self, session: Session) -> AdapterVersion:
        version = session.get(AdapterVersion, self.run.adapter_version_id)
        if version is None or version.status != "ready":
            raise NotFound(f"adapter version {self.run.adapter_version_id} is no longer available")
        return version

    def __enter__(self) -> Generate:
        config = self.run.config
        node = self._node()
        if node is not None:
            self.generator = "serving-node"
            return NodeGenerate(
                node[0], node[1], max_tokens=int(config["max_tokens"]), temperature=float(config["temperature"])
            )
        self.base = self.load_base(str(config["base_model"]))
        if self.run.adapter_version_id is not None:
            with session_scope(self.settings.database) as session:
                key = self._version(session).object_key
            archive = object_store_for(self.settings).get_bytes(key)
            with tempfile.TemporaryDirectory(prefix="mint-eval-adapter-") as scratch:
                folder = adapters.extract_adapter(archive, Path(scratch))
                self.session_id = self.base.create_session_from_adapter(folder).session_id
        return SamplerGenerate(
            self.base,
            adapter_name=self.session_id,
            max_tokens=int(config["max_tokens"]),
            temperature=float(config["temperature"]),
        )

    def __exit__(self, *exc_info: object) -> None:
        if self.session_id is not None:
            self.base.close(self.session_id)


def _todo(settings: Settings, run: EvalRun) -> list[BenchmarkTask]:
    tasks = benchmarks.load_tasks(object_store_for(settings), run.config["object_key"], run.config["sha256"])
    with session_scope(settings.database) as session:
        written = set(session.execute(select(Trajectory.task_id).where(Trajectory.eval_run_id == run.id)).scalars())
    return [task for task in select_split(tasks, run.split) if task.id not in written]


def _metrics(settings: Settings, run: EvalRun, ran: int, wall_s: float) -> dict[str, Any]:
    with session_scope(settings.database) as session:
        rows = list(session.execute(select(Trajectory).where(Trajectory.eval_run_id == run.id)).scalars())
    metrics: dict[str, Any] = dict(summarize(rows))
    metrics["wall_s"] = wall_s
    metrics["tasks_per_s"] = ran / wall_s if ran and wall_s > 0 else None
    return metrics


def execute_eval_run(
    settings: Settings,
    eval_run_id: str,
    load_base: LoadBase,
    *,
    batch_tasks: int = BATCH_TASKS,
    worker_id: str = "local",
) -> str:
    """Run an eval run on this worker; returns what happened (for logs and tests).

    Returns at once, touching nothing, if the run is gone or finished. Failures the user can
    act on (an adapter deleted meanwhile, content that no longer matches) fail the run with
    that message; anything else fails it as an internal error, logged with its traceback.
    """
    with session_scope(settings.database) as session:
        run = session.get(EvalRun, eval_run_id)
        if run is None:
            return "missing"
        if run.status in FINISHED:
            return run.status
        claimed = session.execute(
            update(EvalRun)
            .where(EvalRun.id == eval_run_id, EvalRun.status == "queued")
            .values(**claim_values(worker_id), started_at=func.coalesce(EvalRun.started_at, utcnow()))
            .execution_options(synchronize_session=False)
        ).rowcount
        if not claimed:
            return "not-claimed"  # another worker holds it; the reconciler requeues it if that one died
    with LeaseKeeper(settings, EvalRun, eval_run_id, worker_id):
        return _execute(settings, run, load_base, batch_tasks, worker_id)


def _execute(settings: Settings, run: EvalRun, load_base: LoadBase, batch_tasks: int, worker_id: str) -> str:
    eval_run_id = run.id
    try:
        todo = _todo(settings, run)
        config = run.config
        ran, wall_s = 0, 0.0
        model = _Model(settings, run, load_base)
        with model as generate:
            for start in range(0, len(todo), batch_tasks):
                if not _still_held(settings, run.id, worker_id):
                    return "cancelled"
                began = time.perf_counter()
                records = run_batch(
                    todo[start : start + batch_tasks],
                    generate,
                    max_steps=int(config["max_steps"]),
                    seed=int(config["seed"]),
                )
                wall_s += time.perf_counter() - began
                ran += len(_write(settings, run, records))
        metrics = _metrics(settings, run, ran, wall_s) | {"generator": model.generator}
        with session_scope(settings.database) as session:
            finished = _finish(session, run.id, worker_id, "succeeded", metrics=metrics)
        return "succeeded" if finished else "cancelled"
    except MintError as exc:
        error = {"type": exc.type, "message": exc.message}
    except Exception as exc:
        log.exception("eval run %s failed", eval_run_id)
        error = {"type": "internal_error", "message": f"{type(exc).__name__}: {exc}"}
    with session_scope(settings.database) as session:
        _finish(session, eval_run_id, worker_id, "failed", error=error)
    return "failed"

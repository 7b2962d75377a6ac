"""Eval runs, the worker half: claim a run, evaluate its model on its benchmark version, finish it.

Runs on the worker that keeps the run's base resident (`mint.worker.eval_tasks`); the API half
(`mint.services.evals.runs`) created the run and sent its id. The run's model answers through a
live serving node of its base when there is one (batched on the node's engine), else on this
worker's sampler; a whole-model version (a full-parameter job's) always on this worker, loaded
beside the base for the run; a judge grader's model is asked the same way (`_Judges`). Trajectories,
each with its grade record, are written a batch at a time and are unique per (run, task),
so a redelivered message skips the tasks already written; each status move is conditional
on this worker still holding the run, so a cancel always wins.
"""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import Conflict, InvalidRequest, MintError, NoCapacity, NotFound, RateLimited
from mint.evals.benchmark import BenchmarkTask, select_split
from mint.evals.graders import GradeContext
from mint.evals.runner import (
    Generate,
    GenerateRequest,
    Generation,
    SamplerGenerate,
    TrajectoryRecord,
    run_batch,
    summarize,
)
from mint.schemas.inference import AdapterOnNode
from mint.schemas.node import NodeCompletion
from mint.services import benchmarks
from mint.services.billing.usage import record_usage
from mint.services.dispatch import Dispatch
from mint.services.evals import runs as evals
from mint.services.evals.remote_environments import acting_for
from mint.services.evals.remote_rewards import RemoteRewards
from mint.services.evals.runs import FINISHED
from mint.services.leases import (
    WORKER_STOPPED,
    LeaseKeeper,
    capacity_wait_s,
    claim_row,
    exhausted,
    hand_back,
    held_by,
)
from mint.services.models import adapters
from mint.services.serving import inference, node_client
from mint.services.serving.nodes import NodeAddress, live_nodes, node_for
from mint.services.tinker.releases import release_idle_models
from mint.services.webhooks import events
from mint.serving.mixture import MixtureTarget
from mint.storage.db import session_scope
from mint.storage.objects import object_store_for
from mint.storage.queries import rowcount
from mint.storage.tables import Adapter, AdapterVersion, EvalRun, Trajectory, new_id, utcnow

if TYPE_CHECKING:
    from mint.trainer.session import ResidentBase

log = logging.getLogger(__name__)

# Tasks run together in one batched step and written in one transaction: the most work a
# redelivered message repeats, and how often a cancel is noticed.
BATCH_TASKS = 16
# The longest reply a judge model writes: a sentence or two and its `SCORE: n` line.
JUDGE_MAX_TOKENS = 256

LoadBase = Callable[[str], "ResidentBase"]


def _finish(
    session: Session, eval_run_id: str, worker_id: str, status: str, send: Dispatch | None, **values: Any
) -> bool:
    """Move the run this worker holds to `status`, with its webhook event in the same
    transaction; False if it was cancelled, or queued again after this worker's lease ran out,
    meanwhile."""
    changed = session.execute(
        update(EvalRun)
        .where(*held_by(EvalRun, eval_run_id, worker_id))
        .values(status=status, finished_at=utcnow(), **values)
        .execution_options(synchronize_session=False)
    )
    if not rowcount(changed):
        return False
    run = session.get(EvalRun, eval_run_id)
    assert run is not None
    session.refresh(run)
    events.eval_run_event(session, run, send)
    return True


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
                            grade=record.grade,
                            routes=record.routes,
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

    def __init__(
        self,
        node: NodeAddress,
        adapter: AdapterOnNode | None,
        *,
        max_tokens: int,
        temperature: float,
        mixture: MixtureTarget | None = None,
    ) -> None:
        self.node, self.adapter, self.mixture = node, adapter, mixture
        self.max_tokens, self.temperature = max_tokens, temperature

    def __call__(self, requests: Sequence[GenerateRequest]) -> list[Generation]:
        with ThreadPoolExecutor(max_workers=max(1, len(requests))) as pool:
            return list(pool.map(self._one, requests))

    def _one(self, request: GenerateRequest) -> Generation:
        body = NodeCompletion(
            messages=[dict(message) for message in request.messages],
            tools=[dict(tool) for tool in request.tools] if request.tools else None,
            adapter=self.adapter,
            mixture=self.mixture,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=request.seed,
        )
        started = time.perf_counter()
        try:
            lines = self._complete(body)
        except InvalidRequest as refused:  # this task's prompt (e.g. too long): its trajectory says so
            latency_ms = 1000 * (time.perf_counter() - started)
            return Generation(text="", tokens_in=0, tokens_out=0, latency_ms=latency_ms, error=refused.message)
        latency_ms = 1000 * (time.perf_counter() - started)
        usage = lines[-1].get("usage") or {}
        text = "".join(line.get("text", "") for line in lines[1:])
        # A mixture's first line names the adapter its router chose, and the decision.
        header = lines[0].get("served") or {}
        served = {"adapter": header.get("adapter"), "route": header.get("route")} if self.mixture else None
        return Generation(
            text=text,
            tokens_in=int(usage.get("prompt_tokens", 0)),
            tokens_out=int(usage.get("completion_tokens", 0)),
            latency_ms=latency_ms,
            served=served,
        )

    def _complete(self, body: NodeCompletion) -> list[dict[str, Any]]:
        """The node's lines; while its queue is full (429), wait as it says and ask again."""
        while True:
            try:
                return node_client.complete(self.node, body)
            except RateLimited as busy:
                time.sleep(busy.retry_after_s)


class _Model:
    """A model of a base, maybe under an adapter version: through a live serving node of the
    base when there is one (batched on the node's engine), else, when `local`, on this worker's
    resident base (the base itself, or the adapter version opened as a session). A mixture
    deployment's revision runs on a node only: its router (encoder, router model) lives there.
    A whole-model version (`kind` full) never goes to a node, whose engine holds LoRA adapters
    on the shared base: it is loaded on this worker as a model of its own until `__exit__`."""

    def __init__(
        self,
        settings: Settings,
        base_model: str,
        adapter: AdapterOnNode | None,
        load_base: LoadBase,
        *,
        max_tokens: int,
        temperature: float,
        local: bool = True,
        mixture: MixtureTarget | None = None,
        affinity: str | None = None,
    ) -> None:
        self.settings = settings
        self.base_model, self.adapter, self.mixture = base_model, adapter, mixture
        self.affinity = affinity or (adapter.sha256 if adapter else base_model)
        self.load_base = load_base
        self.max_tokens, self.temperature, self.local = max_tokens, temperature, local
        self.base: Any = None
        self.session_id: str | None = None
        self.scratch: tempfile.TemporaryDirectory[str] | None = None  # a whole model's files, while it runs
        self.generator = "trainer-sampler"

    def _node(self) -> NodeAddress | None:
        with session_scope(self.settings.database) as session:
            if not live_nodes(session, self.base_model):
                return None
            node = node_for(session, self.base_model, self.affinity, self.settings.shared_node_token)
        try:  # a node that stopped without unregistering is skipped, not waited for
            httpx.get(f"{node.url}/healthz", timeout=2.0).raise_for_status()
        except httpx.HTTPError:
            log.warning("serving node %s at %s does not answer; evaluating on this worker", node.id, node.url)
            return None
        return node

    def __enter__(self) -> Generate:
        if self.adapter is not None and self.adapter.kind == "full":
            return self._whole_model(self.adapter)
        node = self._node()
        if node is not None:
            self.generator = "serving-node"
            return NodeGenerate(
                node, self.adapter, max_tokens=self.max_tokens, temperature=self.temperature, mixture=self.mixture
            )
        if self.mixture is not None:
            raise InvalidRequest(
                f"a mixture deployment is evaluated through a serving node of base {self.base_model!r}, where its "
                f"router runs, and none is live; start one with `mint serve --base {self.base_model}`"
            )
        if not self.local:
            raise InvalidRequest(
                f"{self.adapter.ref if self.adapter else self.base_model!r} runs on base {self.base_model!r}, which "
                f"has no live serving node, and this worker holds another base; start one with "
                f"`mint serve --base {self.base_model}`"
            )
        self.base = self.load_base(self.base_model)
        if self.adapter is not None:
            archive = object_store_for(self.settings).get_bytes(self.adapter.object_key)
            release_idle_models(self.settings)  # slots of ended Tinker sessions first
            with tempfile.TemporaryDirectory(prefix="mint-eval-adapter-") as scratch:
                folder = adapters.extract_adapter(archive, Path(scratch))
                self.session_id = self.base.create_session_from_adapter(folder).session_id
        return SamplerGenerate(
            self.base, adapter_name=self.session_id, max_tokens=self.max_tokens, temperature=self.temperature
        )

    def _whole_model(self, version: AdapterOnNode) -> Generate:
        """The version's own weights, read from its archive into a folder kept until `__exit__`,
        loaded beside this worker's base (its spec, on its device, in the dtype it computes in)
        and sampled with no adapter."""
        from mint.trainer.models import spec_with_weights
        from mint.trainer.session import ResidentBase

        if not self.local:
            raise InvalidRequest(
                f"{version.ref!r} is a whole model of base {self.base_model!r}, which runs on a worker of that "
                "base, and this worker holds another base; evaluate a model of that base instead"
            )
        base = self.load_base(self.base_model)
        archive = object_store_for(self.settings).get_bytes(version.object_key)
        self.scratch = tempfile.TemporaryDirectory(prefix="mint-eval-model-")
        try:
            folder = adapters.extract_model(archive, Path(self.scratch.name) / "model")
            spec = spec_with_weights(base.spec, folder)
            dtype = str(base.model.dtype).removeprefix("torch.")
            self.base = ResidentBase(spec, self.settings.models_cache_dir, dtype=dtype, device=str(base.device))
        except BaseException:  # not entered: __exit__ will not run
            self.__exit__()
            raise
        return SamplerGenerate(self.base, adapter_name=None, max_tokens=self.max_tokens, temperature=self.temperature)

    def __exit__(self, *exc_info: object) -> None:
        if self.session_id is not None:
            self.base.close(self.session_id)
        if self.scratch is not None:  # a whole model: its weights and files go with it
            self.base = None
            self.scratch.cleanup()
            self.scratch = None


def _run_model(settings: Settings, run: EvalRun, load_base: LoadBase) -> _Model:
    """The run's own model: its base, under its adapter version if it has one (still ready)."""
    adapter = None
    if run.adapter_version_id is not None:
        with session_scope(settings.database) as session:
            version = session.get(AdapterVersion, run.adapter_version_id)
            if version is None or version.status != "ready":
                raise NotFound(f"adapter version {run.adapter_version_id} is no longer available")
            adapter_row = session.get(Adapter, version.adapter_id)
            assert adapter_row is not None
            adapter = inference.on_node(adapter_row, version)
    config = run.config
    production = config.get("deployment") or {}
    mixture = MixtureTarget.model_validate(production["mixture"]) if production.get("mixture") else None
    return _Model(
        settings,
        str(config["base_model"]),
        adapter,
        load_base,
        max_tokens=int(config["max_tokens"]),
        temperature=float(config["temperature"]),
        mixture=mixture,
        affinity=f"{production['name']}#{production['revision']}" if mixture else None,
    )


class _Judges:
    """`GradeContext.judge` for a run: asks the judge model a grader names, as pinned in the run's
    config when it was created (`mint.services.evals.judges`), through the path that generates the
    run's own answers (a serving node of the judge's base, else this worker's resident base
    when it is the run's). Greedy, so a task's verdict does not depend on the batch it ran in.
    Each judge is opened at its first use and closed with the run (`stack`)."""

    def __init__(self, settings: Settings, run: EvalRun, load_base: LoadBase, stack: ExitStack) -> None:
        self.settings, self.run, self.load_base, self.stack = settings, run, load_base, stack
        self.pinned: dict[str, Any] = dict(run.config.get("judges") or {})
        self.opened: dict[str, Generate] = {}

    def __call__(self, prompt: str, model: str | None) -> str:
        generate = self.opened.get(model or "")
        if generate is None:
            generate = self.opened[model or ""] = self._open(model)
        (generation,) = generate([GenerateRequest(messages=[{"role": "user", "content": prompt}], seed=0)])
        if generation.error is not None:
            raise InvalidRequest(f"the judge model {model!r} could not answer: {generation.error}")
        return generation.text

    def _open(self, model: str | None) -> Generate:
        pinned = self.pinned.get(model or "")
        if pinned is None:
            raise InvalidRequest(
                f"the judge model {model!r} was not resolved when this run was created; create a new run"
            )
        adapter = AdapterOnNode.model_validate(pinned["adapter"]) if pinned["adapter"] is not None else None
        judge = _Model(
            self.settings,
            str(pinned["base_model"]),
            adapter,
            self.load_base,
            max_tokens=JUDGE_MAX_TOKENS,
            temperature=0.0,
            local=pinned["base_model"] == self.run.config["base_model"],
        )
        return self.stack.enter_context(judge)


def _todo(settings: Settings, run: EvalRun) -> list[BenchmarkTask]:
    tasks = benchmarks.load_tasks(object_store_for(settings), run.config["object_key"], run.config["sha256"])
    with session_scope(settings.database) as session:
        written = set(session.execute(select(Trajectory.task_id).where(Trajectory.eval_run_id == run.id)).scalars())
    return [task for task in select_split(tasks, run.split) if task.id not in written]


def _metrics(settings: Settings, run: EvalRun, ran: int, wall_s: float) -> dict[str, Any]:
    with session_scope(settings.database) as session:
        rows = list(session.execute(select(Trajectory).where(Trajectory.eval_run_id == run.id)).scalars())
    metrics: dict[str, Any] = dict(summarize(rows))
    routed = [(row.routes, row.passed) for row in rows if row.routes]
    if routed:  # a mixture: how its router split the tasks (by each task's first step), and how each part did
        by_adapter: dict[str, dict[str, int]] = {}
        for routes, passed in routed:
            part = by_adapter.setdefault(str(routes[0].get("adapter")), {"tasks": 0, "passed": 0})
            part["tasks"] += 1
            part["passed"] += int(passed)
        metrics["routes"] = by_adapter
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
    send: Dispatch | None = None,
) -> str:
    """Run an eval run on this worker; returns what happened (for logs and tests).

    Returns at once, touching nothing, if the run is gone or finished. Failures the user can
    act on (an adapter deleted meanwhile, content that no longer matches) fail the run with
    that message; anything else fails it as an internal error, logged with its traceback. A
    worker with no free LoRA session slot for the run's adapter hands the run back to the
    queue to wait (`wait_for_capacity`; `send` carries its next message).
    """
    with session_scope(settings.database) as session:
        run = session.get(EvalRun, eval_run_id)
        if run is None:
            return "missing"
        if run.status in FINISHED:
            return run.status
        started_at = func.coalesce(EvalRun.started_at, utcnow())
        if not claim_row(session, EvalRun, eval_run_id, worker_id, settings.max_attempts, started_at=started_at):
            session.refresh(run)
            if run.status == "queued" and exhausted(run, settings.max_attempts):
                evals.give_up(session, run, WORKER_STOPPED, send)  # its worker kept dying: no more attempts
                return "failed"
            return "not-claimed"  # another worker holds it; the reconciler requeues it if that one died
    with LeaseKeeper(settings, EvalRun, eval_run_id, worker_id):
        try:
            return _execute(settings, run, load_base, batch_tasks, worker_id, send)
        except NoCapacity as exc:
            log.info("eval run %s waits for capacity: %s", eval_run_id, exc.message)
            return wait_for_capacity(settings, eval_run_id, worker_id, exc.message, send)


def wait_for_capacity(settings: Settings, eval_run_id: str, worker_id: str, reason: str, send: Dispatch | None) -> str:
    """The worker had no free LoRA session slot for the run's adapter: hand the run back to the
    queue, its attempt not counted, to be tried again after a growing wait. While it waits, its
    metrics say so (`capacity_waits`, `waiting_for_capacity`); it stays `queued`."""
    with session_scope(settings.database) as session:
        run = session.get(EvalRun, eval_run_id)
        assert run is not None
        waits = int(run.metrics.get("capacity_waits", 0))
        wait_s = capacity_wait_s(settings, waits)
        task_id = f"{eval_run_id}:{uuid.uuid4().hex[:12]}"
        if not hand_back(session, EvalRun, eval_run_id, worker_id, task_id=task_id, due_in_s=wait_s):
            return "lost-lease"
        session.refresh(run)
        if run.attempts == 0:
            run.started_at = None  # it has not started yet
        run.metrics = {
            **run.metrics,
            "capacity_waits": waits + 1,
            "waiting_for_capacity": f"{reason}; trying again in {wait_s:g} s (a wait is not a failed attempt)",
        }
        session.commit()
        if send is not None:  # else the reconciler sends it once it is due
            evals.send_run(run, send, countdown_s=wait_s)
    return "waiting-for-capacity"


def _execute(
    settings: Settings, run: EvalRun, load_base: LoadBase, batch_tasks: int, worker_id: str, send: Dispatch | None
) -> str:
    eval_run_id = run.id
    try:
        todo = _todo(settings, run)
        config = run.config
        ran, wall_s = 0, 0.0
        model = _run_model(settings, run, load_base)
        with ExitStack() as stack:
            generate = stack.enter_context(model)
            context = GradeContext(
                judge=_Judges(settings, run, load_base, stack) if config.get("judges") else None,
                reward=RemoteRewards.of(settings, run.organization_id),
                source=config.get("benchmark_name"),
            )
            act_in = acting_for(settings, run.organization_id)
            for start in range(0, len(todo), batch_tasks):
                if not _still_held(settings, run.id, worker_id):
                    return "cancelled"
                began = time.perf_counter()
                records = run_batch(
                    todo[start : start + batch_tasks],
                    generate,
                    max_steps=int(config["max_steps"]),
                    seed=int(config["seed"]),
                    context=context,
                    act_in=act_in,
                )
                wall_s += time.perf_counter() - began
                ran += len(_write(settings, run, records))
        metrics = _metrics(settings, run, ran, wall_s) | {"generator": model.generator}
        with session_scope(settings.database) as session:
            finished = _finish(session, run.id, worker_id, "succeeded", send, metrics=metrics)
        return "succeeded" if finished else "cancelled"
    except NoCapacity:
        raise  # the run waits (execute_eval_run)
    except MintError as exc:
        error = {"type": exc.type, "message": exc.message}
    except Exception as exc:
        log.exception("eval run %s failed", eval_run_id)
        error = {"type": "internal_error", "message": f"{type(exc).__name__}: {exc}"}
    with session_scope(settings.database) as session:
        _finish(session, eval_run_id, worker_id, "failed", send, error=error)
    return "failed"

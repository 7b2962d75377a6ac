"""Eval runs: a model (a base, `adapter@version` or a deployment) on a benchmark version; their
trajectories, task-by-task comparisons, and datasets mined from their failures.

`client.evals.create(...)` queues a run and returns at once; `run.wait()` (or
`client.evals.run(...)`, which does both) polls until it is finished, drawing a progress bar
of tasks done with the pass rate so far.
"""

from __future__ import annotations

import asyncio
import builtins
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from pydantic import PrivateAttr

from mint.schemas.common import Page
from mint.schemas.evals import (
    BenchmarkVersionPublic,
    ComparisonPublic,
    EvalRunCreate,
    EvalRunPublic,
    FromFailuresCreate,
    MinedDatasetPublic,
    MinedKind,
    TrajectoryPublic,
)
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_model, request_body
from mint.sdk.benchmarks import list_versions
from mint.sdk.pagination import AsyncPager, PageCall, SyncPager, bind_items
from mint.sdk.progress import Deadline, WaitProgress, apatiently, patiently, poll_pause

FINISHED = frozenset({"succeeded", "failed", "cancelled"})
TRAJECTORY_PAGE = 100  # the API's largest page: fewest requests while counting progress


class EvalRun(EvalRunPublic):
    """An eval run as the API shows it, bound to the client that fetched it."""

    _evals: Evals | None = PrivateAttr(default=None)

    def _resource(self) -> Evals:
        if self._evals is None:
            raise RuntimeError("this EvalRun was built by hand; use client.evals.wait(run_id) instead")
        return self._evals

    def wait(self, *, progress: bool = True, poll_interval_s: float = 1.0, timeout_s: float | None = None) -> EvalRun:
        """Poll until the run has finished and return it (see `Evals.wait`)."""
        return self._resource().wait(self.id, progress=progress, poll_interval_s=poll_interval_s, timeout_s=timeout_s)

    def refresh(self) -> EvalRun:
        return self._resource().get(self.id)

    def cancel(self) -> EvalRun:
        return self._resource().cancel(self.id)

    def trajectories(
        self, *, passed: bool | None = None, task_id: str | None = None, limit: int = 20
    ) -> SyncPager[TrajectoryPublic]:
        return self._resource().trajectories(self.id, passed=passed, task_id=task_id, limit=limit)


class AsyncEvalRun(EvalRunPublic):
    """An eval run bound to an `AsyncMint`; its methods are coroutines."""

    _evals: AsyncEvals | None = PrivateAttr(default=None)

    def _resource(self) -> AsyncEvals:
        if self._evals is None:
            raise RuntimeError("this AsyncEvalRun was built by hand; use client.evals.wait(run_id) instead")
        return self._evals

    async def wait(
        self, *, progress: bool = True, poll_interval_s: float = 1.0, timeout_s: float | None = None
    ) -> AsyncEvalRun:
        return await self._resource().wait(
            self.id, progress=progress, poll_interval_s=poll_interval_s, timeout_s=timeout_s
        )

    async def refresh(self) -> AsyncEvalRun:
        return await self._resource().get(self.id)

    async def cancel(self) -> AsyncEvalRun:
        return await self._resource().cancel(self.id)

    def trajectories(
        self, *, passed: bool | None = None, task_id: str | None = None, limit: int = 20
    ) -> AsyncPager[TrajectoryPublic]:
        return self._resource().trajectories(self.id, passed=passed, task_id=task_id, limit=limit)


# ---- the calls ---------------------------------------------------------------------------------


def create_run(fields: dict[str, Any], cls: type[EvalRunPublic]) -> Call[Any]:
    return Call("POST", "/v1/evals", parse_model(cls), json=request_body(EvalRunCreate, **fields))


def get_run(run_id: str, cls: type[EvalRunPublic]) -> Call[Any]:
    return Call("GET", f"/v1/evals/{run_id}", parse_model(cls))


def cancel_run(run_id: str, cls: type[EvalRunPublic]) -> Call[Any]:
    return Call("POST", f"/v1/evals/{run_id}/cancel", parse_model(cls))


def list_runs(benchmark_id: str | None, limit: int, cls: type[EvalRunPublic]) -> PageCall:
    # Page[cls] at run time, so that pydantic reads the items as `cls`; mypy cannot type a class in a variable.
    page: type[Page[Any]] = Page[cls]  # type: ignore[valid-type]
    params = {"benchmark_id": benchmark_id, "limit": limit}
    return lambda after: Call("GET", "/v1/evals", parse_model(page), {**params, "after": after})


def list_trajectories(run_id: str, passed: bool | None, limit: int, task_id: str | None = None) -> PageCall:
    return lambda after: Call(
        "GET",
        f"/v1/evals/{run_id}/trajectories",
        parse_model(Page[TrajectoryPublic]),
        {"passed": passed, "task_id": task_id, "after": after, "limit": limit},
    )


def compare_runs(a: str, b: str, resamples: int | None, seed: int | None) -> Call[ComparisonPublic]:
    params = {"a": a, "b": b, "resamples": resamples, "seed": seed}
    return Call("GET", "/v1/evals/compare", parse_model(ComparisonPublic), params)


def mine_failures(run_id: str, kind: MinedKind, filename: str | None) -> Call[MinedDatasetPublic]:
    body = request_body(FromFailuresCreate, eval_id=run_id, kind=kind, filename=filename)
    return Call("POST", "/v1/datasets/from-failures", parse_model(MinedDatasetPublic), json=body)


# ---- progress of a run -----------------------------------------------------------------------


@dataclass
class EvalTally:
    """What `wait()` has counted of a run so far: tasks graded and passed, read incrementally.

    Trajectories are listed in the order they were written, so each poll reads only those
    after `cursor`.
    """

    total: int | None = None
    done: int = 0
    passed: int = 0
    cursor: str | None = None

    def add(self, page: Page[TrajectoryPublic]) -> None:
        self.done += len(page.data)
        self.passed += sum(row.passed for row in page.data)
        if page.data:
            self.cursor = page.data[-1].id

    def show(self, run: EvalRunPublic, bar: WaitProgress) -> None:
        done, passed = self.done, self.passed
        if run.status == "succeeded" and "tasks" in run.metrics:
            done, passed = int(run.metrics["tasks"]), int(run.metrics.get("passed", passed))
        metric = f"pass {passed}/{done} ({passed / done:.0%})" if done else ""
        bar.update(status=run.status, completed=done, total=self.total, unit="tasks", metric=metric)


def task_total(run: EvalRunPublic, versions: list[BenchmarkVersionPublic]) -> int | None:
    """How many tasks the run grades: its version's tasks, or those of its split."""
    for version in versions:
        if version.id == run.benchmark_version_id:
            return version.splits.get(run.split, 0) if run.split else version.task_count
    return None


# ---- resources -------------------------------------------------------------------------------


class Evals:
    """`/v1/evals`: run models on benchmarks, read trajectories, compare runs, mine failures."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def _bind(self, run: EvalRun) -> EvalRun:
        run._evals = self
        return run

    def create(
        self,
        benchmark_id: str,
        model: str,
        *,
        version: int | None = None,
        split: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        max_steps: int | None = None,
    ) -> EvalRun:
        """Queue a run of `model` on a benchmark version (the newest if not given); returns at once."""
        fields = {
            "benchmark_id": benchmark_id,
            "model": model,
            "version": version,
            "split": split,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": seed,
            "max_steps": max_steps,
        }
        return self._bind(self._http.send(create_run(fields, EvalRun)))

    def run(
        self,
        benchmark_id: str,
        model: str,
        *,
        progress: bool = True,
        poll_interval_s: float = 1.0,
        timeout_s: float | None = None,
        **options: Any,
    ) -> EvalRun:
        """Create a run (`options` as for `create`) and wait until it has finished."""
        created = self.create(benchmark_id, model, **options)
        return self.wait(created.id, progress=progress, poll_interval_s=poll_interval_s, timeout_s=timeout_s)

    def get(self, run_id: str) -> EvalRun:
        return self._bind(self._http.send(get_run(run_id, EvalRun)))

    def list(self, *, benchmark_id: str | None = None, limit: int = 20) -> SyncPager[EvalRun]:
        """Every run, newest first; `benchmark_id` keeps one benchmark's."""
        fetch = list_runs(benchmark_id, limit, EvalRun)
        return SyncPager(self._http, lambda after: bind_items(fetch(after), self._bind))

    def cancel(self, run_id: str) -> EvalRun:
        """Cancel a queued or running run (a running one stops after its current batch)."""
        return self._bind(self._http.send(cancel_run(run_id, EvalRun)))

    def trajectories(
        self, run_id: str, *, passed: bool | None = None, task_id: str | None = None, limit: int = 20
    ) -> SyncPager[TrajectoryPublic]:
        """Every task of the run in the order written; `passed=False` keeps the failures, `task_id`
        one task's."""
        return SyncPager(self._http, list_trajectories(run_id, passed, limit, task_id))

    def compare(self, a: str, b: str, *, resamples: int | None = None, seed: int | None = None) -> ComparisonPublic:
        """Run `b` against run `a`, task by task, with a paired bootstrap interval of the accuracy delta."""
        return self._http.send(compare_runs(a, b, resamples, seed))

    def from_failures(
        self, run_id: str, *, kind: MinedKind = "chat", filename: str | None = None
    ) -> MinedDatasetPublic:
        """Mine the run's failed tasks into a dataset: SFT rows, DPO pairs or RL prompts."""
        return self._http.send(mine_failures(run_id, kind, filename))

    def wait(
        self, run_id: str, *, progress: bool = True, poll_interval_s: float = 1.0, timeout_s: float | None = None
    ) -> EvalRun:
        """Poll until the run has succeeded, failed or been cancelled, and return it.

        With `progress`, a bar on stderr shows tasks graded out of the total, the pass rate
        so far and the time left. `timeout_s` (none by default) raises WaitTimeoutError.
        """
        deadline, what = Deadline(timeout_s), f"eval run {run_id}"
        tally = EvalTally()
        with WaitProgress(run_id, enabled=progress) as bar:
            while True:
                run = patiently(lambda: self.get(run_id), deadline, what)
                if progress:
                    if tally.total is None:
                        versions = patiently(partial(self._versions, run.benchmark_id), deadline, what)
                        tally.total = task_total(run, versions)
                    patiently(lambda: self._count(run_id, tally), deadline, what)  # resumes at tally.cursor
                    tally.show(run, bar)
                if run.status in FINISHED:
                    return run
                deadline.check(what)
                time.sleep(poll_pause(poll_interval_s))

    def _versions(self, benchmark_id: str) -> builtins.list[BenchmarkVersionPublic]:
        return [*SyncPager[BenchmarkVersionPublic](self._http, list_versions(benchmark_id, 100))]

    def _count(self, run_id: str, tally: EvalTally) -> None:
        fetch = list_trajectories(run_id, None, TRAJECTORY_PAGE)
        while True:
            page: Page[TrajectoryPublic] = self._http.send(fetch(tally.cursor))
            tally.add(page)
            if not page.has_more:
                return


class AsyncEvals:
    """`/v1/evals`, for asyncio: the twin of `Evals`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    def _bind(self, run: AsyncEvalRun) -> AsyncEvalRun:
        run._evals = self
        return run

    async def create(
        self,
        benchmark_id: str,
        model: str,
        *,
        version: int | None = None,
        split: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        max_steps: int | None = None,
    ) -> AsyncEvalRun:
        fields = {
            "benchmark_id": benchmark_id,
            "model": model,
            "version": version,
            "split": split,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": seed,
            "max_steps": max_steps,
        }
        return self._bind(await self._http.send(create_run(fields, AsyncEvalRun)))

    async def run(
        self,
        benchmark_id: str,
        model: str,
        *,
        progress: bool = True,
        poll_interval_s: float = 1.0,
        timeout_s: float | None = None,
        **options: Any,
    ) -> AsyncEvalRun:
        created = await self.create(benchmark_id, model, **options)
        return await self.wait(created.id, progress=progress, poll_interval_s=poll_interval_s, timeout_s=timeout_s)

    async def get(self, run_id: str) -> AsyncEvalRun:
        return self._bind(await self._http.send(get_run(run_id, AsyncEvalRun)))

    def list(self, *, benchmark_id: str | None = None, limit: int = 20) -> AsyncPager[AsyncEvalRun]:
        fetch = list_runs(benchmark_id, limit, AsyncEvalRun)
        return AsyncPager(self._http, lambda after: bind_items(fetch(after), self._bind))

    async def cancel(self, run_id: str) -> AsyncEvalRun:
        return self._bind(await self._http.send(cancel_run(run_id, AsyncEvalRun)))

    def trajectories(
        self, run_id: str, *, passed: bool | None = None, task_id: str | None = None, limit: int = 20
    ) -> AsyncPager[TrajectoryPublic]:
        return AsyncPager(self._http, list_trajectories(run_id, passed, limit, task_id))

    async def compare(
        self, a: str, b: str, *, resamples: int | None = None, seed: int | None = None
    ) -> ComparisonPublic:
        return await self._http.send(compare_runs(a, b, resamples, seed))

    async def from_failures(
        self, run_id: str, *, kind: MinedKind = "chat", filename: str | None = None
    ) -> MinedDatasetPublic:
        return await self._http.send(mine_failures(run_id, kind, filename))

    async def wait(
        self, run_id: str, *, progress: bool = True, poll_interval_s: float = 1.0, timeout_s: float | None = None
    ) -> AsyncEvalRun:
        deadline, what = Deadline(timeout_s), f"eval run {run_id}"
        tally = EvalTally()

        async def count() -> None:
            """Read the trajectories written since the last poll (resuming at `tally.cursor`)."""
            fetch = list_trajectories(run_id, None, TRAJECTORY_PAGE)
            while True:
                page: Page[TrajectoryPublic] = await self._http.send(fetch(tally.cursor))
                tally.add(page)
                if not page.has_more:
                    return

        with WaitProgress(run_id, enabled=progress) as bar:
            while True:
                run = await apatiently(lambda: self.get(run_id), deadline, what)
                if progress:
                    if tally.total is None:
                        pager = AsyncPager[BenchmarkVersionPublic](self._http, list_versions(run.benchmark_id, 100))
                        tally.total = task_total(run, await apatiently(pager.to_list, deadline, what))
                    await apatiently(count, deadline, what)
                    tally.show(run, bar)
                if run.status in FINISHED:
                    return run
                deadline.check(what)
                await asyncio.sleep(poll_pause(poll_interval_s))

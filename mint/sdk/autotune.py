"""Auto mode: hand Mint a base, a benchmark, a target and a budget, and get the best version back.

    run = client.autotune.create(benchmark_id, "smollm2-135m-instruct",
                                 target={"pass_rate": 0.9}, budget={"usd": 5})
    run = client.autotune.wait(run.id)      # polls until it has finished
    print(run.status, run.best, run.result)

The run's trials are ordinary fine-tuning jobs and eval runs (`client.jobs`, `client.evals`);
`run.decisions` says what it chose and why.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from mint.schemas.autotune import AutotuneCreate, AutotunePublic
from mint.schemas.common import Page
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_model, request_body
from mint.sdk.pagination import AsyncPager, PageCall, SyncPager
from mint.sdk.progress import Deadline, apatiently, patiently, poll_pause

ACTIVE = frozenset({"queued", "running"})


def _create(benchmark_id: str, model: str, fields: dict[str, Any]) -> Call[AutotunePublic]:
    body = request_body(AutotuneCreate, benchmark_id=benchmark_id, model=model, **fields)
    return Call("POST", "/v1/autotune", parse_model(AutotunePublic), json=body)


def _get(run_id: str) -> Call[AutotunePublic]:
    return Call("GET", f"/v1/autotune/{run_id}", parse_model(AutotunePublic))


def _cancel(run_id: str) -> Call[AutotunePublic]:
    return Call("POST", f"/v1/autotune/{run_id}/cancel", parse_model(AutotunePublic))


def _list(limit: int) -> PageCall:
    return lambda after: Call(
        "GET", "/v1/autotune", parse_model(Page[AutotunePublic]), {"after": after, "limit": limit}
    )


class Autotune:
    """`/v1/autotune`: start, watch and cancel auto runs."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def create(self, benchmark_id: str, model: str, **fields: Any) -> AutotunePublic:
        """Start a run; `fields` as `AutotuneCreate` takes them (target, budget, constraints, splits, ...)."""
        return self._http.send(_create(benchmark_id, model, fields))

    def get(self, run_id: str) -> AutotunePublic:
        return self._http.send(_get(run_id))

    def list(self, *, limit: int = 20) -> SyncPager[AutotunePublic]:
        return SyncPager(self._http, _list(limit))

    def cancel(self, run_id: str) -> AutotunePublic:
        """Stop a run: its running trial's job is cancelled."""
        return self._http.send(_cancel(run_id))

    def wait(self, run_id: str, *, poll_interval_s: float = 2.0, timeout_s: float | None = None) -> AutotunePublic:
        """Poll until the run has finished (succeeded, stopped, failed or cancelled) and return it."""
        deadline, what = Deadline(timeout_s), f"auto run {run_id}"
        while (run := patiently(lambda: self.get(run_id), deadline, what)).status in ACTIVE:
            deadline.check(what)
            time.sleep(poll_pause(poll_interval_s))
        return run


class AsyncAutotune:
    """`/v1/autotune`, for asyncio."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def create(self, benchmark_id: str, model: str, **fields: Any) -> AutotunePublic:
        return await self._http.send(_create(benchmark_id, model, fields))

    async def get(self, run_id: str) -> AutotunePublic:
        return await self._http.send(_get(run_id))

    def list(self, *, limit: int = 20) -> AsyncPager[AutotunePublic]:
        return AsyncPager(self._http, _list(limit))

    async def cancel(self, run_id: str) -> AutotunePublic:
        return await self._http.send(_cancel(run_id))

    async def wait(
        self, run_id: str, *, poll_interval_s: float = 2.0, timeout_s: float | None = None
    ) -> AutotunePublic:
        deadline, what = Deadline(timeout_s), f"auto run {run_id}"
        while (run := await apatiently(lambda: self.get(run_id), deadline, what)).status in ACTIVE:
            deadline.check(what)
            await asyncio.sleep(poll_pause(poll_interval_s))
        return run

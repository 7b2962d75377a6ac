"""Fine-tuning jobs (`client.fine_tuning.jobs`, also `client.jobs`): create, read, list, cancel,
events, checkpoints, and `wait()` with a progress bar of steps, the latest loss and the ETA.

A job trains a LoRA adapter on a base by SFT (`supervised`), DPO (`dpo`), RL
(`reinforcement`, with a grader) or online RL (`online_rl`: from a deployment's live, rewarded
episodes, `create_online`); when it succeeds, `fine_tuned_model` names the new adapter
version (`suffix@N`), ready to evaluate or deploy. `from_adapter="name@3"` continues training
an existing version; `stages=[...]` chains methods in one job (SFT, then RL), each stage
registering its own version. Creates carry an `Idempotency-Key`, so a
create retried after a lost answer returns the first job instead of starting a second one.
"""

from __future__ import annotations

import asyncio
import builtins
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from pydantic import PrivateAttr

from mint.schemas.common import Page
from mint.schemas.fine_tuning import (
    EventPage,
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobCreate,
    FineTuningJobEvent,
    JobEstimate,
    LoraSpec,
    MethodType,
    OnlineRlHyperparameters,
    StageCreate,
    TrainingType,
)
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_model, request_body
from mint.sdk.errors import BadRequestError
from mint.sdk.pagination import AsyncPager, PageCall, SyncPager, bind_items
from mint.sdk.progress import Deadline, WaitProgress, apatiently, patiently, poll_pause

# How an online RL job's versions reach its deployment (`OnlineRlMethod.serve`).
ServeMode = Literal["immediate", "register"]
FINISHED = frozenset({"succeeded", "failed", "cancelled"})
# Events to read for the latest loss: metrics are written once per step, messages rarely.
RECENT_EVENTS = 20


class Job(FineTuningJob):
    """A fine-tuning job as the API shows it, bound to the client that fetched it."""

    _jobs: Jobs | None = PrivateAttr(default=None)

    def _resource(self) -> Jobs:
        if self._jobs is None:
            raise RuntimeError("this Job was built by hand; use client.jobs.wait(job_id) instead")
        return self._jobs

    def wait(self, *, progress: bool = True, poll_interval_s: float = 1.0, timeout_s: float | None = None) -> Job:
        """Poll until the job has finished and return it (see `Jobs.wait`)."""
        return self._resource().wait(self.id, progress=progress, poll_interval_s=poll_interval_s, timeout_s=timeout_s)

    def refresh(self) -> Job:
        return self._resource().get(self.id)

    def cancel(self) -> Job:
        return self._resource().cancel(self.id)

    def events(self, *, limit: int = 20) -> SyncPager[FineTuningJobEvent]:
        return self._resource().events(self.id, limit=limit)


class AsyncJob(FineTuningJob):
    """A fine-tuning job bound to an `AsyncMint`; its methods are coroutines."""

    _jobs: AsyncJobs | None = PrivateAttr(default=None)

    def _resource(self) -> AsyncJobs:
        if self._jobs is None:
            raise RuntimeError("this AsyncJob was built by hand; use client.jobs.wait(job_id) instead")
        return self._jobs

    async def wait(
        self, *, progress: bool = True, poll_interval_s: float = 1.0, timeout_s: float | None = None
    ) -> AsyncJob:
        return await self._resource().wait(
            self.id, progress=progress, poll_interval_s=poll_interval_s, timeout_s=timeout_s
        )

    async def refresh(self) -> AsyncJob:
        return await self._resource().get(self.id)

    async def cancel(self) -> AsyncJob:
        return await self._resource().cancel(self.id)

    def events(self, *, limit: int = 20) -> AsyncPager[FineTuningJobEvent]:
        return self._resource().events(self.id, limit=limit)


# ---- the calls ---------------------------------------------------------------------------------


def method_body(
    method: MethodType | dict[str, Any] | None,
    hyperparameters: dict[str, Any] | None,
    grader: str | dict[str, Any] | None,
) -> dict[str, Any] | None:
    """OpenAI's `method` object from a method name, its hyperparameters and (for RL) its grader."""
    if isinstance(method, dict):
        return method
    if method is None and hyperparameters is None and grader is None:
        return None
    kind = method or ("reinforcement" if grader is not None else "supervised")
    inner: dict[str, Any] = {"hyperparameters": hyperparameters or {}}
    if grader is not None:
        if kind != "reinforcement":
            raise BadRequestError(f"a grader is for method 'reinforcement', not {kind!r}", param="grader")
        inner["grader"] = {"type": grader} if isinstance(grader, str) else grader
    return {"type": kind, kind: inner}


def online_rl_method(
    deployment: str,
    *,
    serve: ServeMode | None = None,
    hyperparameters: OnlineRlHyperparameters | dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `method` of an online RL job: `{"type": "online_rl", "online_rl": {"deployment",
    "serve"?, "hyperparameters"?}}`, for `create(..., method=...)` or a stage."""
    inner: dict[str, Any] = {"deployment": deployment}
    if serve is not None:
        inner["serve"] = serve
    if hyperparameters is not None:
        inner["hyperparameters"] = (
            hyperparameters.model_dump(mode="json", exclude_unset=True)
            if isinstance(hyperparameters, OnlineRlHyperparameters)
            else hyperparameters
        )
    return {"type": "online_rl", "online_rl": inner}


def create_job(fields: dict[str, Any], idempotency_key: str | None, cls: type[FineTuningJob]) -> Call[Any]:
    body = request_body(FineTuningJobCreate, **fields)
    headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
    return Call("POST", "/v1/fine_tuning/jobs", parse_model(cls), json=body, headers=headers)


def estimate_job(fields: dict[str, Any]) -> Call[JobEstimate]:
    body = request_body(FineTuningJobCreate, **fields)
    return Call("POST", "/v1/fine_tuning/jobs/estimate", parse_model(JobEstimate), json=body)


def get_job(job_id: str, cls: type[FineTuningJob]) -> Call[Any]:
    return Call("GET", f"/v1/fine_tuning/jobs/{job_id}", parse_model(cls))


def cancel_job(job_id: str, cls: type[FineTuningJob]) -> Call[Any]:
    return Call("POST", f"/v1/fine_tuning/jobs/{job_id}/cancel", parse_model(cls))


def list_jobs(limit: int, cls: type[FineTuningJob]) -> PageCall:
    # Page[cls] at run time, so that pydantic reads the items as `cls`; mypy cannot type a class in a variable.
    page: type[Page[Any]] = Page[cls]  # type: ignore[valid-type]
    return lambda after: Call("GET", "/v1/fine_tuning/jobs", parse_model(page), {"after": after, "limit": limit})


def _event_page(response: Any) -> Page[FineTuningJobEvent]:
    # Events have no first_id/last_id on the wire (OpenAI's shape); the pager reads the last id.
    page = EventPage.model_validate(response.json())
    return Page[FineTuningJobEvent](data=page.data, has_more=page.has_more)


def list_events(job_id: str, limit: int) -> PageCall:
    return lambda after: Call(
        "GET", f"/v1/fine_tuning/jobs/{job_id}/events", _event_page, {"after": after, "limit": limit}
    )


def list_checkpoints(job_id: str) -> Call[Page[FineTuningJobCheckpoint]]:
    return Call("GET", f"/v1/fine_tuning/jobs/{job_id}/checkpoints", parse_model(Page[FineTuningJobCheckpoint]))


def create_fields(
    model: str,
    training_file: str | None,
    *,
    method: MethodType | dict[str, Any] | None,
    hyperparameters: dict[str, Any] | None,
    grader: str | dict[str, Any] | None,
    **fields: Any,
) -> dict[str, Any]:
    return {
        "model": model,
        "training_file": training_file,
        "method": method_body(method, hyperparameters, grader),
        **fields,
    }


# ---- progress of a job -----------------------------------------------------------------------


def latest_metric(events: builtins.list[FineTuningJobEvent]) -> str:
    """'loss 0.4213' (or the reward of an RL step) from the newest metrics event, newest first."""
    for event in events:
        if event.type == "metrics":
            for name in ("loss", "reward", "mean_reward"):
                if isinstance(event.data.get(name), int | float):
                    return f"{name} {event.data[name]:.4g}"
    return ""


@dataclass
class JobTally:
    """What `wait()` shows of a job: the step whose loss it read last, and that loss."""

    step: int = -1
    metric: str = ""

    def stale(self, job: FineTuningJob) -> bool:
        return job.completed_steps != self.step

    def show(self, job: FineTuningJob, bar: WaitProgress) -> None:
        bar.update(
            status=job.status, completed=job.completed_steps, total=job.total_steps, unit="steps", metric=self.metric
        )


def new_events(pages: Iterator[Page[FineTuningJobEvent]], seen: int) -> builtins.list[FineTuningJobEvent]:
    """The events newer than event id `seen`, oldest first, from newest-first pages."""
    fresh: builtins.list[FineTuningJobEvent] = []
    for page in pages:
        for event in page.data:
            if int(event.id) <= seen:
                return fresh[::-1]
            fresh.append(event)
    return fresh[::-1]


# ---- resources -------------------------------------------------------------------------------


class Jobs:
    """`/v1/fine_tuning/jobs`: train LoRA adapters by SFT, DPO or RL on a base's workers."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def _bind(self, job: Job) -> Job:
        job._jobs = self
        return job

    def create(
        self,
        model: str,
        training_file: str | None = None,
        *,
        method: MethodType | dict[str, Any] | None = None,
        hyperparameters: dict[str, Any] | None = None,
        grader: str | dict[str, Any] | None = None,
        steps: int | None = None,
        suffix: str | None = None,
        seed: int | None = None,
        learning_rate: float | None = None,
        lora: LoraSpec | dict[str, Any] | None = None,
        training_type: TrainingType | None = None,
        checkpoint_interval: int | None = None,
        validation_file: str | None = None,
        metadata: dict[str, str] | None = None,
        from_adapter: str | None = None,
        stages: builtins.list[StageCreate | dict[str, Any]] | None = None,
        budget_usd: float | None = None,
        idempotency_key: str | None = None,
    ) -> Job:
        """Start a job on base `model` with dataset `training_file`; returns at once (status `queued`).

        `method` is supervised (default) | dpo | reinforcement, with `hyperparameters`
        (batch_size, n_epochs, learning_rate_multiplier, beta, group_size, ...) and, for
        reinforcement, a `grader` by name or as `{"type", "config"}`; or a whole method object,
        such as `online_rl_method(deployment)`'s (an online RL job: see `create_online`). `steps` fixes the number
        of optimizer steps; `suffix` names the adapter (each job adds a version to it).

        `from_adapter` (`"name@3"`, or `"name"` for its newest version) starts from that
        adapter version instead of a fresh adapter (its rank, alpha and targets). `stages`, instead
        of `method`, chains up to four stages, each `{"method": {...}, "training_file"?,
        "steps"?, "learning_rate"?, ...}`; unset fields take the job's, and each stage starts
        from the version the previous one registered:

            client.jobs.create("tiny-glm-moe", suffix="agent", stages=[
                {"method": {"type": "supervised"}, "training_file": mined.id, "steps": 20},
                {"method": {"type": "reinforcement", "reinforcement": {"grader": {"type": "exact"}}},
                 "training_file": prompts.id, "steps": 40},
            ])

        `training_type="full"` trains every weight of a private copy of the base instead of a
        LoRA adapter (supervised only; billed by device time at the GPU-hour price); its version is
        the whole model, evaluated and downloaded like any version but not deployed.

        `budget_usd` caps what the job may cost: a create whose estimate is more (or passes a
        spend limit of the organization) raises `SpendLimitExceededError`; a running job stops
        with a checkpoint before a step would take it past (`error.code` `budget_exhausted`).
        """
        fields = create_fields(
            model,
            training_file,
            method=method,
            hyperparameters=hyperparameters,
            grader=grader,
            steps=steps,
            suffix=suffix,
            seed=seed,
            learning_rate=learning_rate,
            lora=lora,
            training_type=training_type,
            checkpoint_interval=checkpoint_interval,
            validation_file=validation_file,
            metadata=metadata,
            from_adapter=from_adapter,
            stages=stages,
            budget_usd=budget_usd,
        )
        return self._bind(self._http.send(create_job(fields, idempotency_key, Job)))

    def create_online(
        self,
        model: str,
        deployment: str,
        *,
        steps: int,
        serve: ServeMode | None = None,
        hyperparameters: OnlineRlHyperparameters | dict[str, Any] | None = None,
        suffix: str | None = None,
        seed: int | None = None,
        learning_rate: float | None = None,
        checkpoint_interval: int | None = None,
        metadata: dict[str, str] | None = None,
        budget_usd: float | None = None,
        idempotency_key: str | None = None,
    ) -> Job:
        """Start an online RL job on base `model`: it trains the adapter version `deployment`
        serves from the episodes its clients mark and reward, for `steps` optimizer steps of
        `batch_size` rewarded episodes each, and publishes a version every `publish_every` steps.
        The deployment must record tokens (`client.deployments.set_capture(name, rate=1.0,
        tokens=True)`).

        `serve="immediate"` (the default) makes the deployment serve each published version at
        once; `"register"` only registers them, for a promotion through the deployment's gate.
        `hyperparameters`: batch_size, publish_every, baseline (`group` | `task_mean`),
        reward_timeout_s, max_wait_s, max_steps_off_policy, loss_fn, loss_fn_config, kl_beta,
        learning_rate_multiplier, max_steps_without_signal (`OnlineRlHyperparameters`). Its
        events say `Step n: published NAME@k, now served` and carry each step's metrics
        (episodes, episodes_stale, episodes_late, episodes_unrewarded, reward, groups_with_signal).
        """
        method = online_rl_method(deployment, serve=serve, hyperparameters=hyperparameters)
        return self.create(
            model,
            method=method,
            steps=steps,
            suffix=suffix,
            seed=seed,
            learning_rate=learning_rate,
            checkpoint_interval=checkpoint_interval,
            metadata=metadata,
            budget_usd=budget_usd,
            idempotency_key=idempotency_key,
        )

    def estimate(
        self,
        model: str,
        training_file: str | None = None,
        *,
        method: MethodType | dict[str, Any] | None = None,
        hyperparameters: dict[str, Any] | None = None,
        grader: str | dict[str, Any] | None = None,
        **fields: Any,
    ) -> JobEstimate:
        """What `create` with the same arguments would use and cost (tokens, steps, seconds,
        USD) and the most it may cost under its budget and the spend limits; starts nothing."""
        body = create_fields(model, training_file, method=method, hyperparameters=hyperparameters, grader=grader)
        return self._http.send(estimate_job(body | fields))

    def get(self, job_id: str) -> Job:
        return self._bind(self._http.send(get_job(job_id, Job)))

    def list(self, *, limit: int = 20) -> SyncPager[Job]:
        """Every job of the organization, newest first."""
        fetch = list_jobs(limit, Job)
        return SyncPager(self._http, lambda after: bind_items(fetch(after), self._bind))

    def cancel(self, job_id: str) -> Job:
        """Cancel a queued job at once, or a running one after its current optimizer step."""
        return self._bind(self._http.send(cancel_job(job_id, Job)))

    def events(self, job_id: str, *, limit: int = 20) -> SyncPager[FineTuningJobEvent]:
        """Messages and metrics (loss, learning rate, tokens/s, reward), newest first."""
        return SyncPager(self._http, list_events(job_id, limit))

    def checkpoints(self, job_id: str) -> builtins.list[FineTuningJobCheckpoint]:
        """Resumable checkpoints of the job, newest first."""
        return self._http.send(list_checkpoints(job_id)).data

    def _events_after(self, job_id: str, seen: int) -> builtins.list[FineTuningJobEvent]:
        """The job's events after event `seen`, oldest first."""
        return new_events(self.events(job_id, limit=100).pages(), seen)

    def follow(self, job_id: str, *, poll_interval_s: float = 1.0) -> Iterator[FineTuningJobEvent]:
        """The job's events oldest first, then new ones as they are written, until it has finished."""
        seen = 0
        endless, what = Deadline(None), f"job {job_id}"
        while True:
            job = patiently(lambda: self.get(job_id), endless, what)
            # Read after the status, so that every event written before a finish is included.
            fresh = patiently(partial(self._events_after, job_id, seen), endless, what)
            yield from fresh
            if fresh:
                seen = int(fresh[-1].id)
            if job.status in FINISHED:
                return
            time.sleep(poll_pause(poll_interval_s))

    def wait(
        self, job_id: str, *, progress: bool = True, poll_interval_s: float = 1.0, timeout_s: float | None = None
    ) -> Job:
        """Poll until the job has succeeded, failed or been cancelled, and return it.

        With `progress`, a bar on stderr shows the status, steps done out of the total, the
        latest loss and the time left. `timeout_s` (none by default) raises WaitTimeoutError.
        Polls come at most every `poll_interval_s` (0.5 s at the least); a poll refused with a
        429 is waited out as the server asks.
        """
        deadline, what = Deadline(timeout_s), f"job {job_id}"
        tally = JobTally()
        with WaitProgress(job_id, enabled=progress) as bar:
            while True:
                job = patiently(lambda: self.get(job_id), deadline, what)
                if progress:
                    if tally.stale(job):
                        page = patiently(lambda: self.events(job_id, limit=RECENT_EVENTS).first_page(), deadline, what)
                        tally.step, tally.metric = job.completed_steps, latest_metric(page.data) or tally.metric
                    tally.show(job, bar)
                if job.status in FINISHED:
                    return job
                deadline.check(what)
                time.sleep(poll_pause(poll_interval_s))


class FineTuning:
    """`client.fine_tuning`: OpenAI's namespace, holding `jobs`."""

    def __init__(self, http: SyncHTTP) -> None:
        self.jobs = Jobs(http)


class AsyncJobs:
    """`/v1/fine_tuning/jobs`, for asyncio: the twin of `Jobs`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    def _bind(self, job: AsyncJob) -> AsyncJob:
        job._jobs = self
        return job

    async def create(
        self,
        model: str,
        training_file: str | None = None,
        *,
        method: MethodType | dict[str, Any] | None = None,
        hyperparameters: dict[str, Any] | None = None,
        grader: str | dict[str, Any] | None = None,
        steps: int | None = None,
        suffix: str | None = None,
        seed: int | None = None,
        learning_rate: float | None = None,
        lora: LoraSpec | dict[str, Any] | None = None,
        training_type: TrainingType | None = None,
        checkpoint_interval: int | None = None,
        validation_file: str | None = None,
        metadata: dict[str, str] | None = None,
        from_adapter: str | None = None,
        stages: builtins.list[StageCreate | dict[str, Any]] | None = None,
        budget_usd: float | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncJob:
        fields = create_fields(
            model,
            training_file,
            method=method,
            hyperparameters=hyperparameters,
            grader=grader,
            steps=steps,
            suffix=suffix,
            seed=seed,
            learning_rate=learning_rate,
            lora=lora,
            training_type=training_type,
            checkpoint_interval=checkpoint_interval,
            validation_file=validation_file,
            metadata=metadata,
            from_adapter=from_adapter,
            stages=stages,
            budget_usd=budget_usd,
        )
        return self._bind(await self._http.send(create_job(fields, idempotency_key, AsyncJob)))

    async def create_online(
        self,
        model: str,
        deployment: str,
        *,
        steps: int,
        serve: ServeMode | None = None,
        hyperparameters: OnlineRlHyperparameters | dict[str, Any] | None = None,
        suffix: str | None = None,
        seed: int | None = None,
        learning_rate: float | None = None,
        checkpoint_interval: int | None = None,
        metadata: dict[str, str] | None = None,
        budget_usd: float | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncJob:
        method = online_rl_method(deployment, serve=serve, hyperparameters=hyperparameters)
        return await self.create(
            model,
            method=method,
            steps=steps,
            suffix=suffix,
            seed=seed,
            learning_rate=learning_rate,
            checkpoint_interval=checkpoint_interval,
            metadata=metadata,
            budget_usd=budget_usd,
            idempotency_key=idempotency_key,
        )

    async def estimate(
        self,
        model: str,
        training_file: str | None = None,
        *,
        method: MethodType | dict[str, Any] | None = None,
        hyperparameters: dict[str, Any] | None = None,
        grader: str | dict[str, Any] | None = None,
        **fields: Any,
    ) -> JobEstimate:
        body = create_fields(model, training_file, method=method, hyperparameters=hyperparameters, grader=grader)
        return await self._http.send(estimate_job(body | fields))

    async def get(self, job_id: str) -> AsyncJob:
        return self._bind(await self._http.send(get_job(job_id, AsyncJob)))

    def list(self, *, limit: int = 20) -> AsyncPager[AsyncJob]:
        fetch = list_jobs(limit, AsyncJob)
        return AsyncPager(self._http, lambda after: bind_items(fetch(after), self._bind))

    async def cancel(self, job_id: str) -> AsyncJob:
        return self._bind(await self._http.send(cancel_job(job_id, AsyncJob)))

    def events(self, job_id: str, *, limit: int = 20) -> AsyncPager[FineTuningJobEvent]:
        return AsyncPager(self._http, list_events(job_id, limit))

    async def checkpoints(self, job_id: str) -> builtins.list[FineTuningJobCheckpoint]:
        return (await self._http.send(list_checkpoints(job_id))).data

    async def follow(self, job_id: str, *, poll_interval_s: float = 1.0) -> AsyncIterator[FineTuningJobEvent]:
        seen = 0
        endless, what = Deadline(None), f"job {job_id}"

        async def newer() -> builtins.list[FineTuningJobEvent]:
            found: builtins.list[FineTuningJobEvent] = []
            async for page in self.events(job_id, limit=100).pages():
                older = [event for event in page.data if int(event.id) <= seen]
                found += [event for event in page.data if int(event.id) > seen]
                if older:
                    break
            return found

        while True:
            job = await apatiently(lambda: self.get(job_id), endless, what)
            fresh = await apatiently(newer, endless, what)
            fresh.reverse()
            for event in fresh:
                yield event
            if fresh:
                seen = int(fresh[-1].id)
            if job.status in FINISHED:
                return
            await asyncio.sleep(poll_pause(poll_interval_s))

    async def wait(
        self, job_id: str, *, progress: bool = True, poll_interval_s: float = 1.0, timeout_s: float | None = None
    ) -> AsyncJob:
        deadline, what = Deadline(timeout_s), f"job {job_id}"
        tally = JobTally()
        with WaitProgress(job_id, enabled=progress) as bar:
            while True:
                job = await apatiently(lambda: self.get(job_id), deadline, what)
                if progress:
                    if tally.stale(job):
                        page = await apatiently(
                            lambda: self.events(job_id, limit=RECENT_EVENTS).first_page(), deadline, what
                        )
                        tally.step, tally.metric = job.completed_steps, latest_metric(page.data) or tally.metric
                    tally.show(job, bar)
                if job.status in FINISHED:
                    return job
                deadline.check(what)
                await asyncio.sleep(poll_pause(poll_interval_s))


class AsyncFineTuning:
    """`client.fine_tuning` of `AsyncMint`, holding `jobs`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self.jobs = AsyncJobs(http)

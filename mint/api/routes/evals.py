"""Eval runs: a model on a benchmark version, run by the workers that hold its base; their
trajectories, task-by-task comparisons, and datasets mined from their failures."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from mint.api.deps import CurrentPrincipal, DispatchDep, QuotasDep, SessionDep, SettingsDep
from mint.api.pagination import After, Limit, id_path, page_from, page_of
from mint.evals.compare import DEFAULT_RESAMPLES, DEFAULT_SEED
from mint.evals.mining import MiningResult
from mint.schemas.common import ID_PATTERN, MAX_SEED, TEXT_PATTERN, Page
from mint.schemas.datasets import DatasetPublic
from mint.schemas.evals import (
    ComparisonPublic,
    EvalRunCreate,
    EvalRunPublic,
    FromFailuresCreate,
    MinedDatasetPublic,
    SkippedTask,
    TrajectoryPublic,
)
from mint.services import catalog
from mint.services.evals import runs as evals
from mint.storage.objects import object_store_for
from mint.storage.tables import Dataset, EvalRun

router = APIRouter(tags=["evals"])

EvalId = Annotated[str, id_path("The eval run's id, e.g. `eval_...`.")]
RunQuery = Annotated[str, Query(max_length=100, pattern=ID_PATTERN)]


def _view(session: SessionDep, run: EvalRun) -> EvalRunPublic:
    return EvalRunPublic.model_validate(evals.run_views(session, [run])[0])


@router.post("/v1/evals", response_model=EvalRunPublic, status_code=201)
def create_eval_run(
    body: EvalRunCreate,
    session: SessionDep,
    dispatch: DispatchDep,
    quotas: QuotasDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
) -> EvalRunPublic:
    """Evaluate a model (a base or `adapter@version`) on a benchmark version (the newest if not given).

    The run is queued for the workers that hold the model's base; its first use locks the version.
    An organization at its eval runs quota gets a 429. The models its judge graders name must be
    models of this organization.
    """
    run = evals.create_eval_run(
        session, principal, body, send=dispatch, quotas=quotas, store=object_store_for(settings)
    )
    return _view(session, run)


@router.get("/v1/evals", response_model=Page[EvalRunPublic])
def list_eval_runs(
    session: SessionDep,
    principal: CurrentPrincipal,
    benchmark_id: Annotated[str | None, Query(max_length=100, pattern=ID_PATTERN)] = None,
    after: After = None,
    limit: Limit = 20,
) -> Page[EvalRunPublic]:
    """Eval runs of this organization, newest first; `benchmark_id` keeps one benchmark's."""
    result = evals.list_eval_runs(
        session, principal.organization_id, benchmark_id=benchmark_id, after=after, limit=limit
    )
    data = [EvalRunPublic.model_validate(view) for view in evals.run_views(session, result.rows)]
    return page_from(data, result.has_more, EvalRunPublic)


# Declared before /v1/evals/{eval_id}, which would otherwise take "compare" for an id.
@router.get("/v1/evals/compare", response_model=ComparisonPublic)
def compare_eval_runs(
    session: SessionDep,
    principal: CurrentPrincipal,
    a: Annotated[str, Query(max_length=100, pattern=ID_PATTERN, description="The baseline run.")],
    b: Annotated[str, Query(max_length=100, pattern=ID_PATTERN, description="The run compared with it.")],
    resamples: Annotated[int, Query(ge=100, le=100_000, description="Bootstrap resamples.")] = DEFAULT_RESAMPLES,
    seed: Annotated[int, Query(ge=0, le=MAX_SEED, description="Bootstrap seed.")] = DEFAULT_SEED,
) -> ComparisonPublic:
    """B against A on one benchmark version: fixed, broken, still passing and still failing tasks,
    the accuracy difference with a paired bootstrap interval, and efficiency differences."""
    comparison = evals.compare_eval_runs(session, principal.organization_id, a, b, resamples=resamples, seed=seed)
    return ComparisonPublic.model_validate(comparison.model_dump())


@router.get("/v1/evals/{eval_id}", response_model=EvalRunPublic)
def get_eval_run(eval_id: EvalId, session: SessionDep, principal: CurrentPrincipal) -> EvalRunPublic:
    return _view(session, catalog.get_eval_run(session, principal.organization_id, eval_id))


@router.post("/v1/evals/{eval_id}/cancel", response_model=EvalRunPublic)
def cancel_eval_run(eval_id: EvalId, session: SessionDep, principal: CurrentPrincipal) -> EvalRunPublic:
    """Cancel a queued or running run; a running one stops after its current batch of tasks."""
    return _view(session, evals.cancel_eval_run(session, principal, eval_id))


@router.get("/v1/evals/{eval_id}/trajectories", response_model=Page[TrajectoryPublic])
def list_trajectories(
    eval_id: EvalId,
    session: SessionDep,
    principal: CurrentPrincipal,
    passed: Annotated[bool | None, Query(description="Only passed (true) or failed (false) tasks.")] = None,
    task_id: Annotated[
        str | None, Query(max_length=200, pattern=TEXT_PATTERN, description="Only the trajectories of this task.")
    ] = None,
    after: After = None,
    limit: Limit = 20,
) -> Page[TrajectoryPublic]:
    """Every task of the run in the order it was written: messages with tool calls, output, grade and cost."""
    run = catalog.get_eval_run(session, principal.organization_id, eval_id)
    result = evals.list_trajectories(session, run, passed=passed, task_id=task_id, after=after, limit=limit)
    return page_of(result, TrajectoryPublic)


@router.post("/v1/datasets/from-failures", response_model=MinedDatasetPublic, status_code=201, tags=["datasets"])
def dataset_from_failures(
    body: FromFailuresCreate, session: SessionDep, settings: SettingsDep, principal: CurrentPrincipal
) -> MinedDatasetPublic:
    """Mine a finished run's failed trajectories into a dataset: SFT rows (`chat`), DPO pairs
    (`preference`) or RL prompts (`prompts`). The same rows again return the same dataset."""
    dataset, result = evals.dataset_from_failures(session, object_store_for(settings), principal, body)
    return mined_dataset(dataset, result)


def mined_dataset(dataset: Dataset, result: MiningResult) -> MinedDatasetPublic:
    """A mined dataset as the API shows it: with what was mined from and what gave no row, and why."""
    return MinedDatasetPublic(
        **DatasetPublic.model_validate(dataset).model_dump(),
        failed_tasks=len(result.rows) + len(result.skipped),
        skipped=[SkippedTask(task_id=task_id, reason=reason) for task_id, reason in result.skipped],
    )

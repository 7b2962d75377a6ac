"""Benchmarks: tasks uploaded as JSONL or YAML, or imported from a built-in benchmark, in
immutable versions. Creating a benchmark makes its version 1; each upload after that adds a
version. A version an eval run used never changes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from mint.api.deps import CurrentPrincipal, SessionDep, SettingsDep
from mint.api.pagination import After, Limit, id_path, page_of
from mint.schemas.common import Page
from mint.schemas.evals import (
    BenchmarkCreate,
    BenchmarkPublic,
    BenchmarkVersionCreate,
    BenchmarkVersionPublic,
)
from mint.services import benchmarks
from mint.storage.objects import object_store_for
from mint.storage.tables import Benchmark, BenchmarkVersion

router = APIRouter(prefix="/v1/benchmarks", tags=["benchmarks"])

BenchmarkId = Annotated[str, id_path("The benchmark's id, e.g. `bench_...`.")]


def _public(benchmark: Benchmark, latest: BenchmarkVersion | None) -> BenchmarkPublic:
    view = BenchmarkPublic.model_validate(benchmark)
    if latest is not None:
        view.latest_version = BenchmarkVersionPublic.model_validate(latest)
    return view


@router.post("", response_model=BenchmarkPublic, status_code=201)
def create_benchmark(
    body: BenchmarkCreate, session: SessionDep, settings: SettingsDep, principal: CurrentPrincipal
) -> BenchmarkPublic:
    """Create a benchmark from `content` (JSONL or YAML tasks) and/or a `builtin` benchmark; it becomes version 1.

    Every task is validated first; any problem (named by line, task and field) stores nothing.
    """
    benchmark, version = benchmarks.create_benchmark(session, object_store_for(settings), principal, body)
    return _public(benchmark, version)


@router.get("", response_model=Page[BenchmarkPublic])
def list_benchmarks(
    session: SessionDep, principal: CurrentPrincipal, after: After = None, limit: Limit = 20
) -> Page[BenchmarkPublic]:
    """Benchmarks of this organization, newest first, each with its newest version."""
    result = benchmarks.list_benchmarks(session, principal.organization_id, after=after, limit=limit)
    latest = benchmarks.latest_versions(session, [row.id for row in result.rows])
    page = page_of(result, BenchmarkPublic)
    for item, row in zip(page.data, result.rows, strict=True):
        if row.id in latest:
            item.latest_version = BenchmarkVersionPublic.model_validate(latest[row.id])
    return page


@router.get("/{benchmark_id}", response_model=BenchmarkPublic)
def get_benchmark(benchmark_id: BenchmarkId, session: SessionDep, principal: CurrentPrincipal) -> BenchmarkPublic:
    benchmark = benchmarks.get_benchmark(session, principal.organization_id, benchmark_id)
    return _public(benchmark, benchmarks.latest_version(session, benchmark.id))


@router.post("/{benchmark_id}/versions", response_model=BenchmarkVersionPublic, status_code=201)
def create_version(
    benchmark_id: BenchmarkId,
    body: BenchmarkVersionCreate,
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
) -> BenchmarkVersion:
    """Add the next version; or, with `replace_latest`, replace the newest version's tasks while no run used it."""
    return benchmarks.add_version(session, object_store_for(settings), principal, benchmark_id, body)


@router.get("/{benchmark_id}/versions", response_model=Page[BenchmarkVersionPublic])
def list_versions(
    benchmark_id: BenchmarkId,
    session: SessionDep,
    principal: CurrentPrincipal,
    after: After = None,
    limit: Limit = 20,
) -> Page[BenchmarkVersionPublic]:
    """The benchmark's versions, newest first."""
    benchmark = benchmarks.get_benchmark(session, principal.organization_id, benchmark_id)
    return page_of(benchmarks.list_versions(session, benchmark, after=after, limit=limit), BenchmarkVersionPublic)

"""Benchmarks and their immutable versions: tasks from JSONL or YAML (text or a file), or
imported from a built-in benchmark.

Creating a benchmark makes its version 1; `create_version` adds the next. A version that an
eval run used never changes, so two runs on it are comparable task by task.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mint.schemas.common import Page
from mint.schemas.evals import (
    BenchmarkCreate,
    BenchmarkFormat,
    BenchmarkPublic,
    BenchmarkVersionCreate,
    BenchmarkVersionPublic,
    BuiltinName,
    BuiltinSplit,
)
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_model, request_body
from mint.sdk.errors import BadRequestError
from mint.sdk.pagination import AsyncPager, PageCall, SyncPager

Grader = str | dict[str, Any]
FORMAT_OF_SUFFIX: dict[str, BenchmarkFormat] = {".jsonl": "jsonl", ".json": "jsonl", ".yaml": "yaml", ".yml": "yaml"}


def source_fields(
    *,
    content: str | None,
    path: str | os.PathLike[str] | None,
    dataset_id: str | None = None,
    format: BenchmarkFormat | None,
    grader: Grader | None,
    builtin: BuiltinName | None,
    split: BuiltinSplit | None,
    n: int | None,
    seed: int | None,
) -> dict[str, Any]:
    """The request fields of a version's tasks.

    `path` is read here (the API takes the text); its format follows its suffix. Text without
    a format is JSONL if it starts with `{`, else YAML. `dataset_id` names an uploaded prompts
    dataset instead (a TRL, verl or OpenRLHF file, parquet included, goes through the dataset
    upload first). A grader given by name is that grader with its default options.
    """
    if path is not None:
        if content is not None:
            raise BadRequestError("give the tasks as `content` or as `path`, not both", param="path")
        file = Path(path)
        content = file.read_text(encoding="utf-8")
        format = format or FORMAT_OF_SUFFIX.get(file.suffix.lower())
    if content is not None and format is None:
        format = "jsonl" if content.lstrip().startswith("{") else "yaml"
    return {
        "content": content,
        "dataset_id": dataset_id,
        "format": format,
        "grader": {"type": grader} if isinstance(grader, str) else grader,
        "builtin": builtin,
        "split": split,
        "n": n,
        "seed": seed,
    }


def create_benchmark(name: str, description: str, source: dict[str, Any]) -> Call[BenchmarkPublic]:
    body = request_body(BenchmarkCreate, name=name, description=description or None, **source)
    return Call("POST", "/v1/benchmarks", parse_model(BenchmarkPublic), json=body)


def create_version(benchmark_id: str, replace_latest: bool, source: dict[str, Any]) -> Call[BenchmarkVersionPublic]:
    body = request_body(BenchmarkVersionCreate, replace_latest=replace_latest or None, **source)
    return Call("POST", f"/v1/benchmarks/{benchmark_id}/versions", parse_model(BenchmarkVersionPublic), json=body)


def get_benchmark(benchmark_id: str) -> Call[BenchmarkPublic]:
    return Call("GET", f"/v1/benchmarks/{benchmark_id}", parse_model(BenchmarkPublic))


def list_benchmarks(limit: int) -> PageCall:
    return lambda after: Call(
        "GET", "/v1/benchmarks", parse_model(Page[BenchmarkPublic]), {"after": after, "limit": limit}
    )


def list_versions(benchmark_id: str, limit: int) -> PageCall:
    return lambda after: Call(
        "GET",
        f"/v1/benchmarks/{benchmark_id}/versions",
        parse_model(Page[BenchmarkVersionPublic]),
        {"after": after, "limit": limit},
    )


class Benchmarks:
    """`/v1/benchmarks`: create, read and version benchmarks."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def create(
        self,
        name: str,
        *,
        content: str | None = None,
        path: str | os.PathLike[str] | None = None,
        dataset_id: str | None = None,
        format: BenchmarkFormat | None = None,
        grader: Grader | None = None,
        builtin: BuiltinName | None = None,
        split: BuiltinSplit | None = None,
        n: int | None = None,
        seed: int | None = None,
        description: str = "",
    ) -> BenchmarkPublic:
        """Create a benchmark (its version 1) from `content`, a file at `path`, an uploaded prompts
        dataset (`dataset_id`), and/or a `builtin` one."""
        source = source_fields(
            content=content,
            path=path,
            dataset_id=dataset_id,
            format=format,
            grader=grader,
            builtin=builtin,
            split=split,
            n=n,
            seed=seed,
        )
        return self._http.send(create_benchmark(name, description, source))

    def create_version(
        self,
        benchmark_id: str,
        *,
        content: str | None = None,
        path: str | os.PathLike[str] | None = None,
        dataset_id: str | None = None,
        format: BenchmarkFormat | None = None,
        grader: Grader | None = None,
        builtin: BuiltinName | None = None,
        split: BuiltinSplit | None = None,
        n: int | None = None,
        seed: int | None = None,
        replace_latest: bool = False,
    ) -> BenchmarkVersionPublic:
        """Add the next version; with `replace_latest`, replace the newest one's tasks while no run used it."""
        source = source_fields(
            content=content,
            path=path,
            dataset_id=dataset_id,
            format=format,
            grader=grader,
            builtin=builtin,
            split=split,
            n=n,
            seed=seed,
        )
        return self._http.send(create_version(benchmark_id, replace_latest, source))

    def get(self, benchmark_id: str) -> BenchmarkPublic:
        return self._http.send(get_benchmark(benchmark_id))

    def list(self, *, limit: int = 20) -> SyncPager[BenchmarkPublic]:
        """Every benchmark, newest first, each with its newest version."""
        return SyncPager(self._http, list_benchmarks(limit))

    def versions(self, benchmark_id: str, *, limit: int = 20) -> SyncPager[BenchmarkVersionPublic]:
        """The benchmark's versions, newest first."""
        return SyncPager(self._http, list_versions(benchmark_id, limit))


class AsyncBenchmarks:
    """`/v1/benchmarks`, for asyncio: the twin of `Benchmarks`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def create(
        self,
        name: str,
        *,
        content: str | None = None,
        path: str | os.PathLike[str] | None = None,
        dataset_id: str | None = None,
        format: BenchmarkFormat | None = None,
        grader: Grader | None = None,
        builtin: BuiltinName | None = None,
        split: BuiltinSplit | None = None,
        n: int | None = None,
        seed: int | None = None,
        description: str = "",
    ) -> BenchmarkPublic:
        source = source_fields(
            content=content,
            path=path,
            dataset_id=dataset_id,
            format=format,
            grader=grader,
            builtin=builtin,
            split=split,
            n=n,
            seed=seed,
        )
        return await self._http.send(create_benchmark(name, description, source))

    async def create_version(
        self,
        benchmark_id: str,
        *,
        content: str | None = None,
        path: str | os.PathLike[str] | None = None,
        dataset_id: str | None = None,
        format: BenchmarkFormat | None = None,
        grader: Grader | None = None,
        builtin: BuiltinName | None = None,
        split: BuiltinSplit | None = None,
        n: int | None = None,
        seed: int | None = None,
        replace_latest: bool = False,
    ) -> BenchmarkVersionPublic:
        source = source_fields(
            content=content,
            path=path,
            dataset_id=dataset_id,
            format=format,
            grader=grader,
            builtin=builtin,
            split=split,
            n=n,
            seed=seed,
        )
        return await self._http.send(create_version(benchmark_id, replace_latest, source))

    async def get(self, benchmark_id: str) -> BenchmarkPublic:
        return await self._http.send(get_benchmark(benchmark_id))

    def list(self, *, limit: int = 20) -> AsyncPager[BenchmarkPublic]:
        return AsyncPager(self._http, list_benchmarks(limit))

    def versions(self, benchmark_id: str, *, limit: int = 20) -> AsyncPager[BenchmarkVersionPublic]:
        return AsyncPager(self._http, list_versions(benchmark_id, limit))

"""Benchmarks and their versions: uploaded or built-in tasks, validated once, stored by content.

A version's tasks are written in their canonical form (`mint.evals.benchmark.canonical_jsonl`)
to the object store under their sha256 (`benchmarks/sha256/<hex>.jsonl`); the row holds the
key, the hash, the task count per split and the benchmark-level grader. Nothing is stored
unless every task is valid.

A version is immutable once an eval run used it (`locked_at`, set by the first run). Until
then, `replace_latest` may give the newest version new tasks; the lock and the replacement
are conditional updates, so a run and a replacement racing each other cannot both win.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest, NotFound, did_you_mean
from mint.evals.benchmark import (
    MAX_TASKS,
    BenchmarkTask,
    ParsedBenchmark,
    benchmark_of_rows,
    build_benchmark,
    canonical_jsonl,
    load_canonical,
    parse_benchmark,
)
from mint.evals.builtin import SPLITS, builtin_benchmarks, load_builtin
from mint.evals.graders import GraderSpec
from mint.schemas.evals import BenchmarkCreate, BenchmarkSource, BenchmarkVersionCreate
from mint.services import datasets
from mint.services.principal import Principal
from mint.storage.keys import benchmark_key
from mint.storage.objects import ObjectStore
from mint.storage.queries import PageResult, owned_by, paginate, rowcount
from mint.storage.tables import Benchmark, BenchmarkVersion, new_id, utcnow

DEFAULT_BUILTIN_TASKS = 20


def _builtin_tasks(source: BenchmarkSource) -> list[BenchmarkTask]:
    if source.builtin is None:
        for field in ("split", "n", "seed"):
            if getattr(source, field) is not None:
                raise InvalidRequest(
                    f"{field} applies to built-in benchmarks only; add `builtin` (arithmetic, format or "
                    f"tool_calling) or remove {field}",
                    param=field,
                )
        return []
    splits = [source.split] if source.split else list(SPLITS)
    n = source.n or DEFAULT_BUILTIN_TASKS
    return [
        BenchmarkTask.from_builtin(task)
        for split in splits
        for task in load_builtin(source.builtin, split, n, seed=source.seed or 0)
    ]


def _dataset_rows(session: Session, store: ObjectStore, organization_id: str, dataset_id: str) -> list[dict[str, Any]]:
    """The rows of the organization's prompts dataset (stored in Mint's shape, whatever its upload's format)."""
    dataset = datasets.get_dataset(session, organization_id, dataset_id)
    if dataset.kind != "prompts":
        raise InvalidRequest(
            f"dataset {dataset.id!r} holds {dataset.kind} rows; a benchmark is made of prompts rows (a prompt "
            "and its reference)",
            param="dataset_id",
        )
    if dataset.row_count > MAX_TASKS:
        raise InvalidRequest(
            f"dataset {dataset.id!r} has {dataset.row_count} rows; a benchmark holds at most {MAX_TASKS} tasks",
            param="dataset_id",
        )
    return datasets.read_rows(store, dataset)


def read_source(source: BenchmarkSource, session: Session, store: ObjectStore, organization_id: str) -> ParsedBenchmark:
    """The validated tasks a request describes; InvalidRequest names what is missing or wrong."""
    if source.dataset_id is not None:
        if source.content is not None or source.format is not None:
            raise InvalidRequest("give the tasks as `content` or as `dataset_id`, not both", param="dataset_id")
        rows = _dataset_rows(session, store, organization_id, source.dataset_id)
        grader = source.grader.model_dump() if source.grader is not None else None
        return benchmark_of_rows(rows, grader=grader, extra_tasks=_builtin_tasks(source))
    if source.content is not None and source.format is None:
        raise InvalidRequest("`content` needs its `format`: jsonl or yaml", param="format")
    if source.content is None and source.format is not None:
        raise InvalidRequest(f"`format` is {source.format!r} but there is no `content`; add the tasks", param="content")
    if source.content is None and source.builtin is None:
        raise InvalidRequest(
            "give the tasks: `content` with `format` (jsonl or yaml), `dataset_id` (an uploaded prompts "
            "dataset), or `builtin` (arithmetic, format, tool_calling or triage) with `n`",
            param="content",
        )
    builtin = _builtin_tasks(source)
    grader = source.grader.model_dump() if source.grader is not None else None
    if source.content is not None and source.format is not None:
        return parse_benchmark(source.content, source.format, grader=grader, extra_tasks=builtin)
    return build_benchmark(builtin, grader=GraderSpec.model_validate(grader) if grader is not None else None)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _store(store: ObjectStore, canonical: bytes) -> tuple[str, str]:
    """Write the canonical tasks (`canonical_jsonl`) under their hash (once: the same content is one object)."""
    stored = store.put_content(canonical, benchmark_key)
    return stored.key, stored.sha256


def _version_row(benchmark: Benchmark, number: int, key: str, sha256: str, parsed: ParsedBenchmark) -> BenchmarkVersion:
    return BenchmarkVersion(
        id=new_id("bmv"),
        benchmark_id=benchmark.id,
        version=number,
        object_key=key,
        sha256=sha256,
        task_count=len(parsed.tasks),
        splits=parsed.splits,
        grader=parsed.grader.model_dump(mode="json") if parsed.grader is not None else {},
    )


def _named(session: Session, organization_id: str, name: str) -> Benchmark | None:
    return session.execute(
        select(Benchmark).where(Benchmark.organization_id == organization_id, Benchmark.name == name)
    ).scalar_one_or_none()


def create_benchmark(
    session: Session, store: ObjectStore, principal: Principal, body: BenchmarkCreate
) -> tuple[Benchmark, BenchmarkVersion]:
    """A new benchmark with its version 1; the name must be new in the organization."""
    if _named(session, principal.organization_id, body.name) is not None:
        raise Conflict(
            f"a benchmark named {body.name!r} already exists; add a version to it with "
            f"POST /v1/benchmarks/{{id}}/versions, or choose another name",
            param="name",
        )
    parsed = read_source(body, session, store, principal.organization_id)
    key, sha256 = _store(store, canonical_jsonl(parsed.tasks))
    benchmark = Benchmark(
        id=new_id("bench"),
        organization_id=principal.organization_id,
        name=body.name,
        description=body.description or parsed.description or builtin_benchmarks().get(body.builtin or "", ""),
    )
    session.add(benchmark)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(f"a benchmark named {body.name!r} was created at the same time; choose another name") from None
    version = _version_row(benchmark, 1, key, sha256, parsed)
    session.add(version)
    session.flush()
    return benchmark, version


def get_benchmark(session: Session, organization_id: str, benchmark_id: str) -> Benchmark:
    """The organization's benchmark by id, or by its name (unique in the organization); a name
    that names none gets the nearest names and how to create one."""
    row = session.get(Benchmark, benchmark_id)
    if row is not None and row.organization_id == organization_id:
        return row
    named = select(Benchmark).where(Benchmark.organization_id == organization_id)
    found = session.execute(named.where(Benchmark.name == benchmark_id)).scalar_one_or_none()
    if found is not None:
        return found
    names = session.execute(select(Benchmark.name).where(Benchmark.organization_id == organization_id)).scalars()
    raise NotFound(
        f"No benchmark with id or name {benchmark_id!r} in this organization{did_you_mean(benchmark_id, names)}; "
        "create one with POST /v1/benchmarks",
        param="id",
    )


def latest_version(session: Session, benchmark_id: str) -> BenchmarkVersion | None:
    return session.execute(
        select(BenchmarkVersion)
        .where(BenchmarkVersion.benchmark_id == benchmark_id)
        .order_by(BenchmarkVersion.version.desc())
        .limit(1)
    ).scalar_one_or_none()


def latest_versions(session: Session, benchmark_ids: list[str]) -> dict[str, BenchmarkVersion]:
    """The newest version of each benchmark, in one query."""
    if not benchmark_ids:
        return {}
    newest = (
        select(BenchmarkVersion.benchmark_id, func.max(BenchmarkVersion.version).label("version"))
        .where(BenchmarkVersion.benchmark_id.in_(benchmark_ids))
        .group_by(BenchmarkVersion.benchmark_id)
        .subquery()
    )
    rows = session.execute(
        select(BenchmarkVersion).join(
            newest,
            (BenchmarkVersion.benchmark_id == newest.c.benchmark_id) & (BenchmarkVersion.version == newest.c.version),
        )
    ).scalars()
    return {row.benchmark_id: row for row in rows}


def get_version(session: Session, benchmark: Benchmark, version: int | None) -> BenchmarkVersion:
    """Version `version` of the benchmark, or its newest for None."""
    if version is None:
        row = latest_version(session, benchmark.id)
    else:
        row = session.execute(
            select(BenchmarkVersion).where(
                BenchmarkVersion.benchmark_id == benchmark.id, BenchmarkVersion.version == version
            )
        ).scalar_one_or_none()
    if row is None:
        newest = latest_version(session, benchmark.id)
        have = f"versions 1 to {newest.version}" if newest else "no versions"
        raise NotFound(f"benchmark {benchmark.name!r} has no version {version} (it has {have})", param="version")
    return row


def add_version(
    session: Session, store: ObjectStore, principal: Principal, benchmark_id: str, body: BenchmarkVersionCreate
) -> BenchmarkVersion:
    """The benchmark's next version, or (`replace_latest`) new tasks for its unused newest version."""
    benchmark = get_benchmark(session, principal.organization_id, benchmark_id)
    parsed = read_source(body, session, store, principal.organization_id)
    newest = latest_version(session, benchmark.id)
    if newest is not None and body.replace_latest:
        if newest.locked_at is not None:
            raise _locked(benchmark, newest)
        key, sha256 = _store(store, canonical_jsonl(parsed.tasks))
        replacement = _version_row(benchmark, newest.version, key, sha256, parsed)
        # Conditional on the lock: an eval run that locked the version meanwhile wins.
        changed = session.execute(
            update(BenchmarkVersion)
            .where(BenchmarkVersion.id == newest.id, BenchmarkVersion.locked_at.is_(None))
            .values(
                object_key=key,
                sha256=sha256,
                task_count=replacement.task_count,
                splits=replacement.splits,
                grader=replacement.grader,
                created_at=utcnow(),
            )
            .execution_options(synchronize_session=False)
        )
        session.refresh(newest)
        if not rowcount(changed):
            raise _locked(benchmark, newest)
        return newest
    canonical = canonical_jsonl(parsed.tasks)
    if newest is not None and newest.sha256 == _sha256(canonical):
        raise Conflict(
            f"version {newest.version} of benchmark {benchmark.name!r} already has exactly these tasks "
            f"(sha256 {newest.sha256[:12]}...); nothing to add",
            param="content",
        )
    key, sha256 = _store(store, canonical)
    version = _version_row(benchmark, (newest.version if newest else 0) + 1, key, sha256, parsed)
    session.add(version)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(
            f"another version of benchmark {benchmark.name!r} was added at the same time; send this one again"
        ) from None
    return version


def add_version_of_tasks(
    session: Session,
    store: ObjectStore,
    benchmark: Benchmark,
    tasks: list[BenchmarkTask],
    grader: dict[str, Any],
) -> BenchmarkVersion:
    """The benchmark's next version holding `tasks` (already validated, e.g. an older version's
    tasks with other splits) under the benchmark-level `grader`; an identical newest version is
    reused."""
    parsed = ParsedBenchmark(tasks=tasks, grader=GraderSpec.model_validate(grader) if grader else None)
    newest = latest_version(session, benchmark.id)
    canonical = canonical_jsonl(parsed.tasks)
    if newest is not None and newest.sha256 == _sha256(canonical):
        return newest
    key, sha256 = _store(store, canonical)
    version = _version_row(benchmark, (newest.version if newest else 0) + 1, key, sha256, parsed)
    session.add(version)
    session.flush()
    return version


def _locked(benchmark: Benchmark, version: BenchmarkVersion) -> Conflict:
    return Conflict(
        f"version {version.version} of benchmark {benchmark.name!r} is locked: an eval run used it "
        f"(at {version.locked_at}), and a used version never changes. Post without replace_latest "
        f"to add version {version.version + 1}",
        param="replace_latest",
    )


def list_benchmarks(session: Session, organization_id: str, *, after: str | None, limit: int) -> PageResult[Benchmark]:
    return paginate(session, owned_by(Benchmark, organization_id), Benchmark, after=after, limit=limit)


def list_versions(
    session: Session, benchmark: Benchmark, *, after: str | None, limit: int
) -> PageResult[BenchmarkVersion]:
    query = select(BenchmarkVersion).where(BenchmarkVersion.benchmark_id == benchmark.id)
    return paginate(session, query, BenchmarkVersion, after=after, limit=limit)


def lock_version(session: Session, version: BenchmarkVersion) -> BenchmarkVersion:
    """Mark the version used (once), then read it again: what a run records is what is locked."""
    session.execute(
        update(BenchmarkVersion)
        .where(BenchmarkVersion.id == version.id, BenchmarkVersion.locked_at.is_(None))
        .values(locked_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.refresh(version)
    return version


def load_tasks(store: ObjectStore, object_key: str, sha256: str) -> list[BenchmarkTask]:
    """A version's tasks from the object store, checked against the hash the run recorded."""
    data = store.get_bytes(object_key)
    if _sha256(data) != sha256:
        raise Conflict(
            f"the benchmark content at {object_key} does not match its recorded sha256; the object store was "
            "changed outside Mint"
        )
    return load_canonical(data)

"""The benchmark version an auto run uses: the one asked for, or, where it has no dev split, a
new version with the same tasks whose dev split is a quarter of train (by task-id hash, so the
same tasks always land on the same side). Trials are chosen on dev; held-out stays untouched.
"""

from __future__ import annotations

import hashlib

from mint.errors import InvalidRequest
from mint.services import benchmarks
from mint.services.autotune.tick import Tick

# Share of the train split that becomes dev when the version has none.
DEV_PERCENT = 25


def settle_version(tick: Tick) -> None:
    """Pick the benchmark version, giving it a dev split if it has none; record it in the state."""
    run, splits = tick.run, tick.request.splits
    benchmark = benchmarks.get_benchmark(tick.session, run.organization_id, run.benchmark_id)
    version = benchmarks.get_version(tick.session, benchmark, tick.request.version)
    for role, name in (("train", splits.train), ("heldout", splits.heldout)):
        if version.splits.get(name, 0) == 0:
            raise InvalidRequest(
                f"version {version.version} of benchmark {benchmark.name!r} has no {name!r} split for {role}; its "
                f"splits: {version.splits}. Name the splits to use in `splits`",
                param=f"splits.{role}",
            )
    if version.splits.get(splits.dev, 0) == 0:
        tasks = benchmarks.load_tasks(tick.store, version.object_key, version.sha256)
        carved = [
            task.model_copy(update={"split": splits.dev})
            if task.split == splits.train and _bucket(task.id) < DEV_PERCENT
            else task
            for task in tasks
        ]
        moved = sum(task.split == splits.dev for task in carved)
        if moved == 0 or moved == version.splits[splits.train]:
            raise InvalidRequest(
                f"the {splits.train!r} split of benchmark {benchmark.name!r} has too few tasks "
                f"({version.splits[splits.train]}) to set a dev split apart; add a {splits.dev!r} split",
                param="splits.dev",
            )
        derived = benchmarks.add_version_of_tasks(tick.session, tick.store, benchmark, carved, version.grader)
        tick.decide(
            f"use benchmark {benchmark.name!r} version {derived.version}",
            f"version {version.version} has no {splits.dev!r} split: version {derived.version} has the same tasks, "
            f"with {moved} of the {version.splits[splits.train]} {splits.train!r} tasks (by task-id hash) as "
            f"{splits.dev!r} for choosing among trials; {splits.heldout!r} is untouched",
        )
        version = derived
    tick.state.version = version.version
    tick.state.benchmark_version_id = version.id
    tick.state.grader = version.grader
    tick.save()


def _bucket(task_id: str) -> int:
    return int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) % 100

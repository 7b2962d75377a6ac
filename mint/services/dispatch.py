"""The one way services send work to the workers: a task name, string arguments, and where.

A message carries only ids (the database row is the truth, DESIGN.md section 2), so a task is
a name and a few strings. Where it goes follows from what the work needs:

- `base_model`: the queue of the workers that keep that base resident (`train.<base>`);
- `worker`: the queue of one worker process (`process.<host>.<pid>`), for a Tinker model
  that lives in that process's memory;
- neither: the system queue (light platform upkeep that any worker runs).

Services take a `Dispatch` as an argument and never build one; the process that runs them
chooses the implementation (Celery's, in `mint.worker.dispatch`; a test may pass a recorder),
so no service imports Celery.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol


class WorkerRef(NamedTuple):
    """Where a live worker process is: its host and pid name its own queue."""

    hostname: str
    pid: int


class Dispatch(Protocol):
    """Publishes `task` with `args`: to the workers of `base_model`, to one `worker` process, or
    (neither given) to the system queue. `task_id` names the message, so that the reconciler can
    tell whether the broker still holds it; `countdown_s` delays its run (work waiting for capacity)."""

    def __call__(
        self,
        task: str,
        *,
        args: list[str],
        task_id: str | None = None,
        base_model: str | None = None,
        worker: WorkerRef | None = None,
        countdown_s: float | None = None,
    ) -> None: ...

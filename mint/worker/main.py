"""Running a Celery worker process: the one code path of `mint worker` and of a worker group's rank 0."""

from __future__ import annotations

from mint.config import get_settings
from mint.storage.db import configure_pool_from
from mint.trainer.host_memory import share_one_arena
from mint.worker.app import celery_app


def run_worker(queues: list[str], node: str, loglevel: str) -> None:
    """Consume `queues` as Celery node `node`, one task at a time in this process (the solo pool:
    the resident base lives here, and a worker group's collectives run on this thread)."""
    share_one_arena()  # before Celery's threads start (`host_memory.share_one_arena`)
    settings = get_settings()
    configure_pool_from(settings)
    celery_app().worker_main(
        [
            "worker",
            "-Q",
            ",".join(queues),
            "-n",
            node,
            "--pool",
            "solo",
            "--loglevel",
            loglevel,
            "--without-gossip",
            "--without-mingle",
        ]
    )

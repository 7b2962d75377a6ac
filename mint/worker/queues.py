"""Queue names: one per base model for training, one for evals, one for serving control, and
one per worker process (for the Tinker models it holds).

Kept free of Celery so that the CLI can name queues without importing it.
"""

from __future__ import annotations

import os
import socket

EVALS_QUEUE = "evals"
SERVING_QUEUE = "serving"
# Light platform upkeep (pruning dead workers, reconciling lost messages); every worker
# consumes it so that it never waits behind a long training step.
SYSTEM_QUEUE = "system"
TRAINING_PREFIX = "train."
# A Tinker model lives in one worker process's memory: its messages go to that process's own
# queue, which every process started with `mint worker --base NAME` also consumes.
PROCESS_QUEUE_PREFIX = "process."


def training_queue(base_model: str) -> str:
    """The queue whose workers keep `base_model` resident, e.g. `train.tiny-glm-moe`."""
    return f"{TRAINING_PREFIX}{base_model}"


def base_of_queue(queue: str) -> str | None:
    """The base model a training queue serves (`train.X` -> `X`); None for other queues."""
    return queue.removeprefix(TRAINING_PREFIX) if queue.startswith(TRAINING_PREFIX) else None


def all_queues(base_models: list[str]) -> list[str]:
    return [*(training_queue(name) for name in base_models), EVALS_QUEUE, SERVING_QUEUE, SYSTEM_QUEUE]


def process_queue(hostname: str | None = None, pid: int | None = None) -> str:
    """The queue only one worker process consumes (this one, by default)."""
    return f"{PROCESS_QUEUE_PREFIX}{hostname or socket.gethostname()}.{pid or os.getpid()}"

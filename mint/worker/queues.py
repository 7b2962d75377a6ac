"""Queue names: one per base model for training, one for evals, one for serving control.

Kept free of Celery so that the API and the CLI can name queues without importing it.
"""

from __future__ import annotations

EVALS_QUEUE = "evals"
SERVING_QUEUE = "serving"
# Light platform upkeep (pruning dead workers, reconciling lost messages); every worker
# consumes it so that it never waits behind a long training step.
SYSTEM_QUEUE = "system"
TRAINING_PREFIX = "train."


def training_queue(base_model: str) -> str:
    """The queue whose workers keep `base_model` resident, e.g. `train.tiny-glm-moe`."""
    return f"{TRAINING_PREFIX}{base_model}"


def base_of_queue(queue: str) -> str | None:
    """The base model a training queue serves (`train.X` -> `X`); None for other queues."""
    return queue.removeprefix(TRAINING_PREFIX) if queue.startswith(TRAINING_PREFIX) else None


def all_queues(base_models: list[str]) -> list[str]:
    return [*(training_queue(name) for name in base_models), EVALS_QUEUE, SERVING_QUEUE, SYSTEM_QUEUE]

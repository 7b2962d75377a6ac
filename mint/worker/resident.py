"""The base model a worker process keeps resident, loaded once and shared by its tasks.

A training worker (`mint worker --base NAME`) consumes one base's queue; the first task
that needs the base loads it, and every later task of the process (fine-tuning jobs,
eval runs, Tinker primitives) reuses the same weights, each on its own LoRA session, up to
`MINT_WORKER_MAX_SESSIONS` sessions at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mint.config import get_settings
from mint.schemas.base_models import get_base_model_spec

if TYPE_CHECKING:
    from mint.trainer.session import ResidentBase


def resident_base(name: str) -> ResidentBase:
    """This process's ResidentBase for base model `name`, loaded on first use."""
    from mint.trainer.session import ResidentBase

    settings = get_settings()
    spec = get_base_model_spec(name, settings.model_configs_dir)
    return ResidentBase.shared(spec, settings.models_cache_dir, max_sessions=settings.worker_max_sessions)

"""The base model a worker process keeps resident, loaded once and shared by its tasks.

A training worker (`mint worker --base NAME`) consumes one base's queue; the first task
that needs the base loads it, and every later task of the process (fine-tuning jobs,
eval runs, Tinker primitives) reuses the same weights, each on its own LoRA session, up to
`MINT_WORKER_MAX_SESSIONS` sessions at once.

Rank 0 of a worker group (`mint worker --base NAME --nproc N`) holds its shard of the base,
loaded at start by `load_group_base`; its tasks get that one the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mint.config import Settings, get_settings
from mint.schemas.base_models import get_base_model_spec

if TYPE_CHECKING:
    from mint.trainer.group import Group
    from mint.trainer.session import ResidentBase

_group_bases: dict[str, ResidentBase] = {}


def base_options(settings: Settings) -> dict[str, Any]:
    """A worker's resident base's options, from its settings: how many sessions it holds, whether
    their forward_backward calls mix, and whether mixed passes are batch-invariant."""
    return {
        "max_sessions": settings.worker_max_sessions,
        "mix_backward": settings.worker_mix_backward,
        "batch_invariant": settings.worker_batch_invariant,
    }


def resident_base(name: str) -> ResidentBase:
    """This process's ResidentBase for base model `name`, loaded on first use."""
    from mint.trainer.precision import compute_dtype
    from mint.trainer.session import ResidentBase

    if name in _group_bases:
        return _group_bases[name]
    settings = get_settings()
    spec = get_base_model_spec(name, settings.model_configs_dir)
    dtype = compute_dtype(settings.compute_dtype, spec.dtype, "cpu")
    return ResidentBase.shared(spec, settings.models_cache_dir, dtype=dtype, **base_options(settings))


def load_group_base(name: str, group: Group) -> ResidentBase:
    """Load base `name` on this rank of `group`, sharded over the group, then make it this
    process's base for its tasks (`resident_base`). Each rank builds the model empty, shards it
    and reads only its own shards of the weights (`mint.trainer.sharded_loading`), so no host
    ever holds the whole base; the ranks pull it in turn first, so no two write the cache."""
    from mint.trainer.precision import compute_dtype
    from mint.trainer.session import ResidentBase

    settings = get_settings()
    spec = get_base_model_spec(name, settings.model_configs_dir)
    dtype = compute_dtype(settings.compute_dtype, spec.dtype, group.device)
    base = ResidentBase(spec, settings.models_cache_dir, dtype=dtype, group=group, **base_options(settings))
    _group_bases[name] = base
    return base

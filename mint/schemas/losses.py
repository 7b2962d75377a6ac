"""The built-in losses' names and config keys, without torch, for the processes that only
describe work (the API checks a job's `loss_fn_config` before any worker sees it).

`mint.trainer.losses` registers the same names with these defaults, so the two cannot
disagree. Defaults follow Tinker's documentation where it gives them (tinker-docs, "Loss
Functions"); GSPO's band is the GSPO paper's (Zheng et al., 2025: 3e-4 below, 4e-4 above);
StableReinforce's are Mint's own (see `mint.trainer.losses.stable_reinforce`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from mint.errors import InvalidRequest

LOSS_CONFIG_DEFAULTS: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "dro": {"beta": 0.05},
    "gspo": {"clip_low_threshold": 1.0 - 3e-4, "clip_high_threshold": 1.0 + 4e-4},
    "stable_reinforce": {"clip_high_threshold": 2.0, "kl_coeff": 0.0},
    "dpo": {"beta": 0.1},
}

# The losses a REST `reinforcement` job can train with: those over sampled tokens and advantages.
RlLossName = Literal["importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce"]

# Losses that name the sampled sequence behind each datum (Tinker's provenance spans) and read
# what the server recorded when it sampled them (`record_stability_info`).
NEEDS_PROVENANCE = frozenset({"stable_reinforce"})


def check_loss_config(loss_fn: str, config: Mapping[str, float] | None) -> dict[str, float]:
    """`config` over the loss's defaults; an unknown loss or key is refused, naming the known ones."""
    defaults = LOSS_CONFIG_DEFAULTS.get(loss_fn)
    if defaults is None:
        raise InvalidRequest(
            f"unknown loss {loss_fn!r}; known: {', '.join(sorted(LOSS_CONFIG_DEFAULTS))}", param="loss_fn"
        )
    return resolve_config(loss_fn, defaults, config)


def resolve_config(loss_fn: str, defaults: Mapping[str, float], config: Mapping[str, float] | None) -> dict[str, float]:
    """`defaults` overlaid with `config`; a key the loss does not take is refused, naming the known ones."""
    given = dict(config or {})
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        known = ", ".join(sorted(defaults)) or "(none)"
        raise InvalidRequest(
            f"loss {loss_fn!r} takes no config key {', '.join(unknown)}; known: {known}", param="loss_fn_config"
        )
    return {**defaults, **{key: float(value) for key, value in given.items()}}

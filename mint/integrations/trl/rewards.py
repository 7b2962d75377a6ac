"""TRL's reward functions on this side of Mint: their names and checks as TRL's GRPOTrainer
makes them, and the group-relative advantages TRL computes from their rewards."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

RewardFunc = Callable[..., Any]


def reward_func_name(func: RewardFunc) -> str:
    """TRL's name for a reward function: a partial's wrapped function's, else `__name__`, else
    the class name (`trl.trainer.utils.get_callable_name`)."""
    while isinstance(func, functools.partial):
        func = func.func
    return str(getattr(func, "__name__", type(func).__name__))


def check_reward_funcs(reward_funcs: Any) -> list[RewardFunc]:
    """`reward_funcs` as a list of callables; a hub reward model's name or a local model is refused."""
    funcs = [] if reward_funcs is None else reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    if not funcs:
        raise ValueError("reward_funcs: give at least one reward function")
    for func in funcs:
        if isinstance(func, str):
            raise ValueError(
                f"reward_funcs: {func!r} names a reward model to load locally; Mint's GRPOTrainer runs reward "
                "functions (TRL's signature) in this process: pass a callable, e.g. one that calls your reward model"
            )
        if not callable(func) or hasattr(func, "parameters") and hasattr(func, "forward"):
            raise ValueError(
                f"reward_funcs: {type(func).__name__} is not a reward function; pass callables with TRL's signature "
                "f(prompts, completions, completion_ids, **columns) -> list[float]"
            )
    return funcs


def nanstd(values: Sequence[float]) -> float:
    """TRL's nanstd: the unbiased standard deviation of the non-NaN values."""
    kept = [v for v in values if not math.isnan(v)]
    if len(kept) < 2:
        return float("nan")
    mean = sum(kept) / len(kept)
    return math.sqrt(sum((v - mean) ** 2 for v in kept) / (len(kept) - 1))


def nanmean(values: Sequence[float]) -> float:
    """The mean of the non-NaN values (NaN when there are none)."""
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else float("nan")


def _nansum(values: Sequence[float]) -> float:
    return sum(v for v in values if not math.isnan(v))


def group_advantages(
    rewards_per_func_N_F: list[list[float]],
    weights_F: list[float],
    num_generations: int,
    scale_rewards: str,
    aggregation: str = "sum_then_normalize",
) -> tuple[list[float], list[float], float]:
    """TRL's advantages (`GRPOTrainer._generate_and_score_completions`), for N = B * G completions
    in groups of G: the weighted sum of the rewards minus its group mean, divided by the group's
    ('group') or the batch's ('batch') std + 1e-4, or not divided ('none'). A completion every
    function returned None for gets advantage 0. Returns (advantages_N, rewards_N, fraction of
    completions whose group's std is 0)."""
    n = len(rewards_per_func_N_F)
    unscorable = [all(math.isnan(r) for r in row) for row in rewards_per_func_N_F]
    groups = [range(start, start + num_generations) for start in range(0, n, num_generations)]
    if aggregation == "normalize_then_sum":
        columns = list(zip(*rewards_per_func_N_F, strict=True)) if n else []
        normalized = [[0.0] * len(weights_F) for _ in range(n)]
        for f, column in enumerate(columns):
            for group in groups:
                values = [column[i] for i in group]
                mean, std = nanmean(values), nanstd(values) if num_generations > 1 else 0.0
                for i in group:
                    normalized[i][f] = (column[i] - mean) / (std + 1e-4)
        rewards = [
            float("nan") if unscorable[i] else _nansum([r * w for r, w in zip(normalized[i], weights_F, strict=True)])
            for i in range(n)
        ]
        std = nanstd(rewards) if n > 1 else 0.0
        mean = nanmean(rewards)
        advantages = [(r - mean) / (std + 1e-4) for r in rewards]
        zero_std = [math.isclose(std, 0.0, abs_tol=1e-8)] * n
    else:
        rewards = [
            float("nan") if unscorable[i] else _nansum([r * w for r, w in zip(row, weights_F, strict=True)])
            for i, row in enumerate(rewards_per_func_N_F)
        ]
        advantages, zero_std = [0.0] * n, [False] * n
        batch_std = nanstd(rewards) if n > 1 else 0.0
        for group in groups:
            values = [rewards[i] for i in group]
            mean = nanmean(values)
            std = (nanstd(values) if num_generations > 1 else 0.0) if scale_rewards in ("group", "none") else batch_std
            for i in group:
                advantage = rewards[i] - mean
                advantages[i] = advantage if scale_rewards == "none" else advantage / (std + 1e-4)
                zero_std[i] = math.isclose(std, 0.0, abs_tol=1e-8) if not math.isnan(std) else False
    advantages = [0.0 if math.isnan(a) else a for a in advantages]
    return advantages, rewards, sum(zero_std) / max(1, n)

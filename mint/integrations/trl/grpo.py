"""TRL's `GRPOTrainer` over Mint, whose reward functions run here.

No model is loaded in this process. Each step goes through the Tinker primitives of the
official `tinker` SDK: the current weights' sampling client samples `num_generations`
completions per prompt, the reward functions (TRL's signature, called exactly as TRL's
`GRPOTrainer._calculate_rewards` calls them) score them here, group-relative advantages follow
TRL's `scale_rewards`, and one `forward_backward` (Tinker's `ppo` loss with TRL's clip, or
`importance_sampling`) and one `optim_step` train the LoRA adapter on Mint. The prompts are
rendered with the base's own tokenizer and chat template, downloaded from Mint
(`GET /api/v1/tokenizers/<base>`), as TRL renders them with the model's.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mint.integrations.trl.configs import GRPO_REFUSED, NORMALIZERS, GRPOConfig, arg
from mint.integrations.trl.data import Row, chat_ids, dataset_rows, endless_batches, is_conversational, text_ids
from mint.integrations.trl.on_mint import TrainerOnMint
from mint.integrations.trl.rewards import (
    RewardFunc,
    check_reward_funcs,
    group_advantages,
    nanmean,
    nanstd,
    reward_func_name,
)
from mint.integrations.trl.steps import adam_params, loss_inputs, loss_of, scheduled_learning_rate, total_steps

if TYPE_CHECKING:
    pass


@dataclass
class Rollout:
    """One step's completions as the reward functions saw them: each prompt repeated
    `num_generations` times, in TRL's order, with the dataset's other columns alongside."""

    step: int
    prompts: list[Any]
    completions: list[Any]
    completion_ids: list[list[int]]
    columns: dict[str, list[Any]]
    rewards: dict[str, list[float]]
    advantages: list[float] = field(default_factory=list)


async def _awaited(call: Any) -> Any:
    return await call


class GRPOTrainer(TrainerOnMint):
    """TRL's `GRPOTrainer` over Mint (see the module docstring). `reward_funcs` are callables
    with TRL's signature; `train_dataset` is a `datasets.Dataset` or a list of dicts in TRL's
    prompt-only format (`prompt`: a string or a list of messages; other columns are passed to
    the reward functions). `rollouts` keeps every step's prompts, completions and rewards."""

    def __init__(
        self,
        model: str,
        reward_funcs: RewardFunc | list[RewardFunc] | None = None,
        args: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        peft_config: Any = None,
        callbacks: list[Any] | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.args = args if args is not None else GRPOConfig(output_dir=f"{str(model).split('/')[-1]}-GRPO")
        self.reward_funcs = check_reward_funcs(reward_funcs)
        self.reward_func_names = [reward_func_name(func) for func in self.reward_funcs]
        weights = arg(self.args, "reward_weights", None)
        if weights is not None and len(weights) != len(self.reward_funcs):
            raise ValueError(
                f"reward_weights: {len(weights)} weights for {len(self.reward_funcs)} reward functions; "
                "give one per function"
            )
        self.reward_weights = [float(w) for w in weights] if weights is not None else [1.0] * len(self.reward_funcs)
        if eval_dataset is not None:
            raise ValueError("eval_dataset is not supported on Mint; evaluate the saved adapter with `mint evals`")
        self.rows = dataset_rows(train_dataset)
        if not self.rows or "prompt" not in self.rows[0]:
            raise ValueError("train_dataset: TRL's prompt-only format, rows with a `prompt` column")
        self.num_generations = int(arg(self.args, "num_generations", 8))
        completions_per_step = int(
            arg(self.args, "generation_batch_size", None) or arg(self.args, "per_device_train_batch_size", 8)
        )
        if self.num_generations < 2 or completions_per_step % self.num_generations:
            raise ValueError(
                f"num_generations={self.num_generations}: at least 2, and dividing the completions per step "
                f"(generation_batch_size or per_device_train_batch_size, {completions_per_step})"
            )
        self.prompts_per_step = completions_per_step // self.num_generations
        if len(self.rows) < self.prompts_per_step:
            raise ValueError(
                f"train_dataset has {len(self.rows)} rows, fewer than the {self.prompts_per_step} prompts a step takes"
            )
        self._connect(
            model,
            GRPO_REFUSED,
            processing_class=processing_class,
            peft_config=peft_config,
            callbacks=callbacks,
            base_url=base_url,
            api_key=api_key,
        )
        self.rollouts: list[Rollout] = []

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if is_conversational(prompt):
            kwargs = arg(self.args, "chat_template_kwargs", None) or {}
            return chat_ids(self.processing_class, prompt, generation=True, **kwargs)
        return text_ids(self.processing_class, prompt)

    def _decode(self, prompt: Any, ids: list[int]) -> Any:
        text = self.processing_class.decode(ids, skip_special_tokens=True)
        return [{"role": "assistant", "content": text}] if is_conversational(prompt) else text

    def _rewards(
        self,
        inputs: list[Row],
        prompts: list[Any],
        completions: list[Any],
        ids: list[list[int]],
        extra: dict[str, list[Any]],
        metrics: dict[str, float],
    ) -> list[list[float]]:
        """rewards_N_F, each function called as TRL's `_calculate_rewards` calls it."""
        keys = [key for key in inputs[0] if key not in ("prompt", "completion", "completion_ids")]
        kwargs: dict[str, Any] = {key: [row[key] for row in inputs] for key in keys}
        kwargs["trainer_state"] = self.state
        kwargs["log_extra"] = lambda column, values: extra.__setitem__(column, list(values))
        kwargs["log_metric"] = lambda name, value: metrics.__setitem__(name, float(value))
        columns: list[list[float]] = []
        for func, name in zip(self.reward_funcs, self.reward_func_names, strict=True):
            call = func(prompts=prompts, completions=completions, completion_ids=ids, **kwargs)
            output = asyncio.run(_awaited(call)) if inspect.isawaitable(call) else call
            values = [float("nan") if r is None else float(r) for r in output]
            if len(values) != len(prompts):
                raise ValueError(
                    f"The reward function '{name}' returned {len(values)} rewards, but {len(prompts)} were expected "
                    "(one per prompt-completion pair)"
                )
            columns.append(values)
        return [list(row) for row in zip(*columns, strict=True)]

    def train(self) -> Any:
        """The GRPO loop; returns transformers' `TrainOutput(global_step, training_loss, metrics)`."""
        from tinker import types

        args, G = self.args, self.num_generations
        batches_per_epoch = len(self.rows) // self.prompts_per_step
        total = total_steps(args, batches_per_epoch)
        self.state.max_steps, self.state.num_train_epochs = total, math.ceil(total / batches_per_epoch)
        loss_type = str(arg(args, "loss_type", "dapo"))
        normalize = NORMALIZERS[loss_type]
        loss_fn = str(arg(args, "tinker_loss_fn", "ppo"))
        epsilon = float(arg(args, "epsilon", 0.2))
        epsilon_high = arg(args, "epsilon_high", None)
        loss_config = (
            {
                "clip_low_threshold": 1.0 - epsilon,
                "clip_high_threshold": 1.0 + float(epsilon_high if epsilon_high is not None else epsilon),
            }
            if loss_fn == "ppo"
            else None
        )
        scale = arg(args, "scale_rewards", "group")
        scale = {True: "group", False: "none"}.get(scale, scale) if isinstance(scale, bool) else str(scale)
        max_tokens = int(arg(args, "max_completion_length", 512))
        top_k = int(arg(args, "top_k", 0) or 0)
        seed = int(arg(args, "seed", 42))
        batches = endless_batches(
            self.rows, self.prompts_per_step, shuffle=bool(arg(args, "shuffle_dataset", True)), seed=seed
        )
        started, losses = time.monotonic(), []
        self._mint.event("on_train_begin")
        sampler = self.training_client.save_weights_and_get_sampling_client().result()
        for step in range(total):
            step_started = time.monotonic()
            batch = next(batches)
            params = types.SamplingParams(
                max_tokens=max_tokens,
                temperature=float(arg(args, "temperature", 1.0)),
                top_p=float(arg(args, "top_p", 1.0)),
                top_k=top_k if top_k > 0 else -1,
                seed=seed + step,
            )
            prompt_ids_B = [self._prompt_ids(row["prompt"]) for row in batch]
            futures = [sampler.sample(types.ModelInput.from_ints(ids), G, params) for ids in prompt_ids_B]
            sequences_B_G = [list(future.result().sequences) for future in futures]
            # TRL's layout: each prompt repeated G times, its completions in a row.
            inputs = [row for row in batch for _ in range(G)]
            prompts = [row["prompt"] for row in inputs]
            ids_N = [list(seq.tokens) for seqs in sequences_B_G for seq in seqs]
            logprobs_N = [list(seq.logprobs or []) for seqs in sequences_B_G for seq in seqs]
            truncated_N = [seq.stop_reason == "length" for seqs in sequences_B_G for seq in seqs]
            completions = [self._decode(p, ids) for p, ids in zip(prompts, ids_N, strict=True)]
            extra: dict[str, list[Any]] = {}
            step_metrics: dict[str, float] = {}
            rewards_N_F = self._rewards(inputs, prompts, completions, ids_N, extra, step_metrics)
            advantages_N, rewards_N, zero_std = group_advantages(
                rewards_N_F,
                self.reward_weights,
                G,
                scale,
                str(arg(args, "multi_objective_aggregation", "sum_then_normalize")),
            )
            if arg(args, "mask_truncated_completions", False):
                advantages_N = [0.0 if cut else a for a, cut in zip(advantages_N, truncated_N, strict=True)]
            total_tokens = sum(len(ids) for ids in ids_N)
            data = []
            for prompt_ids, ids, logprobs, advantage in zip(
                [p for p in prompt_ids_B for _ in range(G)], ids_N, logprobs_N, advantages_N, strict=True
            ):
                if not ids:
                    continue
                pad = len(prompt_ids) - 1
                token_advantage = advantage * normalize(len(ids), len(ids_N), total_tokens, max_tokens)
                data.append(
                    types.Datum(
                        model_input=types.ModelInput.from_ints([*prompt_ids, *ids[:-1]]),
                        loss_fn_inputs=loss_inputs(
                            {
                                "target_tokens": [*prompt_ids[1:], *ids],
                                "logprobs": [0.0] * pad + logprobs,
                                "advantages": [0.0] * pad + [token_advantage] * len(ids),
                            }
                        ),
                    )
                )
            learning_rate = scheduled_learning_rate(args, step, total)
            output = self.training_client.forward_backward(data, loss_fn, loss_config).result()  # type: ignore[arg-type]
            self.training_client.optim_step(adam_params(args, learning_rate)).result()
            sampler = self.training_client.save_weights_and_get_sampling_client().result()
            loss = loss_of(output)
            losses.append(loss)
            self.state.global_step = step + 1
            self.state.epoch = (step + 1) / batches_per_epoch
            by_func = dict(zip(self.reward_func_names, zip(*rewards_N_F, strict=True), strict=True))
            self.rollouts.append(
                Rollout(
                    step + 1,
                    prompts,
                    completions,
                    ids_N,
                    {**{k: [r[k] for r in inputs] for k in inputs[0] if k != "prompt"}, **extra},
                    {k: list(v) for k, v in by_func.items()},
                    advantages_N,
                )
            )
            logs: dict[str, float] = {"loss": loss, "learning_rate": learning_rate}
            for name, values in by_func.items():
                logs[f"rewards/{name}/mean"] = nanmean(values)
                logs[f"rewards/{name}/std"] = nanstd(values)
            logs["reward"] = nanmean(rewards_N)
            logs["reward_std"] = nanstd(rewards_N)
            logs["frac_reward_zero_std"] = zero_std
            logs["completions/mean_length"] = total_tokens / max(1, len(ids_N))
            logs["completions/clipped_ratio"] = sum(truncated_N) / max(1, len(truncated_N))
            logs.update(step_metrics)
            self._mint.log(logs, step_started)
            self._mint.event("on_step_end")
        return self._mint.finish(losses, started)

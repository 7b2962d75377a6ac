"""TRL's training configs for a model on Mint, and what of them Mint refuses.

The trainers read TRL's field names from either these configs (plain dataclasses: TRL's own
configs insist on a local accelerator, bf16 included) or TRL's own (`trl.GRPOConfig(...)`). The
fields that change what is trained are honoured; those that can't be are refused when set to
anything but a value Mint can do (a ValueError naming the field and the fix: `GRPO_REFUSED`,
`SFT_REFUSED`, `DPO_REFUSED`, checked on either kind of config); the rest are settings of the
local HF Trainer (devices, precision, dataloaders, output folders) with no meaning when the
model is on Mint, and are ignored. Each config's docstring lists what it honours.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class _TrainingArguments:
    """The fields of transformers' TrainingArguments that the trainers read, with TRL's defaults,
    plus the local-runtime ones a TRL script commonly sets (accepted, ignored)."""

    output_dir: str | None = None
    learning_rate: float = 1e-6
    lr_scheduler_type: str = "linear"
    warmup_steps: float = 0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    per_device_train_batch_size: int = 8
    num_train_epochs: float = 3.0
    max_steps: int = -1
    logging_steps: float = 10
    seed: int = 42
    # Refused unless left as they are (see REFUSED).
    gradient_accumulation_steps: int = 1
    eval_strategy: str = "no"
    push_to_hub: bool = False
    # Local runtime: no meaning when the model is on Mint (ignored).
    run_name: str | None = None
    report_to: str | list[str] | None = "none"
    logging_dir: str | None = None
    logging_strategy: str = "steps"
    save_strategy: str = "steps"
    save_steps: float = 500
    bf16: bool | None = None
    fp16: bool = False
    use_cpu: bool = False
    gradient_checkpointing: bool = True
    disable_tqdm: bool | None = None
    remove_unused_columns: bool = False
    model_init_kwargs: dict[str, Any] | None = None
    log_completions: bool = False


@dataclass
class GRPOConfig(_TrainingArguments):
    """TRL's `GRPOConfig` field names and defaults (TRL 1.16), for a model on Mint.

    Honoured: learning_rate, lr_scheduler_type (linear, constant, cosine, constant_with_warmup),
    warmup_steps, adam_beta1/2, adam_epsilon, weight_decay, max_grad_norm,
    per_device_train_batch_size / generation_batch_size (completions per step), num_generations,
    max_completion_length, temperature, top_p, top_k, num_train_epochs / max_steps,
    shuffle_dataset, seed, logging_steps, loss_type (grpo, dapo, bnpo, dr_grpo: Tinker's `ppo`
    loss normalized as TRL normalizes each), epsilon / epsilon_high (the clip), scale_rewards,
    reward_weights, multi_objective_aggregation, mask_truncated_completions. `tinker_loss_fn`
    (Mint's own) picks `ppo` (TRL's clipped objective, the default) or `importance_sampling`.
    """

    num_generations: int = 8
    max_completion_length: int = 512
    generation_batch_size: int | None = None
    steps_per_generation: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    shuffle_dataset: bool = True
    beta: float = 0.0
    num_iterations: int = 1
    epsilon: float = 0.2
    epsilon_high: float | None = None
    importance_sampling_level: str = "token"
    reward_weights: list[float] | None = None
    multi_objective_aggregation: str = "sum_then_normalize"
    scale_rewards: str | bool = "group"
    loss_type: str = "dapo"
    mask_truncated_completions: bool = False
    sync_ref_model: bool = False
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0
    use_vllm: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tinker_loss_fn: str = "ppo"

    def __post_init__(self) -> None:
        refuse_unsupported(self, GRPO_REFUSED)


@dataclass
class SFTConfig(_TrainingArguments):
    """TRL's `SFTConfig` field names and defaults (TRL 1.16), for a model on Mint.

    Honoured, beyond the common training fields: max_length (truncation keeps the start),
    dataset_text_field, completion_only_loss, assistant_only_loss, shuffle_dataset."""

    learning_rate: float = 2e-5
    max_length: int | None = 1024
    dataset_text_field: str = "text"
    completion_only_loss: bool | None = None
    assistant_only_loss: bool = False
    shuffle_dataset: bool = False
    truncation_mode: str = "keep_start"
    packing: bool = False
    loss_type: str = "nll"
    chat_template_kwargs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        refuse_unsupported(self, SFT_REFUSED)


@dataclass
class DPOConfig(_TrainingArguments):
    """TRL's `DPOConfig` field names and defaults (TRL 1.16), for a model on Mint.

    Honoured, beyond the common training fields: beta, label_smoothing, loss_type (sigmoid),
    max_length (truncation keeps the start). The reference model is the starting weights, as
    in TRL with a PEFT adapter; its logprobs come from a sampler of those weights."""

    max_length: int | None = 1024
    beta: float = 0.1
    label_smoothing: float = 0.0
    loss_type: str | list[str] = "sigmoid"
    truncation_mode: str = "keep_start"
    sync_ref_model: bool = False
    padding_free: bool = False
    shuffle_dataset: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        refuse_unsupported(self, DPO_REFUSED)


# TRL's GRPO loss types -> each completion token's weight in the loss: (tokens of this
# completion, completions in the batch, tokens in the batch, max_completion_length) -> scale.
# Tinker's losses sum over tokens, and scaling a token's advantage scales its PPO term exactly.
NORMALIZERS: dict[str, Callable[[int, int, int, int], float]] = {
    "grpo": lambda tokens, n, total, max_len: 1.0 / (max(tokens, 1) * n),
    "dapo": lambda tokens, n, total, max_len: 1.0 / max(total, 1),
    "bnpo": lambda tokens, n, total, max_len: 1.0 / max(total, 1),
    "dr_grpo": lambda tokens, n, total, max_len: 1.0 / (n * max_len),
}


# field -> (is the value one Mint can do?, why not and what to do instead)
Refusals = Mapping[str, tuple[Callable[[Any], bool], str]]

_COMMON_REFUSED: Refusals = {
    "gradient_accumulation_steps": (
        lambda v: v == 1,
        "each step is one forward_backward and one optim_step on Mint; raise per_device_train_batch_size instead",
    ),
    "lr_scheduler_type": (
        lambda v: str(getattr(v, "value", v)) in {"linear", "constant", "cosine", "constant_with_warmup"},
        "Mint's trainers schedule the learning rate as linear, constant, cosine or constant_with_warmup",
    ),
    "eval_strategy": (
        lambda v: str(getattr(v, "value", v)) == "no",
        "evaluation during training is not run; evaluate the saved adapter with `mint evals` afterwards",
    ),
    "push_to_hub": (lambda v: not v, "the weights stay on Mint: save_model() returns their tinker:// path"),
}
GRPO_REFUSED: Refusals = {
    **_COMMON_REFUSED,
    "beta": (
        lambda v: v == 0.0,
        "Mint's RL losses have no KL penalty against a reference model; set beta=0.0 (TRL's default)",
    ),
    "num_iterations": (lambda v: v == 1, "each generation batch is trained on once; set num_iterations=1"),
    "steps_per_generation": (
        lambda v: v in (None, 1),
        "one optimizer step per generation batch; leave steps_per_generation unset",
    ),
    "loss_type": (
        lambda v: v in NORMALIZERS,
        f"Mint maps TRL's loss types {sorted(NORMALIZERS)} onto Tinker's ppo loss",
    ),
    "importance_sampling_level": (lambda v: v == "token", "only token-level importance ratios are mapped"),
    "min_p": (lambda v: v is None, "the Tinker sampler has no min_p; use top_p or top_k"),
    "repetition_penalty": (lambda v: v == 1.0, "the Tinker sampler has no repetition penalty"),
    "sync_ref_model": (lambda v: not v, "there is no reference model (beta is 0)"),
    "top_entropy_quantile": (lambda v: v == 1.0, "every completion token is trained on"),
    "entropy_coef": (lambda v: v == 0.0, "Tinker's ppo loss has no entropy bonus"),
    "scale_rewards": (
        lambda v: v in (True, False, "group", "batch", "none"),
        "scale_rewards is one of 'group', 'batch' or 'none'",
    ),
    "multi_objective_aggregation": (
        lambda v: v in ("sum_then_normalize", "normalize_then_sum"),
        "multi_objective_aggregation is 'sum_then_normalize' or 'normalize_then_sum'",
    ),
    "tinker_loss_fn": (
        lambda v: v in ("ppo", "importance_sampling"),
        "tinker_loss_fn is 'ppo' or 'importance_sampling'",
    ),
}
SFT_REFUSED: Refusals = {
    **_COMMON_REFUSED,
    "packing": (lambda v: not v, "each example is one sequence; set packing=False"),
    "loss_type": (lambda v: v == "nll", "Mint trains SFT with Tinker's cross_entropy (TRL's 'nll')"),
    "truncation_mode": (lambda v: v == "keep_start", "sequences longer than max_length keep their start"),
}
DPO_REFUSED: Refusals = {
    **_COMMON_REFUSED,
    "loss_type": (
        lambda v: v in ("sigmoid", ["sigmoid"], "factory"),
        "Mint's DPOTrainer computes TRL's 'sigmoid' DPO loss only",
    ),
    "sync_ref_model": (lambda v: not v, "the reference is the starting weights"),
    "truncation_mode": (lambda v: v == "keep_start", "sequences longer than max_length keep their start"),
}


def refuse_unsupported(args: Any, refused: Refusals) -> None:
    """ValueError naming the first field set to a value Mint can't train with."""
    for name, (supported, why) in refused.items():
        if hasattr(args, name) and not supported(getattr(args, name)):
            raise ValueError(f"{type(args).__name__}.{name}={getattr(args, name)!r} is not supported on Mint: {why}")


def arg(args: Any, name: str, default: Any) -> Any:
    """Field `name` of a config, this package's or TRL's (`default` where that kind lacks it)."""
    return getattr(args, name, default)

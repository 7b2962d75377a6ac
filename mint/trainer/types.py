"""The trainer's vocabulary, in Tinker's words: data in, options, and results out.

Plain pydantic models over lists of ints and floats, validated once when built, so that the
worker, the Tinker-compatible routes and the recipes share one set of types. No torch here:
a process that only describes work (the API, the SDK) can import this module.

A `Datum` is one sequence for one forward pass. Its `loss_fn_inputs` are per position, each
as long as `model_input`:

- `target_tokens` (int): the token the model should predict at each input position, i.e. the
  input shifted left by one (a datum's last input position predicts its first token after).
- `weights` (float): how much each position counts in `cross_entropy` and `dpo` (0 on prompts).
- `logprobs` (float): logprobs of `target_tokens` under the policy that sampled them
  (`importance_sampling`, `ppo`).
- `advantages` (float): the advantage of each sampled token (0 on prompts).
- `ref_logprobs` (float): reference-model logprobs for `dpo`; computed by the session with the
  adapter disabled when absent.
- `clip_low_threshold`, `clip_high_threshold` (float): per-token clip thresholds of `ppo`,
  `cispo`, `gspo` (and the cap of `stable_reinforce`), in place of the config's.
- `sequence_ratio_mask` (float): the positions `gspo` takes its sequence ratio over (nonzero).
- `sampler_logprobs` (float): what the sampler recorded for `stable_reinforce`: each sampled
  token's logprob under the distribution it was drawn from. The Tinker routes fill it from the
  stability info named by a datum's provenance; a client cannot send it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

StopReason = Literal["length", "stop"]

# loss_fn_inputs keys and whether each holds token ids; anything else is refused, so that a
# misspelt key ("advantage") fails at once instead of being silently ignored by the loss.
LOSS_INPUT_KINDS: dict[str, Literal["tokens", "floats"]] = {
    "target_tokens": "tokens",
    "weights": "floats",
    "logprobs": "floats",
    "advantages": "floats",
    "ref_logprobs": "floats",
    "clip_low_threshold": "floats",
    "clip_high_threshold": "floats",
    "sequence_ratio_mask": "floats",
    "sampler_logprobs": "floats",
}


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Datum(_Frozen):
    """One sequence: input token ids and per-position loss inputs of the same length."""

    model_input: list[int] = Field(min_length=1, description="Input token ids.")
    loss_fn_inputs: dict[str, list[int] | list[float] | list[list[int]] | list[list[float]]] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _aligned(self) -> Datum:
        length = len(self.model_input)
        for key, values in self.loss_fn_inputs.items():
            kind = LOSS_INPUT_KINDS.get(key)
            if kind is None:
                raise ValueError(f"unknown loss_fn_inputs key {key!r}; known: {', '.join(sorted(LOSS_INPUT_KINDS))}")
            if len(values) != length:
                raise ValueError(
                    f"loss_fn_inputs[{key!r}] has {len(values)} values but model_input has {length} tokens; "
                    "every loss input is per position"
                )
            cells = _cells(values)
            if cells is not values and key not in TWO_D_INPUTS:
                raise ValueError(
                    f"loss_fn_inputs[{key!r}] is 2-D; only {' and '.join(sorted(TWO_D_INPUTS))} may be (N, K)"
                )
            if kind == "tokens" and not all(isinstance(value, int) for value in cells):
                raise ValueError(f"loss_fn_inputs[{key!r}] must hold integer token ids")
        widths = {key: self.width_of(key) for key in TWO_D_INPUTS if key in self.loss_fn_inputs}
        if len(set(widths.values())) > 1:
            raise ValueError(
                "loss_fn_inputs 'target_tokens' and 'weights' must have the same shape: "
                + ", ".join(f"{key} has {width or 1} per position" for key, width in sorted(widths.items()))
            )
        return self

    def width_of(self, key: str) -> int | None:
        """K for an input given as (N, K) (every row as long), None for one given as (N,)."""
        values = self.loss_fn_inputs[key]
        if not values or not isinstance(values[0], list):
            return None
        widths = {len(row) for row in values if isinstance(row, list)}
        if len(widths) != 1 or len(values) != sum(isinstance(row, list) for row in values) or 0 in widths:
            raise ValueError(f"loss_fn_inputs[{key!r}] must be (N,) or (N, K) with K >= 1 in every row")
        return widths.pop()

    @property
    def length(self) -> int:
        return len(self.model_input)

    @property
    def targets_per_position(self) -> int | None:
        """K when `target_tokens` is (N, K) (K candidates scored at each position), else None."""
        return self.width_of("target_tokens") if "target_tokens" in self.loss_fn_inputs else None

    @property
    def target_tokens(self) -> list[int] | list[list[int]]:
        """The next-token targets, (N,) or (N, K); a datum without them cannot be scored."""
        targets = self.loss_fn_inputs.get("target_tokens")
        if targets is None:
            raise ValueError("this datum has no loss_fn_inputs['target_tokens']")
        return targets  # type: ignore[return-value]  # validated as integer ids


# The inputs that may be (N, K): K target tokens per position, each with its weight, for
# `cross_entropy` against a distribution (distillation from a teacher's top-k).
TWO_D_INPUTS = frozenset({"target_tokens", "weights"})


def _cells(values: list[object]) -> list[object]:
    """An input's cells, flattened when it is given as rows (the same list when it is flat)."""
    if any(isinstance(value, list) for value in values):
        return [cell for row in values for cell in (row if isinstance(row, list) else [row])]
    return values


class LoraOptions(_Frozen):
    """What one session's adapter adapts, as Tinker's `LoraConfig` plus Mint's expert switch.

    `None` takes the base's default (its registry `lora:` block). The switches pick targets
    from the base model's structure (see `mint.trainer.lora`); `target_modules` and
    `target_parameters`, when given, replace what the switches would pick for modules
    (attention, dense MLPs, unembedding) and for parameters (fused experts, MLPs of MoE bases).
    """

    rank: int | None = Field(default=None, ge=1, le=1024)
    # None keeps the base's alpha/rank ratio, so a new rank keeps the same update scale.
    alpha: float | None = Field(default=None, gt=0)
    dropout: float | None = Field(default=None, ge=0.0, lt=1.0)
    train_attn: bool = True
    train_mlp: bool = Field(default=True, description="Dense and shared-expert MLPs (the router is never adapted).")
    train_unembed: bool = True
    train_experts: bool = Field(default=True, description="Routed experts' fused weights (MoE bases only).")
    seed: int | None = Field(default=None, ge=0, description="Seeds LoRA A's init: the same seed, the same adapter.")
    target_modules: list[str] | None = None
    target_parameters: list[str] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> LoraOptions:
        # peft's parameter wrapper has no dropout path and refuses lora_dropout > 0.
        if self.target_parameters and self.dropout:
            raise ValueError(
                "dropout must be 0 when target_parameters are given (peft's parameter LoRA has no dropout)"
            )
        if self.target_modules is not None and not all(self.target_modules):
            raise ValueError("target_modules must not contain empty names")
        if self.target_parameters is not None and not all(self.target_parameters):
            raise ValueError("target_parameters must not contain empty names")
        switches = self.train_attn or self.train_mlp or self.train_unembed or self.train_experts
        if not switches and not self.target_modules and not self.target_parameters:
            raise ValueError("nothing to train: turn on one of train_attn/train_mlp/train_unembed/train_experts")
        return self


class AdamParams(_Frozen):
    """Per-step AdamW hyperparameters, with Tinker's defaults."""

    learning_rate: float = Field(default=1e-4, ge=0.0)
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-12, gt=0.0)
    # Decoupled: each step multiplies the weights by (1 - learning_rate * weight_decay).
    weight_decay: float = Field(default=0.0, ge=0.0)
    # Largest global gradient norm; 0 means no clipping.
    grad_clip_norm: float = Field(default=0.0, ge=0.0)


class SamplingParams(_Frozen):
    """How to sample. `stop=None` stops at the model's end-of-sequence tokens; a list replaces them
    (token ids, or strings checked on the decoded text); `[]` never stops before `max_tokens`."""

    max_tokens: int | None = Field(default=None, ge=1, description="None: up to the base's context length.")
    temperature: float = Field(default=1.0, ge=0.0, description="0 samples greedily.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, description="-1: no limit.")
    stop: list[int] | list[str] | None = None
    seed: int | None = Field(default=None, ge=0)

    @field_validator("stop", mode="before")
    @classmethod
    def _one_string(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("stop")
    @classmethod
    def _no_empty_strings(cls, value: list[int] | list[str] | None) -> list[int] | list[str] | None:
        if value and any(isinstance(item, str) and not item for item in value):
            raise ValueError("stop strings must not be empty")
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError("top_k must be -1 (no limit) or at least 1")
        return value


@dataclass(frozen=True)
class SampleRequest:
    """One prompt of a sampling batch: `num_samples` continuations of `prompt_tokens` under `params`.

    Every request of a batch has its own parameters, seed and stop rule, and its samples do not
    depend on what else is in the batch. The adapter is named once for the whole batch
    (`ResidentBase.sample_batch`); a field naming a request's own adapter would go here.
    A plain dataclass, not a model: it is built per prompt and per turn inside RL loops, and
    `SamplingParams` is already validated.
    """

    prompt_tokens: Sequence[int]
    params: SamplingParams
    num_samples: int = 1
    # The k most likely tokens to report at each sampled position, with their logprobs (0: none).
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        # A tuple, so that the request is immutable however the caller held its prompt.
        object.__setattr__(self, "prompt_tokens", tuple(int(token) for token in self.prompt_tokens))


class SampledSequence(_Frozen):
    """Generated tokens and their logprobs under the model's own (temperature 1) distribution.

    The token that stopped the sequence (a stop token id, or the token that completed a stop
    string) is included. `sampler_logprobs` are each token's logprob under the distribution it
    was actually drawn from (temperature, top-k, top-p applied; 0 when greedy): the stability
    info `stable_reinforce` weighs against.
    """

    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason
    sampler_logprobs: list[float] | None = None
    # With `SampleRequest.top_logprobs` k: at each position, the k most likely tokens and their
    # logprobs under the same distribution as `logprobs`, most likely first.
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # The version of the weights that generated it: `TrainingSession.version` of the adapter,
    # or "base" (every adapter disabled). Stamped by `ResidentBase.sample_batch`.
    adapter_version: str | None = None
    # Tokens of its prompt read from the prompt cache rather than run (`mint.trainer.prompt_cache`);
    # the same for every sample of one request.
    prompt_cache_hit_tokens: int = 0

    @model_validator(mode="after")
    def _aligned(self) -> SampledSequence:
        if len(self.tokens) != len(self.logprobs):
            raise ValueError("tokens and logprobs must have the same length")
        for name in ("sampler_logprobs", "top_logprobs"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.tokens):
                raise ValueError(f"tokens and {name} must have the same length")
        return self


def check_metric_name(name: str) -> str:
    """Tinker's rule: a metric key is `name:reduction`, with exactly one ':' (e.g. `loss:sum`)."""
    if name.count(":") != 1 or name.startswith(":") or name.endswith(":"):
        raise ValueError(f"metric key {name!r} must have exactly one ':' between a name and a reduction, e.g. 'x:mean'")
    return name


class ForwardOutput(_Frozen):
    """Per-datum logprobs of the target tokens, and metrics such as `loss:sum`."""

    # Per datum: (N,) logprobs, or (N, K) for a datum with K target tokens per position.
    logprobs: list[list[float] | list[list[float]]]
    metrics: dict[str, float] = Field(default_factory=dict)

    @field_validator("metrics")
    @classmethod
    def _metric_names(cls, metrics: dict[str, float]) -> dict[str, float]:
        for name in metrics:
            check_metric_name(name)
        return metrics


def close_environment(env: object) -> None:
    """Tell an environment that holds an episode elsewhere (an environment server's) that its
    episode ends here, before the environment ended it; others have no `close` and need none."""
    close = getattr(env, "close", None)
    if callable(close):
        close()

"""Built-in losses over per-token logprobs, looked up by name in a closed registry.

Every loss takes one logprob tensor per datum (`logprobs_T`, float32, the logprob of each
target token under the adapter being trained), the datum's loss inputs as tensors of the same
length, and a resolved config; it returns a scalar to minimise and metrics. Losses are SUMS over
tokens (and over pairs for DPO), as in Tinker: normalise by putting 1/N in the weights or
advantages, or by scaling the learning rate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from mint.errors import InvalidRequest

LossInputs = Mapping[str, torch.Tensor]
LossResult = tuple[torch.Tensor, dict[str, float]]
LossFn = Callable[[Sequence[torch.Tensor], Sequence[LossInputs], Mapping[str, float]], LossResult]


@dataclass(frozen=True)
class Loss:
    """A registry entry: the function, the loss inputs it needs, and its config keys with defaults."""

    name: str
    fn: LossFn
    required_inputs: frozenset[str]
    defaults: Mapping[str, float] = field(default_factory=dict)
    # DPO compares with the base model: the session fills `ref_logprobs` with the adapter disabled.
    needs_reference: bool = False

    def resolve_config(self, config: Mapping[str, float] | None) -> dict[str, float]:
        """Defaults overlaid with `config`; unknown keys are refused with the known ones listed."""
        given = dict(config or {})
        unknown = sorted(set(given) - set(self.defaults))
        if unknown:
            known = ", ".join(sorted(self.defaults)) or "(none)"
            raise InvalidRequest(
                f"loss {self.name!r} takes no config key {', '.join(unknown)}; known: {known}", param="loss_fn_config"
            )
        return {**self.defaults, **{key: float(value) for key, value in given.items()}}


LOSSES: dict[str, Loss] = {}


def register_loss(loss: Loss) -> Loss:
    """Add a loss to the closed registry; a second loss under the same name is refused."""
    if loss.name in LOSSES:
        raise ValueError(f"loss {loss.name!r} is already registered")
    LOSSES[loss.name] = loss
    return loss


def get_loss(name: str) -> Loss:
    """The registered loss called `name`, or InvalidRequest naming the known ones."""
    loss = LOSSES.get(name)
    if loss is None:
        raise InvalidRequest(f"unknown loss {name!r}; known: {', '.join(sorted(LOSSES))}", param="loss_fn")
    return loss


def _weights(inputs: LossInputs, logprobs_T: torch.Tensor) -> torch.Tensor:
    weights = inputs.get("weights")
    return torch.ones_like(logprobs_T) if weights is None else weights


# ---- the losses ---------------------------------------------------------------------------------


def cross_entropy(
    logprobs: Sequence[torch.Tensor], inputs: Sequence[LossInputs], config: Mapping[str, float]
) -> LossResult:
    """Weighted negative log-likelihood of the target tokens.

        L = - sum_i sum_t w_it * logp_it

    `weights` default to 1. Negative weights are allowed: that is how a custom loss's gradient
    comes back as a linear pass (w = -dC/dlogp).
    """
    per_datum = [-(_weights(x, lp) * lp).sum() for lp, x in zip(logprobs, inputs, strict=True)]
    return torch.stack(per_datum).sum(), {}


def importance_sampling(
    logprobs: Sequence[torch.Tensor], inputs: Sequence[LossInputs], config: Mapping[str, float]
) -> LossResult:
    """REINFORCE with an importance ratio for the gap between the sampler and the learner.

        L = - sum_i sum_t exp(logp_it - q_it) * A_it

    where q are the sampling logprobs (`logprobs`) and A the `advantages` (0 on prompt tokens).
    Its gradient is - sum ratio * A * grad logp, so a positive advantage raises the token's logprob.
    """
    per_datum = [
        -(torch.exp(lp - x["logprobs"]) * x["advantages"]).sum() for lp, x in zip(logprobs, inputs, strict=True)
    ]
    return torch.stack(per_datum).sum(), {}


def ppo(logprobs: Sequence[torch.Tensor], inputs: Sequence[LossInputs], config: Mapping[str, float]) -> LossResult:
    """PPO's clipped surrogate, with Tinker's thresholds on the ratio itself.

        r = exp(logp - q),   L = - sum_i sum_t min(r * A, clip(r, low, high) * A)

    `clip_low_threshold` (default 0.8) and `clip_high_threshold` (1.2) bound the ratio. Where the
    clipped term is the smaller one (r > high with A > 0, r < low with A < 0) the token's gradient is 0.
    """
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    if not 0.0 <= low <= 1.0 <= high:
        raise InvalidRequest(
            f"ppo needs 0 <= clip_low_threshold <= 1 <= clip_high_threshold; got {low} and {high}",
            param="loss_fn_config",
        )
    per_datum: list[torch.Tensor] = []
    clipped, counted = 0.0, 0
    for lp, x in zip(logprobs, inputs, strict=True):
        advantages = x["advantages"]
        ratio = torch.exp(lp - x["logprobs"])
        unclipped_T = ratio * advantages
        clipped_T = ratio.clamp(low, high) * advantages
        per_datum.append(-torch.minimum(unclipped_T, clipped_T).sum())
        active = advantages != 0
        clipped += float(((clipped_T < unclipped_T) & active).sum())
        counted += int(active.sum())
    return torch.stack(per_datum).sum(), {"clip_fraction:mean": clipped / counted if counted else 0.0}


def dpo(logprobs: Sequence[torch.Tensor], inputs: Sequence[LossInputs], config: Mapping[str, float]) -> LossResult:
    """Direct preference optimisation over consecutive (chosen, rejected) pairs of data.

        s = sum_t w_t * logp_t (the completion's logprob; `weights` mark completion tokens)
        m_k = beta * ((s_chosen - s_chosen_ref) - (s_rejected - s_rejected_ref))
        L = - sum_k log sigmoid(m_k)

    `ref_logprobs` are the reference model's (the base: the same model with the adapter
    disabled). `beta` (default 0.1) is in the config. Metrics: the share of pairs with m_k > 0
    (`dpo_accuracy:mean`) and the mean margin m_k (`dpo_margin:mean`).
    """
    if len(logprobs) % 2:
        raise InvalidRequest(
            f"dpo takes (chosen, rejected) pairs of consecutive data; got an odd number ({len(logprobs)})", param="data"
        )
    beta = config["beta"]
    log_ratios = torch.stack(
        [(_weights(x, lp) * (lp - x["ref_logprobs"])).sum() for lp, x in zip(logprobs, inputs, strict=True)]
    )
    margins_K = beta * (log_ratios[0::2] - log_ratios[1::2])
    loss = -F.logsigmoid(margins_K).sum()
    detached_K = margins_K.detach()
    return loss, {
        "dpo_accuracy:mean": float((detached_K > 0).float().mean()),
        "dpo_margin:mean": float(detached_K.mean()),
        "dpo_chosen_reward:mean": float(beta * log_ratios[0::2].detach().mean()),
        "dpo_rejected_reward:mean": float(beta * log_ratios[1::2].detach().mean()),
    }


register_loss(Loss("cross_entropy", cross_entropy, frozenset({"target_tokens"})))
register_loss(Loss("importance_sampling", importance_sampling, frozenset({"target_tokens", "logprobs", "advantages"})))
register_loss(
    Loss(
        "ppo",
        ppo,
        frozenset({"target_tokens", "logprobs", "advantages"}),
        defaults={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    )
)
register_loss(Loss("dpo", dpo, frozenset({"target_tokens"}), defaults={"beta": 0.1}, needs_reference=True))

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
from mint.schemas.losses import LOSS_CONFIG_DEFAULTS, resolve_config

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
    # How many consecutive data one term of the sum reads (DPO: a chosen and a rejected datum);
    # a batch split over a worker group's ranks (`data_parallel`) never separates them.
    data_per_term: int = 1

    def resolve_config(self, config: Mapping[str, float] | None) -> dict[str, float]:
        """Defaults overlaid with `config`; unknown keys are refused with the known ones listed."""
        return resolve_config(self.name, self.defaults, config)


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


def policy_metrics(logprobs: Sequence[torch.Tensor], inputs: Sequence[LossInputs]) -> dict[str, float]:
    """What an RL step shows besides its loss, over the tokens with an advantage (the sampled
    ones), the same for every policy-gradient loss:

        kl_sample_train = mean(q - logp)    how far the learner moved from the sampler (k1 estimate)
        entropy = mean(-logp)               the learner's surprise at the sampled tokens

    q is the sampling logprobs a loss weighs against (`logprobs`, else `sampler_logprobs`). A
    Tinker RL loop gets them in `forward_backward`'s metrics, as a job's RL steps report them;
    a loss without advantages (cross entropy, DPO) gets none."""
    gaps, surprises = [], []
    for lp, x in zip(logprobs, inputs, strict=True):
        sampled = x.get("logprobs", x.get("sampler_logprobs"))
        if "advantages" not in x or sampled is None:
            return {}
        active = x["advantages"] != 0
        gaps.append((sampled - lp.detach())[active])
        surprises.append(-lp.detach()[active])
    gap, surprise = torch.cat(gaps), torch.cat(surprises)
    if not gap.numel():
        return {}
    return {"kl_sample_train:mean": float(gap.mean()), "entropy:mean": float(surprise.mean())}


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


def _clip_bounds(x: LossInputs, config: Mapping[str, float], like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clip thresholds: the datum's `clip_low_threshold`/`clip_high_threshold` loss
    inputs where given (Tinker's per-token thresholds), else the config's value at every position."""
    low = x.get("clip_low_threshold")
    high = x.get("clip_high_threshold")
    low_T = torch.full_like(like, config["clip_low_threshold"]) if low is None else low
    high_T = torch.full_like(like, config["clip_high_threshold"]) if high is None else high
    return low_T, high_T


def _check_band(name: str, low_T: torch.Tensor, high_T: torch.Tensor, *, around_one: bool) -> None:
    """Refuse thresholds that make no band: low > high, a negative low, or (for the PPO family,
    whose band must hold the on-policy ratio 1) a band that leaves 1 out."""
    bad = (low_T < 0) | (low_T > high_T)
    if around_one:
        bad |= (low_T > 1) | (high_T < 1)
    if bool(bad.any()):
        position = int(bad.nonzero()[0, 0])
        rule = "0 <= clip_low_threshold <= 1 <= clip_high_threshold" if around_one else "0 <= low <= high"
        raise InvalidRequest(
            f"{name} needs {rule}; got {float(low_T[position])} and {float(high_T[position])} at position {position}",
            param="loss_fn_config",
        )


def _clip_fraction(clipped: float, counted: int) -> dict[str, float]:
    return {"clip_fraction:mean": clipped / counted if counted else 0.0}


def ppo(logprobs: Sequence[torch.Tensor], inputs: Sequence[LossInputs], config: Mapping[str, float]) -> LossResult:
    """PPO's clipped surrogate, with Tinker's thresholds on the ratio itself.

        r = exp(logp - q),   L = - sum_i sum_t min(r * A, clip(r, low_t, high_t) * A)

    `clip_low_threshold` (default 0.8) and `clip_high_threshold` (1.2) bound the ratio, from the
    config or per token from the loss inputs of the same names. Where the clipped term is the
    smaller one (r > high with A > 0, r < low with A < 0) the token's gradient is 0.
    Source: Schulman et al. 2017; tinker-docs "Loss Functions", ppo.
    """
    per_datum: list[torch.Tensor] = []
    clipped, counted = 0.0, 0
    for lp, x in zip(logprobs, inputs, strict=True):
        advantages = x["advantages"]
        low_T, high_T = _clip_bounds(x, config, lp)
        _check_band("ppo", low_T, high_T, around_one=True)
        ratio = torch.exp(lp - x["logprobs"])
        unclipped_T = ratio * advantages
        clipped_T = torch.minimum(torch.maximum(ratio, low_T), high_T) * advantages
        per_datum.append(-torch.minimum(unclipped_T, clipped_T).sum())
        active = advantages != 0
        clipped += float(((clipped_T < unclipped_T) & active).sum())
        counted += int(active.sum())
    return torch.stack(per_datum).sum(), _clip_fraction(clipped, counted)


def cispo(logprobs: Sequence[torch.Tensor], inputs: Sequence[LossInputs], config: Mapping[str, float]) -> LossResult:
    """CISPO: the clipped importance ratio, detached, as the coefficient of the policy gradient.

        r = exp(logp - q),   L = - sum_i sum_t sg(clip(r, low_t, high_t)) * logp * A

    Unlike PPO no token's gradient is ever zeroed; the clip only bounds its coefficient.
    Defaults are Tinker's one-sided clip, `clip_low_threshold` 0 and `clip_high_threshold` 4
    (config, or per token as loss inputs). Source: Chen et al. 2025 (MiniMax-M1);
    tinker-docs "Loss Functions", cispo.
    """
    per_datum: list[torch.Tensor] = []
    clipped, counted = 0.0, 0
    for lp, x in zip(logprobs, inputs, strict=True):
        advantages = x["advantages"]
        low_T, high_T = _clip_bounds(x, config, lp)
        _check_band("cispo", low_T, high_T, around_one=False)
        ratio = torch.exp(lp.detach() - x["logprobs"])
        coefficient = torch.minimum(torch.maximum(ratio, low_T), high_T)
        per_datum.append(-(coefficient * lp * advantages).sum())
        active = advantages != 0
        clipped += float(((coefficient != ratio) & active).sum())
        counted += int(active.sum())
    return torch.stack(per_datum).sum(), _clip_fraction(clipped, counted)


def dro(logprobs: Sequence[torch.Tensor], inputs: Sequence[LossInputs], config: Mapping[str, float]) -> LossResult:
    """Direct reward optimisation: the policy gradient with a quadratic penalty on the log-ratio.

        L = - sum_i sum_t ( logp * A - 1/2 * beta * w_t * (logp - q)^2 )

    `beta` (default 0.05) weighs the penalty. As in Tinker, the penalty covers every position;
    Mint also reads `weights` (default 1) as the penalty's per-position weight, so that prompt
    positions, whose `logprobs` are padding, can be left out (w = 0). The advantages are the
    client's soft (DRO) ones. Source: Richemond et al. 2024; Kimi Team 2025; tinker-docs
    "Loss Functions", dro.
    """
    beta = config["beta"]
    if beta < 0:
        raise InvalidRequest(f"dro needs beta >= 0; got {beta}", param="loss_fn_config")
    per_datum = [
        -(lp * x["advantages"] - 0.5 * beta * _weights(x, lp) * (lp - x["logprobs"]) ** 2).sum()
        for lp, x in zip(logprobs, inputs, strict=True)
    ]
    return torch.stack(per_datum).sum(), {}


def gspo(logprobs: Sequence[torch.Tensor], inputs: Sequence[LossInputs], config: Mapping[str, float]) -> LossResult:
    """GSPO-token: PPO's clipped surrogate on the sequence's importance ratio.

        log s  = mean_{t in M} (logp_t - q_t)                (the geometric mean of the ratios)
        s_t    = sg(s) * p_t / sg(p_t)                        (s's value, the token's own gradient)
        L      = - sum_i sum_t min(s_t * A_t, clip(s_t, low_t, high_t) * A_t)

    M is the positions where `sequence_ratio_mask` is nonzero; without the mask, those with a
    nonzero advantage (the sampled tokens; the cookbook's generic RL loop sends no mask). A
    datum with an empty M has s = 1. The band defaults to the GSPO paper's (1 - 3e-4,
    1 + 4e-4), from the config or per token as loss inputs. Source: Zheng et al. 2025;
    tinker-docs "Loss Functions", gspo.
    """
    per_datum: list[torch.Tensor] = []
    clipped, counted = 0.0, 0
    for lp, x in zip(logprobs, inputs, strict=True):
        advantages = x["advantages"]
        low_T, high_T = _clip_bounds(x, config, lp)
        _check_band("gspo", low_T, high_T, around_one=True)
        mask = x.get("sequence_ratio_mask")
        in_ratio = (mask != 0) if mask is not None else (advantages != 0)
        log_ratio_T = lp.detach() - x["logprobs"]
        log_s = log_ratio_T[in_ratio].mean() if bool(in_ratio.any()) else lp.new_zeros(())
        ratio = torch.exp(log_s + lp - lp.detach())
        unclipped_T = ratio * advantages
        clipped_T = torch.minimum(torch.maximum(ratio, low_T), high_T) * advantages
        per_datum.append(-torch.minimum(unclipped_T, clipped_T).sum())
        active = advantages != 0
        clipped += float(((clipped_T < unclipped_T) & active).sum())
        counted += int(active.sum())
    return torch.stack(per_datum).sum(), _clip_fraction(clipped, counted)


def stable_reinforce(
    logprobs: Sequence[torch.Tensor], inputs: Sequence[LossInputs], config: Mapping[str, float]
) -> LossResult:
    """StableReinforce, as Mint defines it: REINFORCE with a truncated, detached importance
    weight against what the sampler recorded, and an optional trust term towards the sampler.

        mu_t = `sampler_logprobs`: the logprob of the sampled token under the distribution it
               was actually drawn from (temperature, top-k and top-p applied), recorded by the
               server when it sampled (`record_stability_info`), never sent by the client
        r_t  = exp(logp_t - mu_t)
        L    = - sum_i sum_t sg(min(r_t, c_t)) * A_t * logp_t
               + kl_coeff * sum_i sum_{t: A_t != 0} 1/2 * (logp_t - mu_t)^2

    `clip_high_threshold` c (default 2, per token as a loss input too) caps the weight, so a
    token the sampler drew far more rarely than the learner would cannot blow the step up, and
    no token's gradient is zeroed. `kl_coeff` (default 0) pulls the learner's logprobs of the
    trained tokens back towards the sampler's. Tinker's StableReinforce (alpha) publishes its
    interface (stability info recorded at sampling, named by provenance spans) but not its
    formula; this is truncated importance sampling (Ionides 2008; Yao et al. 2025, "Your
    efficient RL framework secretly brings you off-policy RL training") with DRO's quadratic
    penalty (Richemond et al. 2024) as the trust term. Advantages belong on sampled tokens only.
    """
    kl_coeff = config["kl_coeff"]
    if kl_coeff < 0:
        raise InvalidRequest(f"stable_reinforce needs kl_coeff >= 0; got {kl_coeff}", param="loss_fn_config")
    per_datum: list[torch.Tensor] = []
    clipped, counted, squared = 0.0, 0, 0.0
    for lp, x in zip(logprobs, inputs, strict=True):
        advantages, sampler = x["advantages"], x["sampler_logprobs"]
        high = x.get("clip_high_threshold")
        cap_T = torch.full_like(lp, config["clip_high_threshold"]) if high is None else high
        if bool((cap_T <= 0).any()):
            raise InvalidRequest("stable_reinforce needs clip_high_threshold > 0", param="loss_fn_config")
        ratio = torch.exp(lp.detach() - sampler)
        weight = torch.minimum(ratio, cap_T)
        active = advantages != 0
        penalty_T = 0.5 * (lp - sampler) ** 2 * active
        per_datum.append(-(weight * advantages * lp).sum() + kl_coeff * penalty_T.sum())
        clipped += float(((ratio > cap_T) & active).sum())
        counted += int(active.sum())
        squared += float(penalty_T.detach().sum())
    metrics = _clip_fraction(clipped, counted) | {"sampler_kl:mean": squared / counted if counted else 0.0}
    return torch.stack(per_datum).sum(), metrics


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


_RL_INPUTS = frozenset({"target_tokens", "logprobs", "advantages"})
for _name, _fn, _inputs in (
    ("cross_entropy", cross_entropy, frozenset({"target_tokens"})),
    ("importance_sampling", importance_sampling, _RL_INPUTS),
    ("ppo", ppo, _RL_INPUTS),
    ("cispo", cispo, _RL_INPUTS),
    ("dro", dro, _RL_INPUTS),
    ("gspo", gspo, _RL_INPUTS),
    ("stable_reinforce", stable_reinforce, frozenset({"target_tokens", "advantages", "sampler_logprobs"})),
):
    register_loss(Loss(_name, _fn, _inputs, defaults=LOSS_CONFIG_DEFAULTS[_name]))
register_loss(
    Loss(
        "dpo",
        dpo,
        frozenset({"target_tokens"}),
        defaults=LOSS_CONFIG_DEFAULTS["dpo"],
        needs_reference=True,
        data_per_term=2,
    )
)

"""The built-in losses: registry rules, the maths on plain tensors, and the direction of their
gradients through a real session (a few steps move the quantity each loss should move)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from mint.errors import InvalidRequest
from mint.schemas.losses import LOSS_CONFIG_DEFAULTS
from mint.trainer.losses import LOSSES, Loss, cross_entropy, get_loss, gspo, ppo, register_loss
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import TrainingSession
from mint.trainer.types import AdamParams, Datum

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

ADAM = AdamParams(learning_rate=1e-2)


def weighted_logprob(output_logprobs: list[list[float]], data: list[Datum], key: str = "weights") -> float:
    return sum(
        w * lp
        for datum, row in zip(data, output_logprobs, strict=True)
        for w, lp in zip(datum.loss_fn_inputs[key], row, strict=True)
    )


# ---- registry ---------------------------------------------------------------------------------


def test_registry_is_closed_and_names_the_known_losses() -> None:
    assert set(LOSSES) == {
        "cross_entropy",
        "importance_sampling",
        "ppo",
        "cispo",
        "dro",
        "gspo",
        "stable_reinforce",
        "dpo",
    }
    # The torch-free table the API checks job configs with is the registry's.
    assert {name: loss.defaults for name, loss in LOSSES.items()} == LOSS_CONFIG_DEFAULTS
    with pytest.raises(ValueError, match="already registered"):
        register_loss(Loss("cross_entropy", cross_entropy, frozenset()))
    with pytest.raises(InvalidRequest) as error:
        get_loss("reinforce")
    assert error.value.param == "loss_fn"
    assert all(name in error.value.message for name in LOSSES)
    with pytest.raises(InvalidRequest, match="clip_low_threshold"):
        get_loss("ppo").resolve_config({"clip_ratio": 0.2})
    assert get_loss("dpo").resolve_config(None) == {"beta": 0.1}


def test_missing_loss_inputs_are_refused_naming_the_datum(
    open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    session = open_session(train_mlp=False, train_experts=False)
    with pytest.raises(InvalidRequest, match=r"data\[0\].*advantages"):
        session.forward_backward(toy_data, "importance_sampling")
    with pytest.raises(InvalidRequest, match="odd"):
        session.forward_backward(toy_data, "dpo")


# ---- the maths on tensors -----------------------------------------------------------------------


def test_ppo_clips_outside_the_band_and_follows_the_config() -> None:
    # ratio = exp(logp - q): 1.5 (A>0: clipped), 1.0 (inside), 0.5 (A<0: clipped), 0.5 (A>0: pessimistic, kept)
    ratios = torch.tensor([1.5, 1.0, 0.5, 0.5])
    advantages = torch.tensor([1.0, 1.0, -1.0, 1.0])
    sampling = torch.zeros(4)

    def grad(config: dict[str, float]) -> torch.Tensor:
        logprobs = ratios.log().clone().requires_grad_(True)
        loss, _ = ppo(
            [logprobs], [{"logprobs": sampling, "advantages": advantages}], get_loss("ppo").resolve_config(config)
        )
        loss.backward()
        assert logprobs.grad is not None
        return logprobs.grad

    default = grad({})
    assert default[0] == 0 and default[2] == 0  # outside the band on the clipped side: no gradient
    assert torch.allclose(default[[1, 3]], torch.tensor([-1.0, -0.5]))  # d(-r*A)/dlogp = -r*A
    wide = grad({"clip_high_threshold": 2.0})
    assert wide[0] == pytest.approx(-1.5)
    with pytest.raises(InvalidRequest):
        get_loss("ppo").fn(
            [ratios.log()],
            [{"logprobs": sampling, "advantages": advantages}],
            {
                "clip_low_threshold": 1.1,
                "clip_high_threshold": 1.2,
            },
        )


# ---- each loss against a reference written from its formula, on random tensors ---------------
#
# The references below are written from the published formulas (tinker-docs "Loss Functions";
# GSPO-token, Zheng et al. 2025; Mint's StableReinforce), one token at a time in plain Python
# where the loss is per token, so they share no code with the vectorised losses. Values and
# gradients must agree to 1e-6, in float64.

T = 9


def random_batch(
    seed: int, *, per_token_clip: bool = False
) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Two data of T positions: learner logprobs (leaves), sampler logprobs near them,
    advantages of both signs with zeros (prompt positions), and the other inputs."""
    generator = torch.Generator().manual_seed(seed)

    def uniform(low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(T, generator=generator, dtype=torch.float64)

    logprobs, inputs = [], []
    for _ in range(2):
        lp = -uniform(0.05, 3.0)
        advantages = torch.randn(T, generator=generator, dtype=torch.float64)
        advantages[:3] = 0.0  # the prompt
        x = {
            "logprobs": lp + uniform(-0.6, 0.6),  # ratios from about 0.55 to 1.8: some clipped, some not
            "advantages": advantages,
            "weights": (torch.arange(T) >= 3).double(),
            "sequence_ratio_mask": (torch.arange(T) >= 3).double(),
        }
        x["sampler_logprobs"] = x["logprobs"] + uniform(-0.3, 0.3)
        if per_token_clip:
            x["clip_low_threshold"] = uniform(0.5, 1.0)
            x["clip_high_threshold"] = uniform(1.0, 1.6)
        logprobs.append(lp.clone().requires_grad_(True))
        inputs.append(x)
    return logprobs, inputs


def _band(x: dict[str, torch.Tensor], config: dict[str, float], t: int) -> tuple[float, float]:
    if "clip_low_threshold" in x:
        return float(x["clip_low_threshold"][t]), float(x["clip_high_threshold"][t])
    return config["clip_low_threshold"], config["clip_high_threshold"]


def ref_importance_sampling(lps, xs, config):  # type: ignore[no-untyped-def]
    return sum(
        -torch.exp(lp[t] - x["logprobs"][t]) * x["advantages"][t]
        for lp, x in zip(lps, xs, strict=True)
        for t in range(T)
    )


def ref_ppo(lps, xs, config):  # type: ignore[no-untyped-def]
    total = 0.0
    for lp, x in zip(lps, xs, strict=True):
        for t in range(T):
            low, high = _band(x, config, t)
            r = torch.exp(lp[t] - x["logprobs"][t])
            a = x["advantages"][t]
            total = total - torch.min(r * a, min(max(r, low), high) * a)
    return total


def ref_cispo(lps, xs, config):  # type: ignore[no-untyped-def]
    total = 0.0
    for lp, x in zip(lps, xs, strict=True):
        for t in range(T):
            low, high = _band(x, config, t)
            r = math.exp(float(lp[t]) - float(x["logprobs"][t]))  # a number: the stop-gradient
            total = total - min(max(r, low), high) * lp[t] * x["advantages"][t]
    return total


def ref_dro(lps, xs, config):  # type: ignore[no-untyped-def]
    beta = config["beta"]
    return sum(
        -(lp[t] * x["advantages"][t] - beta / 2 * x["weights"][t] * (lp[t] - x["logprobs"][t]) ** 2)
        for lp, x in zip(lps, xs, strict=True)
        for t in range(T)
    )


def ref_gspo(lps, xs, config):  # type: ignore[no-untyped-def]
    total = 0.0
    for lp, x in zip(lps, xs, strict=True):
        masked = [t for t in range(T) if x["sequence_ratio_mask"][t] != 0]
        # The geometric mean of the token ratios, as a number (its value only).
        product = math.prod(math.exp(float(lp[t]) - float(x["logprobs"][t])) for t in masked)
        s = product ** (1 / len(masked))
        for t in range(T):
            low, high = _band(x, config, t)
            s_t = s * torch.exp(lp[t] - float(lp[t]))  # s's value, the token's own gradient
            a = x["advantages"][t]
            total = total - torch.min(s_t * a, torch.clamp(s_t, low, high) * a)
    return total


def ref_stable_reinforce(lps, xs, config):  # type: ignore[no-untyped-def]
    total = 0.0
    for lp, x in zip(lps, xs, strict=True):
        for t in range(T):
            a = x["advantages"][t]
            if a == 0:
                continue
            mu = x["sampler_logprobs"][t]
            cap = float(x["clip_high_threshold"][t]) if "clip_high_threshold" in x else config["clip_high_threshold"]
            weight = min(math.exp(float(lp[t]) - float(mu)), cap)
            total = total - weight * a * lp[t] + config["kl_coeff"] * 0.5 * (lp[t] - mu) ** 2
    return total


REFERENCES = {
    "importance_sampling": ref_importance_sampling,
    "ppo": ref_ppo,
    "cispo": ref_cispo,
    "dro": ref_dro,
    "gspo": ref_gspo,
    "stable_reinforce": ref_stable_reinforce,
}
CONFIGS = {
    "importance_sampling": [{}],
    "ppo": [{}, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}],
    "cispo": [{}, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}],
    "dro": [{}, {"beta": 0.7}],
    # GSPO's default band is 1e-4 wide: a wider one as well, so that both sides of the min show.
    "gspo": [{}, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.25}],
    "stable_reinforce": [{}, {"clip_high_threshold": 1.1, "kl_coeff": 0.5}],
}


@pytest.mark.parametrize(
    ("name", "config"), [(name, config) for name, configs in CONFIGS.items() for config in configs]
)
@pytest.mark.parametrize("per_token_clip", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_loss_equals_its_formula_with_gradients(
    name: str, config: dict[str, float], per_token_clip: bool, seed: int
) -> None:
    loss = get_loss(name)
    resolved = loss.resolve_config(config)
    logprobs, inputs = random_batch(seed, per_token_clip=per_token_clip)
    value, _ = loss.fn(logprobs, inputs, resolved)
    value.backward()
    mine = [lp.grad.clone() for lp in logprobs if lp.grad is not None]

    leaves = [lp.detach().clone().requires_grad_(True) for lp in logprobs]
    expected = REFERENCES[name](leaves, inputs, resolved)
    expected.backward()
    assert float(value) == pytest.approx(float(expected), abs=1e-6, rel=1e-6)
    for got, want in zip(mine, [leaf.grad for leaf in leaves], strict=True):
        assert want is not None
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_the_random_batches_exercise_both_sides_of_every_clip() -> None:
    """The data above are not all inside (or all outside) the bands, so the comparison covers both."""
    logprobs, inputs = random_batch(0)
    ratios = torch.cat([torch.exp(lp.detach() - x["logprobs"]) for lp, x in zip(logprobs, inputs, strict=True)])
    assert (ratios > 1.2).any() and (ratios < 0.8).any() and ((ratios > 0.8) & (ratios < 1.2)).any()
    _, metrics = get_loss("ppo").fn(logprobs, inputs, get_loss("ppo").resolve_config(None))
    assert 0 < metrics["clip_fraction:mean"] < 1


def test_gspo_without_a_mask_takes_the_ratio_over_the_tokens_with_an_advantage() -> None:
    logprobs, inputs = random_batch(3)
    without = [{k: v for k, v in x.items() if k != "sequence_ratio_mask"} for x in inputs]
    config = get_loss("gspo").resolve_config({"clip_low_threshold": 0.8, "clip_high_threshold": 1.25})
    assert float(gspo(logprobs, without, config)[0]) == pytest.approx(
        float(gspo(logprobs, inputs, config)[0]), abs=1e-9
    )


def test_bad_bands_are_refused_naming_the_position() -> None:
    logprobs, inputs = random_batch(4, per_token_clip=True)
    inputs[1]["clip_high_threshold"][5] = 0.95  # below 1: no on-policy ratio fits
    with pytest.raises(InvalidRequest, match="position 5") as error:
        get_loss("ppo").fn(logprobs, inputs, get_loss("ppo").resolve_config(None))
    assert error.value.param == "loss_fn_config"
    logprobs, inputs = random_batch(4)  # thresholds from the config
    with pytest.raises(InvalidRequest, match="0 <= low <= high"):
        get_loss("cispo").fn(logprobs, inputs, {"clip_low_threshold": 2.0, "clip_high_threshold": 1.0})
    with pytest.raises(InvalidRequest, match="kl_coeff"):
        get_loss("stable_reinforce").fn(logprobs, inputs, {"clip_high_threshold": 2.0, "kl_coeff": -1.0})


# ---- direction through a real session -----------------------------------------------------------


def test_cross_entropy_steps_raise_the_weighted_logprob(
    open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    session = open_session(seed=1)
    before = weighted_logprob(session.forward(toy_data).logprobs, toy_data)
    for _ in range(3):
        result = session.forward_backward(toy_data, "cross_entropy")
        session.optim_step(ADAM)
    assert result.metrics["loss:sum"] == pytest.approx(-weighted_logprob(result.logprobs, toy_data), rel=1e-5)
    assert weighted_logprob(session.forward(toy_data).logprobs, toy_data) > before + 1.0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_importance_sampling_moves_logprobs_with_the_advantage(
    open_session: Callable[..., TrainingSession], toy_data: list[Datum], sign: float
) -> None:
    session = open_session(seed=2)
    on_policy = session.forward(toy_data).logprobs
    data = [
        Datum(
            model_input=d.model_input,
            loss_fn_inputs={
                "target_tokens": d.target_tokens,
                "logprobs": lp,
                # Advantage on the completion (the last three tokens), none on the prompt.
                "advantages": [0.0] * (d.length - 3) + [sign] * 3,
            },
        )
        for d, lp in zip(toy_data, on_policy, strict=True)
    ]
    is_result = session.forward_backward(data, "importance_sampling")
    # On policy the ratio is 1, so PPO's surrogate has the same value.
    assert session.forward(data, "ppo").metrics["loss:sum"] == pytest.approx(is_result.metrics["loss:sum"], rel=1e-6)
    session.optim_step(ADAM)
    after = session.forward(data).logprobs
    moved = weighted_logprob(after, data, "advantages") - weighted_logprob(on_policy, data, "advantages")
    assert moved > 0.1  # sum of A * logp rises: positive A up, negative A down


def test_dpo_prefers_the_chosen_completion_over_steps(
    resident: ResidentBase, open_session: Callable[..., TrainingSession]
) -> None:
    prompt = [17, 932, 4401, 88]

    def completion(tokens: list[int]) -> Datum:
        sequence = prompt + tokens
        weights = [0.0] * (len(prompt) - 1) + [1.0] * len(tokens)
        return Datum(model_input=sequence[:-1], loss_fn_inputs={"target_tokens": sequence[1:], "weights": weights})

    pairs = [completion([311, 7, 2]), completion([19000, 23, 2]), completion([640, 12]), completion([870, 13])]
    session = open_session(seed=3)
    first = session.forward_backward(pairs, "dpo", {"beta": 0.5})
    # The adapter starts as the base (the reference): no margin yet.
    assert first.metrics["dpo_margin:mean"] == pytest.approx(0.0, abs=1e-5)
    assert first.metrics["dpo_accuracy:mean"] == 0.0
    session.optim_step(ADAM)
    # Reference logprobs given explicitly (the base's) give the same loss as computed by the session.
    reference = resident.forward(pairs).logprobs
    explicit = [
        Datum(model_input=d.model_input, loss_fn_inputs={**d.loss_fn_inputs, "ref_logprobs": ref})
        for d, ref in zip(pairs, reference, strict=True)
    ]
    assert session.forward(explicit, "dpo", {"beta": 0.5}).metrics["loss:sum"] == pytest.approx(
        session.forward(pairs, "dpo", {"beta": 0.5}).metrics["loss:sum"], rel=1e-6
    )
    for _ in range(2):
        last = session.forward_backward(pairs, "dpo", {"beta": 0.5})
        session.optim_step(ADAM)
    assert last.metrics["dpo_margin:mean"] > 0.1
    assert last.metrics["dpo_accuracy:mean"] == 1.0
    assert last.metrics["loss:sum"] < first.metrics["loss:sum"]

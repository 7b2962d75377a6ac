"""The built-in losses: registry rules, the maths on plain tensors, and the direction of their
gradients through a real session (a few steps move the quantity each loss should move)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from mint.errors import InvalidRequest
from mint.trainer.losses import LOSSES, Loss, cross_entropy, get_loss, ppo, register_loss
from mint.trainer.session import ResidentBase, TrainingSession
from mint.trainer.types import AdamParams, Datum

pytestmark = pytest.mark.backend_free

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
    assert set(LOSSES) == {"cross_entropy", "importance_sampling", "ppo", "dpo"}
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

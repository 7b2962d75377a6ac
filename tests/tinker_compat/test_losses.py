"""Every built-in RL loss through the official `tinker` SDK, on sequences Mint sampled: each
loss's value is the one its formula gives on the logprobs the server returns, its gradient
moves the weights, and stable_reinforce reads the stability info recorded at sampling through
the data's provenance, refusing data whose provenance does not hold."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import tinker
import torch
from tinker import types

from tests.conftest import Tenant
from tests.tinker_compat.conftest import BASE, TinkerWorker
from tests.tinker_compat.test_sdk import TEXTS, datum

pytestmark = pytest.mark.torch

PARAMS = types.SamplingParams(max_tokens=5, temperature=1.0, stop=[], seed=5)


def rl_datum(prompt: list[int], sequence: types.SampledSequence, advantage: float, loss_fn: str) -> types.Datum:
    """As tinker-cookbook's rl_loop builds one: prompt + sampled tokens, inputs padded on the prompt."""
    pad = len(prompt) - 1
    sampled = sequence.tokens
    inputs: dict[str, list[float] | list[int]] = {
        "target_tokens": [*prompt[1:], *sampled],
        "logprobs": [0.0] * pad + list(sequence.logprobs or []),
        "advantages": [0.0] * pad + [advantage] * len(sampled),
    }
    if loss_fn == "gspo":
        inputs["sequence_ratio_mask"] = [0.0] * pad + [1.0] * len(sampled)
    if loss_fn == "ppo":  # per-token thresholds, as loss inputs: a band that widens along the completion
        inputs["clip_low_threshold"] = [0.8] * pad + [0.9 - 0.1 * t for t in range(len(sampled))]
        inputs["clip_high_threshold"] = [1.2] * pad + [1.01 + 0.1 * t for t in range(len(sampled))]
    built = types.Datum(
        model_input=types.ModelInput.from_ints([*prompt, *sampled[:-1]]),
        loss_fn_inputs=inputs,  # type: ignore[arg-type]
    )
    if loss_fn != "stable_reinforce":
        return built
    seq = sequence.sequence_id
    return built.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=seq, length=len(prompt)),
            types.SampledProvenanceSpan(sequence_id=seq, length=len(sampled) - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=seq, offset=1, length=pad),
            types.SampledProvenanceSpan(sequence_id=seq, length=len(sampled)),
        ],
    )


def reference_loss(loss_fn: str, data: list[types.Datum], logprobs: list[torch.Tensor]) -> float:
    """Each loss from its published formula (Tinker's docs; GSPO-token; Mint's StableReinforce),
    on the logprobs the server returned. At temperature 1 the sampler's recorded logprobs are
    the client's `logprobs`, so stable_reinforce's weights are computable here too."""
    total = 0.0
    for d, p in zip(data, logprobs, strict=True):
        x = {key: value.to_torch().double() for key, value in d.loss_fn_inputs.items()}
        p = p.double()
        q, a = x["logprobs"], x["advantages"]
        r = torch.exp(p - q)
        if loss_fn == "importance_sampling":
            total += float(-(r * a).sum())
        elif loss_fn == "ppo":
            clipped = torch.clamp(r, x["clip_low_threshold"], x["clip_high_threshold"])
            total += float(-torch.min(r * a, clipped * a).sum())
        elif loss_fn == "cispo":
            total += float(-(torch.clamp(r, 0.0, 4.0) * p * a).sum())
        elif loss_fn == "dro":
            total += float(-(p * a - 0.5 * 0.05 * (p - q) ** 2).sum())
        elif loss_fn == "gspo":
            m = x["sequence_ratio_mask"] != 0
            s = torch.exp((p - q)[m].mean())
            total += float(-torch.min(s * a, torch.clamp(s, 1 - 3e-4, 1 + 4e-4) * a).sum())
        elif loss_fn == "stable_reinforce":
            sampled = a != 0
            total += float(-(torch.clamp(r, max=2.0) * a * p)[sampled].sum())
    return total


@pytest.fixture
def sampled(
    connect: Callable[[Tenant], tinker.ServiceClient], alice: Tenant, tinker_worker: TinkerWorker
) -> tuple[tinker.TrainingClient, list[int], list[types.SampledSequence]]:
    """A training client, and sequences its own snapshot sampled with stability info; then one
    supervised step, so that the learner is no longer the sampler (ratios differ from 1)."""
    training = connect(alice).create_lora_training_client(base_model=BASE, rank=4, seed=21).result()
    tokenizer = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client(record_stability_info=True).result()
    prompt = tokenizer.encode("What is 2 + 2?")
    sequences = list(sampler.sample(types.ModelInput.from_ints(prompt), 2, PARAMS).result().sequences)
    assert all(len(sequence.tokens) == PARAMS.max_tokens and sequence.sequence_id for sequence in sequences)
    training.forward_backward([datum(tokenizer, text) for text in TEXTS], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    return training, prompt, sequences


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce"])
def test_each_loss_matches_its_formula_and_trains(
    sampled: tuple[tinker.TrainingClient, list[int], list[types.SampledSequence]], loss_fn: str
) -> None:
    training, prompt, sequences = sampled
    data = [rl_datum(prompt, s, advantage, loss_fn) for s, advantage in zip(sequences, [1.0, -1.0], strict=True)]
    scored = training.forward(data, loss_fn).result()  # type: ignore[arg-type]
    logprobs = [out["logprobs"].to_torch() for out in scored.loss_fn_outputs]
    # The learner moved away from the sampler: the ratios are not all 1.
    moved = [
        float((lp - d.loss_fn_inputs["logprobs"].to_torch()).abs().max()) for lp, d in zip(logprobs, data, strict=True)
    ]
    assert max(moved) > 1e-3
    assert scored.metrics["loss:sum"] == pytest.approx(reference_loss(loss_fn, data, logprobs), rel=1e-4, abs=1e-5)

    result = training.forward_backward(data, loss_fn).result()  # type: ignore[arg-type]
    assert result.metrics["loss:sum"] == pytest.approx(scored.metrics["loss:sum"], rel=1e-5, abs=1e-6)
    # The RL loop's view of the step: the learner's distance from the sampler and its entropy.
    sampled_T = [d.loss_fn_inputs["logprobs"].to_torch() for d in data]
    gaps = torch.cat([(q - lp)[len(prompt) - 1 :] for q, lp in zip(sampled_T, logprobs, strict=True)])
    assert result.metrics["kl_sample_train:mean"] == pytest.approx(float(gaps.mean()), rel=1e-4, abs=1e-6)
    surprise = torch.cat([-lp[len(prompt) - 1 :] for lp in logprobs])
    assert result.metrics["entropy:mean"] == pytest.approx(float(surprise.mean()), rel=1e-4)
    assert training.optim_step(types.AdamParams(learning_rate=1e-3)).result().metrics["grad_norm:mean"] > 0


def test_stable_reinforce_refuses_data_whose_provenance_does_not_hold(
    sampled: tuple[tinker.TrainingClient, list[int], list[types.SampledSequence]],
    connect: Callable[[Tenant], tinker.ServiceClient],
    alice: Tenant,
) -> None:
    training, prompt, sequences = sampled
    good = rl_datum(prompt, sequences[0], 1.0, "stable_reinforce")
    with pytest.raises(tinker.BadRequestError, match="no provenance"):
        training.forward_backward([rl_datum(prompt, sequences[0], 1.0, "ppo")], "stable_reinforce").result()

    # Tokens that are not the ones sampled, under the sampled sequence's name.
    forged = types.Datum(
        model_input=good.model_input,
        loss_fn_inputs={**good.loss_fn_inputs, "target_tokens": [*prompt[1:], *[7] * len(sequences[0].tokens)]},  # type: ignore[dict-item]
        model_input_spans=good.model_input_spans,
        loss_fn_input_spans=good.loss_fn_input_spans,
    )
    with pytest.raises(tinker.BadRequestError, match="differ from what was sampled"):
        training.forward_backward([forged], "stable_reinforce").result()

    # The client cannot supply the stability info itself.
    claimed = types.Datum(
        model_input=good.model_input,
        loss_fn_inputs={**good.loss_fn_inputs, "sampler_logprobs": torch.zeros(good.model_input.length)},
        model_input_spans=good.model_input_spans,
        loss_fn_input_spans=good.loss_fn_input_spans,
    )
    with pytest.raises(tinker.BadRequestError, match="server's to fill"):
        training.forward_backward([claimed], "stable_reinforce").result()

    # A sequence sampled without record_stability_info carries none.
    plain = training.save_weights_and_get_sampling_client().result()
    unrecorded = plain.sample(types.ModelInput.from_ints(prompt), 1, PARAMS).result().sequences[0]
    with pytest.raises(tinker.BadRequestError, match="sampled without stability info"):
        training.forward_backward([rl_datum(prompt, unrecorded, 1.0, "stable_reinforce")], "stable_reinforce").result()

    # A sequence of another session (same organization) is not this session's to train on.
    other = connect(alice).create_lora_training_client(base_model=BASE, rank=4, seed=22).result()
    with pytest.raises(tinker.BadRequestError, match="only within one session"):
        other.forward_backward([good], "stable_reinforce").result()

    # Refused requests keep their place in the order: the good datum still trains.
    assert training.forward_backward([good], "stable_reinforce").result().metrics["loss:sum"] != 0

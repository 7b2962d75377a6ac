"""Sampling: seeds, batches of samples, stop tokens and strings, max_tokens, and logprobs that
equal what `forward` computes for the same tokens."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from mint.errors import InvalidRequest
from mint.trainer.sampling import StopRule, choose_tokens, draw
from mint.trainer.session import ResidentBase, TrainingSession
from mint.trainer.types import AdamParams, Datum, SampledSequence, SamplingParams

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

PROMPT = [17, 932, 4401, 88, 1203]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=[])


@pytest.fixture
def trained(open_session: Callable[..., TrainingSession], toy_data: list[Datum]) -> TrainingSession:
    """A session whose adapter is no longer zero, so sampling really goes through the LoRA weights."""
    session = open_session(seed=20)
    session.forward_backward(toy_data, "cross_entropy")
    session.optim_step(AdamParams(learning_rate=1e-2))
    return session


def test_seeds_reproduce_and_samples_differ(trained: TrainingSession) -> None:
    params = SamplingParams(max_tokens=6, seed=123, stop=[])
    first = trained.sample(PROMPT, params, num_samples=4)
    assert len(first) == 4
    assert trained.sample(PROMPT, params, num_samples=4) == first
    assert len({tuple(s.tokens) for s in first}) > 1  # rows are sampled independently
    assert trained.sample(PROMPT, params.model_copy(update={"seed": 124}), num_samples=4) != first


def test_max_tokens_is_honoured(trained: TrainingSession) -> None:
    for sequence in trained.sample(PROMPT, SamplingParams(max_tokens=5, stop=[]), num_samples=3):
        assert len(sequence.tokens) == len(sequence.logprobs) == 5
        assert sequence.stop_reason == "length"


def test_top_k_one_and_tiny_top_p_are_greedy(trained: TrainingSession) -> None:
    expected = trained.sample(PROMPT, greedy(6))[0].tokens
    for params in (
        SamplingParams(max_tokens=6, top_k=1, seed=1, stop=[]),
        SamplingParams(max_tokens=6, top_p=1e-6, seed=2, stop=[]),
    ):
        assert [s.tokens for s in trained.sample(PROMPT, params, num_samples=2)] == [expected, expected]


def seeded(max_tokens: int, stop: list[int] | list[str]) -> SamplingParams:
    # The same seed draws the same tokens, so a stop rule shows as a cut of the unstopped sample.
    return SamplingParams(max_tokens=max_tokens, seed=5, stop=stop)


def test_stop_token_ends_the_sequence_and_is_kept(trained: TrainingSession) -> None:
    tokens = trained.sample(PROMPT, seeded(8, []))[0].tokens
    stop_at = next(i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i])
    stopped = trained.sample(PROMPT, seeded(8, [tokens[stop_at]]))[0]
    assert stopped.tokens == tokens[: stop_at + 1]
    assert stopped.stop_reason == "stop"


def test_stop_string_is_checked_on_the_decoded_text(resident: ResidentBase, trained: TrainingSession) -> None:
    tokens = trained.sample(PROMPT, seeded(10, []))[0].tokens

    def text(n: int) -> str:
        return resident.tokenizer.decode(tokens[:n])

    # The first token that adds text not seen before becomes the stop string.
    for i in range(1, len(tokens)):
        before, after = text(i), text(i + 1)
        new = after[len(before) :].strip() if after.startswith(before) else ""
        if new and new not in before:
            stop_at, stop_string = i, new
            break
    else:
        pytest.fail(f"no usable stop string in the greedy text {text(len(tokens))!r}")
    stopped = trained.sample(PROMPT, seeded(10, [stop_string]))[0]
    assert stopped.tokens == tokens[: stop_at + 1]
    assert stopped.stop_reason == "stop"


def test_default_stop_is_end_of_sequence(resident: ResidentBase) -> None:
    assert StopRule.from_params(None, [2]).token_ids == {2}
    assert StopRule.from_params([], [2]) == StopRule(frozenset(), ())
    assert resident.tokenizer.eos_token_id in StopRule.from_params(None, resident.eos_token_ids).token_ids


def forward_of(sequence: SampledSequence) -> Datum:
    """The datum that scores `sequence`'s tokens after the prompt."""
    full = PROMPT + sequence.tokens
    return Datum(model_input=full[:-1], loss_fn_inputs={"target_tokens": full[1:]})


def test_sample_logprobs_equal_forward_logprobs(resident: ResidentBase, trained: TrainingSession) -> None:
    for sampler, scorer in ((trained.sample, trained.forward), (resident.sample, resident.forward)):
        samples = sampler(PROMPT, SamplingParams(max_tokens=8, seed=7, stop=[]), 3)
        scored = scorer([forward_of(s) for s in samples]).logprobs
        for sequence, row in zip(samples, scored, strict=True):
            assert sequence.logprobs == pytest.approx(row[len(PROMPT) - 1 :], abs=1e-4)


def test_bad_prompts_are_refused(trained: TrainingSession) -> None:
    with pytest.raises(InvalidRequest):
        trained.sample([], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequest):
        trained.sample([10**9], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequest):
        trained.sample(PROMPT, SamplingParams(max_tokens=2), num_samples=0)


# ---- stability info: each token's logprob under the distribution it was drawn from ------------


def test_draw_records_the_logprob_of_the_distribution_it_drew_from() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=generator, dtype=torch.float32)
    params = SamplingParams(temperature=0.7, top_k=5, seed=0)
    chosen, recorded = draw(logits, params, torch.Generator().manual_seed(1))
    # Written from the definition: scale by 1/T, keep the top k, renormalise.
    scaled = logits / 0.7
    kept = scaled.masked_fill(scaled < scaled.topk(5, dim=-1).values[:, -1:], float("-inf"))
    expected = kept.log_softmax(dim=-1).gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(recorded, expected)
    # Greedy draws are certain; choose_tokens draws exactly what draw does.
    assert draw(logits, SamplingParams(temperature=0.0), generator)[1].eq(0).all()
    assert choose_tokens(logits, params, torch.Generator().manual_seed(1)).equal(chosen)


def test_sampler_logprobs_are_the_model_logprobs_at_temperature_one(trained: TrainingSession) -> None:
    plain = trained.sample(PROMPT, SamplingParams(max_tokens=6, seed=3, stop=[]), num_samples=2)
    for sequence in plain:
        assert sequence.sampler_logprobs == pytest.approx(sequence.logprobs, abs=1e-5)
    cooled = trained.sample(PROMPT, SamplingParams(max_tokens=6, seed=3, temperature=0.5, stop=[]), num_samples=2)
    for sequence in cooled:
        assert sequence.sampler_logprobs is not None
        # Sharper than the model's own distribution: the drawn tokens were likelier under it.
        assert sum(sequence.sampler_logprobs) > sum(sequence.logprobs)

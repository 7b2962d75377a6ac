"""Sampling: seeds, batches of samples, stop tokens and strings, max_tokens, and logprobs that
equal what `forward` computes for the same tokens; batches of requests with prompts of
different lengths and their own parameters, each sampled as it would be alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from mint.errors import InvalidRequest
from mint.trainer import sampling_passes
from mint.trainer.sampling import StopRule, choose_tokens, draw
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import TrainingSession
from mint.trainer.types import AdamParams, Datum, ForwardOutput, SampledSequence, SampleRequest, SamplingParams

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


def test_draw_follows_the_distribution_and_never_draws_a_token_of_probability_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    logits = probs.log().expand(40_000, 6)  # log 0 = -inf: as top-k or top-p leave a logit
    chosen, _ = draw(logits, SamplingParams(temperature=1.0), torch.Generator().manual_seed(2))
    shares = torch.bincount(chosen, minlength=6) / chosen.numel()
    # Four standard deviations of a share over 40k draws is at most 0.01.
    assert torch.allclose(shares, probs, atol=0.01) and shares[probs == 0].eq(0).all()
    # A uniform number rounded up to the top of the cumulative sum draws the last possible token.
    monkeypatch.setattr(torch, "rand", lambda size, **_: torch.ones(size))
    assert draw(logits[:3], SamplingParams(temperature=1.0), torch.Generator())[0].tolist() == [4, 4, 4]


def test_sampler_logprobs_are_the_model_logprobs_at_temperature_one(trained: TrainingSession) -> None:
    plain = trained.sample(PROMPT, SamplingParams(max_tokens=6, seed=3, stop=[]), num_samples=2)
    for sequence in plain:
        assert sequence.sampler_logprobs == pytest.approx(sequence.logprobs, abs=1e-5)
    cooled = trained.sample(PROMPT, SamplingParams(max_tokens=6, seed=3, temperature=0.5, stop=[]), num_samples=2)
    for sequence in cooled:
        assert sequence.sampler_logprobs is not None
        # Sharper than the model's own distribution: the drawn tokens were likelier under it.
        assert sum(sequence.sampler_logprobs) > sum(sequence.logprobs)


# ---- batches of requests ------------------------------------------------------------------------

# Prompts of four lengths, each request with its own seed, temperature, top-k or top-p, token
# limit and number of samples: what one RL step or a few concurrent Tinker requests mix.
MIXED = [
    SampleRequest(PROMPT, SamplingParams(max_tokens=8, seed=7, stop=[]), 3),
    SampleRequest([5, 19000], SamplingParams(max_tokens=4, seed=8, temperature=0.7, top_k=20, stop=[]), 2),
    SampleRequest(
        [3001, 42, 9, 870, 12, 13, 14, 15, 16, 2, 311], SamplingParams(max_tokens=8, seed=9, top_p=0.9, stop=[]), 1
    ),
    SampleRequest([640, 23, 23], SamplingParams(max_tokens=6, temperature=0.0, stop=[]), 2),
]


def scored_after_prompt(
    forward: Callable[[list[Datum]], ForwardOutput],
    requests: Sequence[SampleRequest],
    batch: Sequence[Sequence[SampledSequence]],
) -> list[list[list[float]]]:
    """What `forward` gives each sample's tokens after its prompt, per request and sample."""
    data = [
        Datum(model_input=full[:-1], loss_fn_inputs={"target_tokens": full[1:]})
        for request, samples in zip(requests, batch, strict=True)
        for full in ([*request.prompt_tokens, *sample.tokens] for sample in samples)
    ]
    rows = iter(forward(data).logprobs)
    return [
        [next(rows)[len(request.prompt_tokens) - 1 :] for _ in samples]
        for request, samples in zip(requests, batch, strict=True)
    ]


def check_against_forward(
    sample_batch: Callable[[list[SampleRequest]], list[list[SampledSequence]]],
    forward: Callable[[list[Datum]], ForwardOutput],
) -> list[list[SampledSequence]]:
    """One batch of MIXED: every sampled token's logprob is the one `forward` computes for the
    same prompt and tokens, and each token's sampler logprob fits how it was drawn."""
    batch = sample_batch(MIXED)
    assert [len(samples) for samples in batch] == [request.num_samples for request in MIXED]
    for request, samples, scored in zip(MIXED, batch, scored_after_prompt(forward, MIXED, batch), strict=True):
        params = request.params
        for sample, row in zip(samples, scored, strict=True):
            assert len(sample.tokens) == params.max_tokens and sample.stop_reason == "length"
            assert sample.logprobs == pytest.approx(row, abs=1e-4)
            assert sample.sampler_logprobs is not None
            if params.temperature == 0:
                assert sample.sampler_logprobs == [0.0] * len(sample.tokens)
            elif params.temperature == 1 and params.top_k == -1 and params.top_p == 1:
                assert sample.sampler_logprobs == pytest.approx(sample.logprobs, abs=1e-4)
            else:  # a narrowed distribution: every drawn token was likelier under it
                assert all(d >= m - 1e-4 for d, m in zip(sample.sampler_logprobs, sample.logprobs, strict=True))
    return batch


def test_batched_sample_logprobs_equal_forward_logprobs(resident: ResidentBase, trained: TrainingSession) -> None:
    check_against_forward(trained.sample_batch, trained.forward)
    check_against_forward(lambda requests: resident.sample_batch(None, requests), resident.forward)


@pytest.mark.slow
def test_batched_sample_logprobs_equal_forward_logprobs_on_smollm2(smollm2: ResidentBase) -> None:
    batch = check_against_forward(lambda requests: smollm2.sample_batch(None, requests), smollm2.forward)
    # The sampler logprobs of the tempered top-k request, from their definition on one forward:
    # the logits at temperature 0.7, the top 20 kept, renormalised.
    request, samples = MIXED[1], batch[1]
    for sample in samples:
        full = [*request.prompt_tokens, *sample.tokens]
        with torch.no_grad():
            logits_T_V = smollm2.model(input_ids=torch.tensor([full[:-1]])).logits[0, len(request.prompt_tokens) - 1 :]
        scaled = logits_T_V.float() / 0.7
        kept = scaled.masked_fill(scaled < scaled.topk(20, dim=-1).values[:, -1:], float("-inf"))
        expected = kept.log_softmax(dim=-1).gather(-1, torch.tensor(sample.tokens).unsqueeze(-1)).squeeze(-1)
        assert sample.sampler_logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def assert_same_samples(got: Sequence[SampledSequence], expected: Sequence[SampledSequence]) -> None:
    """The same tokens and stop reasons; logprobs equal up to float rounding (other batch shapes)."""
    assert [(s.tokens, s.stop_reason) for s in got] == [(s.tokens, s.stop_reason) for s in expected]
    for sample, other in zip(got, expected, strict=True):
        assert sample.logprobs == pytest.approx(other.logprobs, abs=1e-5)
        assert sample.sampler_logprobs == pytest.approx(other.sampler_logprobs, abs=1e-5)


def test_a_request_samples_the_same_in_a_batch_as_alone(trained: TrainingSession) -> None:
    """Each request draws from its own seeded generator, and padding is hidden by the mask: its
    samples are those it gets alone, whatever else is in the batch and whenever the others end."""
    batch = trained.sample_batch(MIXED)
    for request, samples in zip(MIXED, batch, strict=True):
        assert_same_samples(samples, trained.sample(request.prompt_tokens, request.params, request.num_samples))
    for samples, other in zip(reversed(batch), trained.sample_batch(list(reversed(MIXED))), strict=True):
        assert_same_samples(other, samples)


def test_a_large_batch_runs_in_bounded_chunks_with_the_same_samples(
    trained: TrainingSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = trained.sample_batch(MIXED)
    monkeypatch.setattr(sampling_passes, "MAX_ROWS_PER_BATCH", 3)  # rows 3 | 2 + 1 | 2
    for samples, other in zip(trained.sample_batch(MIXED), whole, strict=True):
        assert_same_samples(samples, other)


def test_a_batch_with_a_bad_request_is_refused_before_it_runs(resident: ResidentBase, trained: TrainingSession) -> None:
    decoding = resident.check_sample_request(SampleRequest(PROMPT, SamplingParams()))
    assert decoding.max_new_tokens == resident.spec.context_length - len(PROMPT)
    assert decoding.stop.token_ids == frozenset(resident.eos_token_ids)
    for bad in (
        SampleRequest([10**9], SamplingParams(max_tokens=2)),
        SampleRequest(PROMPT, SamplingParams(max_tokens=2), num_samples=0),
        SampleRequest([1] * resident.spec.context_length, SamplingParams(max_tokens=2)),
    ):
        with pytest.raises(InvalidRequest):
            resident.check_sample_request(bad)
        with pytest.raises(InvalidRequest):
            trained.sample_batch([*MIXED, bad])
    assert trained.sample_batch([]) == []


def test_decoding_writes_a_preallocated_cache_with_the_samples_of_a_growing_one(
    trained: TrainingSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step writes its keys and values into buffers sized once for the decode (none grows),
    and the samples are exactly those of transformers' cache grown by concatenation."""
    from mint.trainer import kv_cache, sampling

    grown: list[int] = []
    writes: list[int] = []
    write = kv_cache.PreallocatedLayer.update
    monkeypatch.setattr(kv_cache.PreallocatedLayer, "_grow", lambda layer, capacity: grown.append(capacity))

    def counted_write(layer: kv_cache.PreallocatedLayer, *args: Any, **kwargs: Any) -> Any:
        writes.append(1)
        return write(layer, *args, **kwargs)

    monkeypatch.setattr(kv_cache.PreallocatedLayer, "update", counted_write)
    preallocated = trained.sample_batch(MIXED)
    assert writes and grown == []
    monkeypatch.setattr(sampling, "reserve", lambda cache, extra: None)
    for samples, other in zip(preallocated, trained.sample_batch(MIXED), strict=True):
        assert [(s.tokens, s.logprobs, s.sampler_logprobs) for s in samples] == [
            (s.tokens, s.logprobs, s.sampler_logprobs) for s in other
        ]

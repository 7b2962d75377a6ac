"""Logprobs beyond the sampled token: top-k lists at sampled and prompt positions, logprobs of
named target ids at prompt positions, and (N, K) cross-entropy targets. Each is checked against
a full-softmax reference computed here from the model's own logits."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from mint.errors import InvalidRequest
from mint.trainer.prompt_scores import NO_TARGET, PromptQuery
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import TrainingSession
from mint.trainer.types import AdamParams, Datum, SampleRequest, SamplingParams

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

PROMPT = [17, 932, 4401, 88, 1203, 7, 311]


@pytest.fixture
def trained(open_session: Callable[..., TrainingSession], toy_data: list[Datum]) -> TrainingSession:
    """A session whose adapter is no longer zero, so every number goes through the LoRA weights."""
    session = open_session(seed=21)
    session.forward_backward(toy_data, "cross_entropy")
    session.optim_step(AdamParams(learning_rate=1e-2))
    return session


def reference(resident: ResidentBase, adapter: str | None, tokens: Sequence[int]) -> torch.Tensor:
    """log_softmax of the model's logits over the whole vocabulary at each position of `tokens`
    (row i predicts token i + 1), in float64 from the float32 logits."""
    with resident._use(adapter) as model, torch.no_grad():
        logits = model(input_ids=torch.tensor([list(tokens)])).logits[0]
    return logits.double().log_softmax(dim=-1)


def assert_top_k(entries: Sequence[tuple[int, float]], row: torch.Tensor, k: int) -> None:
    """`entries` are the k best tokens of the reference row, most likely first, with its logprobs."""
    expected = row.topk(k)
    assert [token for token, _ in entries] == expected.indices.tolist()
    assert [value for _, value in entries] == pytest.approx(expected.values.tolist(), abs=1e-5)


def test_top_k_sample_logprobs_equal_a_full_softmax(resident: ResidentBase, trained: TrainingSession) -> None:
    name = trained.session_id
    asked = SampleRequest(PROMPT, SamplingParams(max_tokens=6, seed=5, stop=[]), 2, top_logprobs=4)
    plain = SampleRequest(PROMPT[:3], SamplingParams(max_tokens=3, seed=6, stop=[]), 1)
    greedy = SampleRequest(PROMPT, SamplingParams(max_tokens=4, temperature=0.0, stop=[]), 1, top_logprobs=1)
    sampled, alone, first = resident.sample_batch(name, [asked, plain, greedy])
    assert alone[0].top_logprobs is None  # only the requests that asked pay for the lists
    for sequence in sampled:
        assert sequence.top_logprobs is not None and len(sequence.top_logprobs) == len(sequence.tokens) == 6
        full = reference(resident, name, PROMPT + sequence.tokens)
        for step, (token, logprob, entries) in enumerate(
            zip(sequence.tokens, sequence.logprobs, sequence.top_logprobs, strict=True)
        ):
            row = full[len(PROMPT) - 1 + step]
            assert_top_k(entries, row, 4)
            assert logprob == pytest.approx(float(row[token]), abs=1e-5)
            listed = dict(entries)
            if token in listed:  # the same number whichever list it is read from
                assert listed[token] == pytest.approx(logprob, abs=1e-6)
    # Greedy decoding takes the top-1 token at every step.
    assert [entries[0][0] for entries in first[0].top_logprobs or []] == first[0].tokens
    # The lists do not change what is sampled (the batch around it may move a logprob's last bits).
    again = resident.sample_batch(name, [SampleRequest(PROMPT, asked.params, 2)])[0]
    assert [sequence.tokens for sequence in again] == [sequence.tokens for sequence in sampled]
    for mine, theirs in zip(again, sampled, strict=True):
        assert mine.top_logprobs is None and mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)


def test_prompt_logprobs_top_k_and_targets_equal_a_full_softmax(
    resident: ResidentBase, trained: TrainingSession
) -> None:
    targets = [[PROMPT[i + 1], 5, NO_TARGET] for i in range(len(PROMPT) - 1)]
    targets[2] = [NO_TARGET, NO_TARGET, 640]
    for adapter in (trained.session_id, None):
        scores = resident.score_prompt(adapter, PromptQuery(PROMPT, logprobs=True, top_k=3, targets=targets))
        full = reference(resident, adapter, PROMPT)
        assert scores.logprobs is not None and scores.top is not None and scores.targets is not None
        assert len(scores.logprobs) == len(scores.top) == len(scores.targets) == len(PROMPT) - 1
        for position in range(1, len(PROMPT)):
            row = full[position - 1]
            assert scores.logprobs[position - 1] == pytest.approx(float(row[PROMPT[position]]), abs=1e-5)
            assert_top_k(scores.top[position - 1], row, 3)
            expected = [0.0 if token == NO_TARGET else float(row[token]) for token in targets[position - 1]]
            assert scores.targets[position - 1] == pytest.approx(expected, abs=1e-5)
    # Prompt logprobs are the numbers forward gives for the same tokens.
    forward = trained.forward([Datum(model_input=PROMPT[:-1], loss_fn_inputs={"target_tokens": PROMPT[1:]})])
    only = resident.score_prompt(trained.session_id, PromptQuery(PROMPT, logprobs=True))
    assert only.logprobs == pytest.approx(forward.logprobs[0], abs=1e-6)
    assert only.top is None and only.targets is None


def test_bad_targets_are_refused(resident: ResidentBase) -> None:
    with pytest.raises(InvalidRequest, match="needs len\\(prompt\\) - 1 = 6"):
        resident.score_prompt(None, PromptQuery(PROMPT, targets=[[1]] * 3))
    with pytest.raises(InvalidRequest, match="token id 1000000"):
        resident.score_prompt(None, PromptQuery(PROMPT, targets=[[1000000]] * 6))
    with pytest.raises(InvalidRequest, match="more than"):
        resident.sample_batch(None, [SampleRequest(PROMPT, SamplingParams(max_tokens=4000), 256, top_logprobs=1000)])


# ---- (N, K) targets ------------------------------------------------------------------------------


def distillation_datum(k: int) -> Datum:
    """K weighted targets at each position, as distillation from a teacher's top-k writes them:
    the true next token first, then others; weights a distribution per position (0 on the first)."""
    tokens = [17, 932, 4401, 88, 1203, 7, 311]
    inputs = tokens[:-1]
    targets = [[tokens[i + 1], *[(tokens[i + 1] * (j + 3) + 11) % 1000 for j in range(k - 1)]] for i in range(6)]
    weights = [[0.0] * k] + [[0.6, *[0.4 / (k - 1)] * (k - 1)] for _ in range(5)]
    return Datum(model_input=inputs, loss_fn_inputs={"target_tokens": targets, "weights": weights})


def columns(datum: Datum) -> list[Datum]:
    """The (N, K) datum as K ordinary data, one per column of targets and weights."""
    targets, weights = datum.loss_fn_inputs["target_tokens"], datum.loss_fn_inputs["weights"]
    return [
        Datum(
            model_input=datum.model_input,
            loss_fn_inputs={
                "target_tokens": [row[j] for row in targets],  # type: ignore[index]
                "weights": [row[j] for row in weights],  # type: ignore[index]
            },
        )
        for j in range(len(targets[0]))  # type: ignore[arg-type]
    ]


def test_two_d_targets_score_k_tokens_per_position_and_train_as_their_columns(
    resident: ResidentBase, open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    datum = distillation_datum(3)
    wide, narrow = open_session(seed=33), open_session(seed=33)
    for session in (wide, narrow):
        session.forward_backward(toy_data, "cross_entropy")
        session.optim_step(AdamParams(learning_rate=1e-2))

    # forward: one (N, K) table per datum, each cell the full softmax's logprob of that target;
    # an ordinary datum beside it keeps its (N,) logprobs.
    out = wide.forward([datum, toy_data[0]])
    table, plain = out.logprobs
    full = reference(resident, wide.session_id, datum.model_input)
    for i, row in enumerate(datum.loss_fn_inputs["target_tokens"]):
        assert table[i] == pytest.approx([float(full[i][t]) for t in row], abs=1e-5)  # type: ignore[union-attr]
    assert plain == pytest.approx(wide.forward([toy_data[0]]).logprobs[0], abs=1e-6)

    # cross_entropy over (N, K) is the sum of its K columns' losses, gradient included.
    loss = wide.forward_backward([datum], "cross_entropy").metrics["loss:sum"]
    summed = narrow.forward_backward(columns(datum), "cross_entropy").metrics["loss:sum"]
    assert loss == pytest.approx(summed, rel=1e-5)
    for (name, mine), theirs in zip(wide.named_parameters().items(), narrow.named_parameters().values(), strict=True):
        assert mine.grad is not None and theirs.grad is not None
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_two_d_targets_are_refused_where_a_loss_reads_one_token(open_session: Callable[..., TrainingSession]) -> None:
    session = open_session(seed=1)
    datum = distillation_datum(2)
    rl = Datum(
        model_input=datum.model_input,
        loss_fn_inputs={
            "target_tokens": datum.loss_fn_inputs["target_tokens"],
            "logprobs": [-1.0] * 6,
            "advantages": [1.0] * 6,
        },
    )
    with pytest.raises(InvalidRequest, match="'importance_sampling' takes one per position"):
        session.forward_backward([rl], "importance_sampling")
    with pytest.raises(ValueError, match="must have the same shape"):
        Datum(
            model_input=[1, 2],
            loss_fn_inputs={"target_tokens": [[2, 3], [3, 4]], "weights": [1.0, 1.0]},
        )
    with pytest.raises(ValueError, match="only target_tokens and weights may be"):
        Datum(model_input=[1, 2], loss_fn_inputs={"target_tokens": [2, 3], "advantages": [[1.0], [1.0]]})

"""Data that begin alike (an RL group's samples of one prompt) run their prefix once.

The two-pass layout (`mint.trainer.shared_prefixes`) must give the numbers of running every
datum whole: the same logprobs and gradients to float32 rounding, on the tiny MoE base, with
one session and with two sessions in one mixed pass, and the sampler's logprobs for the tokens
it drew. The layout itself is checked token by token.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from mint.trainer import shared_prefixes
from mint.trainer.packing import pack
from mint.trainer.scoring import ScoreRequest
from mint.trainer.session import ResidentBase
from mint.trainer.shared_prefixes import MIN_SHARED_TOKENS, share
from mint.trainer.training_session import BackwardCall, TrainingSession
from mint.trainer.types import Datum, SampleRequest, SamplingParams
from tests.trainer.test_mixed_passes import _trained

pytestmark = pytest.mark.backend_free

ATTENTION_ONLY = {"train_mlp": False, "train_experts": False}
PROMPT_LENGTH = MIN_SHARED_TOKENS + 4


def _prompt(offset: int) -> list[int]:
    return [(offset + 31 * i) % 4000 + 5 for i in range(PROMPT_LENGTH)]


def _group(prompt: list[int], lengths: list[int], offset: int) -> list[list[int]]:
    return [prompt + [(offset + 13 * j + 7 * k) % 4000 + 5 for k in range(n)] for j, n in enumerate(lengths)]


def _rl_datum(tokens: list[int], prompt_length: int) -> Datum:
    inputs, targets = tokens[:-1], tokens[1:]
    advantages = [0.0 if i < prompt_length - 1 else 0.4 - 0.05 * i for i in range(len(targets))]
    return Datum(
        model_input=inputs,
        loss_fn_inputs={"target_tokens": targets, "logprobs": [-2.0] * len(targets), "advantages": advantages},
    )


def _sequences(offset: int) -> list[list[int]]:
    """Two groups of one prompt each (completions of different lengths), then a datum alone."""
    lone = [(offset + 17 * i) % 4000 + 5 for i in range(PROMPT_LENGTH + 6)]
    return _group(_prompt(offset), [5, 9, 2], offset) + _group(_prompt(offset + 1), [7, 3], offset) + [lone]


def _grads(*sessions: TrainingSession) -> dict[str, torch.Tensor]:
    grads = {}
    for session in sessions:
        for name, parameter in session.named_parameters().items():
            if parameter.grad is not None:
                grads[f"{session.session_id}:{name}"] = parameter.grad.clone()
            parameter.grad = None
    return grads


def _gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b, strict=True) for x, y in zip(row_a, row_b, strict=True))


def _same_grads(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys() and got
    for name, grad in got.items():
        assert torch.allclose(grad, want[name], rtol=1e-4, atol=1e-7), name


def test_the_layout_runs_each_shared_prefix_once_and_puts_every_token_back_in_place() -> None:
    sequences = _sequences(100)
    layout = share(sequences, [3, 3], torch.device("cpu"), pad_id=0)
    assert layout is not None
    # Groups stay inside their part: the first part's group of 3; the second part's group of 2
    # and the lone datum, a group of its own that runs whole in the prefix pass.
    assert layout.prefix_rows_per_part == [1, 2]
    width = layout.prefix_ids_P_W.shape[1]
    assert layout.prefix_ids_P_W.tolist() == [
        _prompt(100) + [0] * (width - PROMPT_LENGTH),
        _prompt(101) + [0] * (width - PROMPT_LENGTH),
        sequences[-1],
    ]
    assert layout.prefix_of_row_B.tolist() == [0, 0, 0, 1, 1, 2]
    both = torch.cat([layout.prefix_ids_P_W.flatten(), layout.suffix_ids_B_S.flatten()])
    assert both[layout.hidden_index_N].tolist() == [token for sequence in sequences for token in sequence]
    # A member sees its own group's prefix only, its real tokens and not the padding after them,
    # from the positions after it; and its own suffix causally.
    mask_S_T = layout.suffix_mask_B_1_S_T[3, 0]
    assert mask_S_T[0, :width].tolist() == [True] * PROMPT_LENGTH + [False] * (width - PROMPT_LENGTH)
    assert mask_S_T[:, width:].equal(torch.ones_like(mask_S_T[:, width:]).tril())
    assert layout.suffix_positions_B_S[3, 0] == PROMPT_LENGTH
    # Across a part boundary nothing is shared, and short common beginnings are not shared.
    assert share(sequences[:2] + sequences[3:5], [1, 1, 1, 1], torch.device("cpu"), pad_id=0) is None
    short = [_prompt(5)[: MIN_SHARED_TOKENS - 1] + [9 + j, 9, 9] for j in range(3)]
    assert share(short, [3], torch.device("cpu"), pad_id=0) is None


def test_samples_of_prompts_that_begin_alike_share_their_whole_prompt_per_group() -> None:
    system = _prompt(900)  # one system prompt before every question
    prompts = [system + _prompt(901), system + _prompt(902)]
    sequences = [sequence for i, prompt in enumerate(prompts) for sequence in _group(prompt, [3, 5, 4], i)]
    layout = share(sequences, [len(sequences)], torch.device("cpu"), pad_id=0)
    # One group per prompt, sharing all of it, rather than one group sharing the system prompt.
    assert layout is not None and layout.prefix_ids_P_W.tolist() == prompts
    assert layout.prefix_of_row_B.tolist() == [0, 0, 0, 1, 1, 1]


def test_shared_prefixes_give_the_numbers_of_running_each_datum_whole(
    open_session: Callable[..., TrainingSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    session = open_session(seed=4)  # LoRA on attention and on the routed experts (parameters)
    _trained(session, 4)
    data = [_rl_datum(sequence, PROMPT_LENGTH) for sequence in _sequences(300)]
    batch = pack(data, torch.device("cpu"))
    assert batch.shared is not None
    positions = batch.shared.prefix_ids_P_W.numel() + batch.shared.suffix_ids_B_S.numel()
    assert positions < 0.8 * batch.input_ids_B_L.numel()

    shared = session.forward_backward(data, "ppo")
    shared_grads = _grads(session)
    monkeypatch.setattr(shared_prefixes, "MAX_COST_SHARE", 0.0)  # every datum whole, one per row
    assert pack(data, torch.device("cpu")).shared is None
    whole = session.forward_backward(data, "ppo")
    whole_grads = _grads(session)
    assert _gap(shared.logprobs, whole.logprobs) < 1e-5
    assert shared.metrics["loss:sum"] == pytest.approx(whole.metrics["loss:sum"], rel=1e-5)
    _same_grads(shared_grads, whole_grads)


def test_two_sessions_in_one_mixed_pass_share_their_own_prefixes_only(
    resident: ResidentBase, open_session: Callable[..., TrainingSession]
) -> None:
    a, b = open_session(**ATTENTION_ONLY, seed=1), open_session(**ATTENTION_ONLY, seed=2)
    _trained(a, 1)
    _trained(b, 2)
    # b has a's data in reverse order: a's last datum and b's first are the same tokens, and
    # still get a prefix row each (two groups and a lone datum per session).
    data_a = [_rl_datum(sequence, PROMPT_LENGTH) for sequence in _sequences(500)]
    data_b = [_rl_datum(sequence, PROMPT_LENGTH) for sequence in _sequences(500)[::-1]]
    calls = [
        BackwardCall(session, ScoreRequest.of(resident.limits, data, "importance_sampling", None))
        for session, data in ((a, data_a), (b, data_b))
    ]
    batch = pack(data_a + data_b, torch.device("cpu"), [len(data_a), len(data_b)])
    assert batch.shared is not None and batch.shared.prefix_rows_per_part == [3, 3]

    together = resident.forward_backward_many(calls)
    together_grads = _grads(a, b)
    alone = [resident.forward_backward_many([call])[0] for call in calls]
    alone_grads = _grads(a, b)
    for got, want in zip(together, alone, strict=True):
        assert _gap(got.logprobs, want.logprobs) < 1e-5
    _same_grads(together_grads, alone_grads)


def test_the_sampler_draws_with_the_logprobs_a_shared_pass_gives(open_session: Callable[..., TrainingSession]) -> None:
    session = open_session(**ATTENTION_ONLY, seed=6)
    _trained(session, 6)
    prompts = [_prompt(700), _prompt(701)]
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    groups = session.sample_batch([SampleRequest(prompt, params, 3) for prompt in prompts])
    data = [
        _rl_datum(prompt + sample.tokens, len(prompt))
        for prompt, group in zip(prompts, groups, strict=True)
        for sample in group
    ]
    assert pack(data, torch.device("cpu")).shared is not None
    trained = session.forward_backward(data, "importance_sampling").logprobs
    sampled = [sample.logprobs for group in groups for sample in group]
    assert _gap([row[PROMPT_LENGTH - 1 :] for row in trained], sampled) < 1e-4

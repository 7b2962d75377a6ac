"""forward_backward of several sessions in one mixed-adapter pass, each session's numbers its own.

Isolation is checked three ways. Exactly: in a pass with another session's batch beside it, a
session's logprobs and gradients are bit for bit the same whatever the other session's loss is
(scaled a thousandfold, or another loss), and a pass of one session equals the plain
one-adapter path bit for bit. Against running alone, on a base as it runs by default: the same
numbers to float32 rounding, because the host's kernels run over the whole batch (a matmul
over more rows blocks its sums differently, and a MoE layer groups all sessions' tokens by
expert; measured: up to 2e-6 in a logprob, 1e-10 in a gradient). And against running alone on a
batch-invariant base (`batch_invariance`): bit for bit, logprobs and gradients, with batches of
other widths and either order of the sessions.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mint.schemas.base_models import BaseModelSpec
from mint.trainer.mixed_adapters import can_mix
from mint.trainer.sampling_passes import SampleCall
from mint.trainer.scoring import ScoreRequest
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import BackwardCall, TrainingSession
from mint.trainer.types import AdamParams, Datum, ForwardOutput, LoraOptions, SampleRequest, SamplingParams

pytestmark = pytest.mark.backend_free

ATTENTION_ONLY = {"train_mlp": False, "train_experts": False, "seed": 0}


def _trained(session: TrainingSession, seed: int) -> None:
    """Give the session's B a non-zero value, so its adapter changes the logprobs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in session.named_parameters().items():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)


def _rl_datum(sft: Callable[..., Datum], tokens: list[int]) -> Datum:
    d = sft(tokens, prompt_length=3)
    return Datum(
        model_input=d.model_input,
        loss_fn_inputs={
            "target_tokens": d.target_tokens,
            "logprobs": [-2.0] * d.length,
            "advantages": [0.5 - 0.3 * k for k in range(d.length)],
        },
    )


def _rl_data(sft: Callable[..., Datum], offset: int) -> list[Datum]:
    return [_rl_datum(sft, [(offset + 37 * i + 11 * j) % 4000 + 5 for j in range(9 + 7 * i)]) for i in range(3)]


def _call(resident: ResidentBase, session: TrainingSession, data: list[Datum], loss: str) -> BackwardCall:
    return BackwardCall(session, ScoreRequest.of(resident.limits, data, loss, None))


def _grads(session: TrainingSession) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in session.named_parameters().items() if p.grad is not None}


def _clear(*sessions: TrainingSession) -> None:
    for session in sessions:
        for parameter in session.named_parameters().values():
            parameter.grad = None


def _scaled(data: list[Datum], factor: float) -> list[Datum]:
    return [
        Datum(
            model_input=d.model_input,
            loss_fn_inputs={**d.loss_fn_inputs, "advantages": [factor * x for x in d.loss_fn_inputs["advantages"]]},
        )
        for d in data
    ]


def _close(got: list[list[float]], want: list[list[float]]) -> bool:
    pairs = zip(got, want, strict=True)
    return all(torch.allclose(torch.tensor(g), torch.tensor(w), rtol=0, atol=1e-4) for g, w in pairs)


def test_a_sessions_numbers_in_a_mixed_pass_are_its_own(
    resident: ResidentBase, open_session: Callable[..., TrainingSession], sft: Callable[..., Datum]
) -> None:
    a, b = open_session(**ATTENTION_ONLY), open_session(**{**ATTENTION_ONLY, "seed": 1})
    _trained(a, 1)
    _trained(b, 2)
    assert can_mix(resident.model, [a.session_id, b.session_id])
    data_a, data_b = _rl_data(sft, 100), _rl_data(sft, 2100)

    plain = resident._score(a.session_id, ScoreRequest.of(resident.limits, data_a, "ppo", None), backward=True)
    grads_plain = _grads(a)
    _clear(a, b)
    alone = resident.forward_backward_many([_call(resident, a, data_a, "ppo")])[0]
    grads_alone = _grads(a)
    assert alone.logprobs == plain.logprobs and alone.metrics == plain.metrics
    assert grads_alone.keys() == grads_plain.keys()
    assert all(torch.equal(grads_plain[name], grad) for name, grad in grads_alone.items())

    runs = []
    for other_loss, factor in (("importance_sampling", 1.0), ("importance_sampling", 1000.0), ("ppo", -3.0)):
        _clear(a, b)
        results = resident.forward_backward_many(
            [_call(resident, a, data_a, "ppo"), _call(resident, b, _scaled(data_b, factor), other_loss)]
        )
        runs.append((results, _grads(a), _grads(b)))
    (first, grads_a, grads_b), *others = runs
    for results, other_grads_a, other_grads_b in others:  # exact: b's loss does not reach a
        assert results[0].logprobs == first[0].logprobs and results[0].metrics == first[0].metrics
        assert all(torch.equal(grads_a[name], grad) for name, grad in other_grads_a.items())
        assert not torch.equal(other_grads_b[next(iter(grads_b))], grads_b[next(iter(grads_b))])
    # Against the pass alone: the same to float32 rounding, for both sessions.
    assert _close(first[0].logprobs, alone.logprobs)
    for name, grad in grads_alone.items():
        assert torch.allclose(grads_a[name], grad, rtol=1e-3, atol=1e-6), name
    _clear(a, b)
    b_alone = resident.forward_backward_many([_call(resident, b, data_b, "importance_sampling")])[0]
    assert _close(first[1].logprobs, b_alone.logprobs)
    for name, grad in _grads(b).items():
        assert torch.allclose(grads_b[name], grad, rtol=1e-3, atol=1e-6), name


def test_a_batch_invariant_base_gives_each_session_the_bits_of_its_batch_alone(
    spec: BaseModelSpec, base_cache: Path, sft: Callable[..., Datum]
) -> None:
    resident = ResidentBase(spec, base_cache, mix_backward=True, batch_invariant=True)
    a = resident.create_session(LoraOptions.model_validate(ATTENTION_ONLY))
    b = resident.create_session(LoraOptions.model_validate({**ATTENTION_ONLY, "seed": 1}))
    _trained(a, 1)
    _trained(b, 2)
    # b's batch is wider than a's (its own padded width, 39 positions against 22) and larger.
    data_a = _rl_data(sft, 100)
    data_b = [*_rl_data(sft, 2100), *_rl_data(sft, 3100)[1:], _rl_datum(sft, [(7 * j) % 4000 + 5 for j in range(40)])]
    calls = {a: _call(resident, a, data_a, "ppo"), b: _call(resident, b, data_b, "importance_sampling")}
    alone = {}
    for session, call in calls.items():
        _clear(a, b)
        alone[session] = (resident.forward_backward_many([call])[0], _grads(session))
    for order in ((a, b), (b, a)):
        _clear(a, b)
        results = resident.forward_backward_many([calls[session] for session in order])
        for session, result in zip(order, results, strict=True):
            output, grads = alone[session]
            assert result.logprobs == output.logprobs and result.metrics == output.metrics
            assert _grads(session).keys() == grads.keys()
            assert all(torch.equal(grads[name], grad) for name, grad in _grads(session).items()), order
    # And the pass was one mixed pass, not the sessions one after another.
    assert can_mix(resident.model, [a.session_id, b.session_id])


def test_sessions_that_adapt_the_experts_run_one_after_another_with_the_same_results(
    resident: ResidentBase, open_session: Callable[..., TrainingSession], sft: Callable[..., Datum]
) -> None:
    a, b = open_session(seed=3), open_session(seed=4)  # train_mlp on a MoE base: parameter LoRA
    assert not can_mix(resident.model, [a.session_id, b.session_id])
    data = _rl_data(sft, 300)
    together = resident.forward_backward_many(
        [_call(resident, a, data, "cross_entropy"), _call(resident, b, data, "cross_entropy")]
    )
    grads_a = _grads(a)
    _clear(a, b)
    alone = resident.forward_backward_many([_call(resident, a, data, "cross_entropy")])[0]
    assert together[0].logprobs == alone.logprobs  # one after another: exactly as alone
    assert all(torch.equal(grads_a[name], grad) for name, grad in _grads(a).items())


def test_concurrent_forward_backward_calls_share_a_pass_and_train_as_they_would_alone(
    resident: ResidentBase, open_session: Callable[..., TrainingSession], sft: Callable[..., Datum]
) -> None:
    sessions = [open_session(**{**ATTENTION_ONLY, "seed": 10 + i}) for i in range(3)]
    data = [_rl_data(sft, 500 * (i + 1)) for i in range(3)]
    expected = []
    for session, batch in zip(sessions, data, strict=True):
        expected.append(resident.forward_backward_many([_call(resident, session, batch, "importance_sampling")])[0])
        _clear(session)
    combiner = resident.backward_passes
    passes, largest = combiner.batches_run, combiner.largest_batch
    results: dict[int, ForwardOutput] = {}

    def run(i: int) -> None:
        results[i] = sessions[i].forward_backward(data[i], "importance_sampling")

    # While this thread holds the base's lock, the first call to arrive leads a pass that cannot
    # start; the other two queue behind it and then run together in the next pass.
    with resident._lock:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        assert combiner.waiting(2, timeout_s=60)
    for thread in threads:
        thread.join()
    assert combiner.batches_run - passes == 2
    assert combiner.largest_batch == max(largest, 2)
    for i, session in enumerate(sessions):
        assert _close(results[i].logprobs, expected[i].logprobs)
        assert session.optim_step(AdamParams(learning_rate=1e-3))["grad_norm:mean"] > 0


def test_bad_data_fail_only_their_own_call(
    resident: ResidentBase, open_session: Callable[..., TrainingSession], sft: Callable[..., Datum]
) -> None:
    a = open_session(**ATTENTION_ONLY)
    with pytest.raises(Exception, match="lacks loss_fn_inputs"):
        a.forward_backward([sft([5, 6, 7, 8])], "ppo")
    assert a.forward_backward(_rl_data(sft, 9), "ppo").logprobs


def test_sessions_sampling_together_decode_as_they_would_alone(
    resident: ResidentBase, open_session: Callable[..., TrainingSession]
) -> None:
    a, b = open_session(**ATTENTION_ONLY), open_session(**{**ATTENTION_ONLY, "seed": 1})
    _trained(a, 1)
    _trained(b, 2)
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    prompts = [[17, 932, 4401, 88], [5, 19000, 23, 23, 640, 12, 7], [3001, 42]]
    calls = [
        SampleCall(a.session_id, [SampleRequest(prompts[0], params, 3), SampleRequest(prompts[1], params, 2)]),
        SampleCall(None, [SampleRequest(prompts[2], params, 2)]),
        SampleCall(b.session_id, [SampleRequest(prompts[1], params.model_copy(update={"max_tokens": 3}), 2)]),
    ]
    together = resident.sample_many(calls)
    for call, got in zip(calls, together, strict=True):
        alone = resident.sample_batch(call.adapter, call.requests)
        version = resident.get(call.adapter).version if call.adapter else "base"
        for got_group, alone_group in zip(got, alone, strict=True):
            assert [s.tokens for s in got_group] == [s.tokens for s in alone_group]
            assert _close([s.logprobs for s in got_group], [s.logprobs for s in alone_group])
            assert {s.adapter_version for s in got_group} == {version}
    # The adapters did act: a's and b's samples of the same prompt differ from each other.
    assert [s.tokens for s in together[0][1]] != [s.tokens for s in together[2][0]]


def format_prompts(resident: ResidentBase) -> list[Any]:
    """Four prompts of the built-in `format` benchmark, graded by a capital first letter."""
    from mint.chat.render import render_prompt
    from mint.evals.builtin import load_builtin
    from mint.evals.graders import GraderSpec
    from mint.trainer.recipes.rl import RlPrompt

    grader = GraderSpec(type="regex", config={"pattern": "^[A-Z]", "mode": "search"})
    return [
        RlPrompt(render_prompt(resident.tokenizer, task.messages), None, grader)
        for task in load_builtin("format", "train", 4, seed=0)
    ]


def test_rl_runs_of_two_sessions_at_once_share_their_sampling_passes(
    resident: ResidentBase, open_session: Callable[..., TrainingSession]
) -> None:
    from mint.trainer.recipes.rl import RlConfig, run_rl

    prompts = format_prompts(resident)
    sessions = [open_session(**{**ATTENTION_ONLY, "seed": 20 + i}) for i in range(2)]
    config = RlConfig(steps=3, prompts_per_step=2, group_size=4, max_tokens=3, learning_rate=5e-3)
    reports: dict[int, list[object]] = {}
    passes = resident.sampling_passes.batches_run

    def run(i: int) -> None:
        reports[i] = run_rl(sessions[i], prompts, config, tokenizer=resident.tokenizer)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [len(reports[i]) for i in range(2)] == [3, 3]
    # Both runs' sampling shared passes: fewer than one per run and step. (Not always all of
    # them: a run that starts first samples its first step before the other has joined.)
    assert resident.sampling_passes.batches_run - passes < 6
    assert resident.sampling_passes.largest_batch >= 2


def test_rl_runs_at_once_have_their_passes_run_on_the_thread_that_started_them(
    resident: ResidentBase, open_session: Callable[..., TrainingSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run_at_once`: each run on a thread of its own, every sampling and forward_backward pass on
    the calling thread (the one OpenMP pool of the process), the runs' own torch ops on one core."""
    from mint.trainer.recipes.rl import RlConfig, run_rl

    prompts = format_prompts(resident)
    sessions = [open_session(**{**ATTENTION_ONLY, "seed": 30 + i}) for i in range(2)]
    config = RlConfig(steps=2, prompts_per_step=2, group_size=4, max_tokens=3, learning_rate=5e-3)
    ran_on: list[str] = []
    loop_threads: dict[str, int] = {}
    for combiner in (resident.sampling_passes, resident.backward_passes):
        run_many = combiner._run_many

        def recorded(requests: Any, run_many: Any = run_many) -> Any:
            ran_on.append(threading.current_thread().name)
            return run_many(requests)

        monkeypatch.setattr(combiner, "_run_many", recorded)

    def run(i: int) -> list[object]:
        loop_threads[threading.current_thread().name] = torch.get_num_threads()
        return run_rl(sessions[i], prompts, config, tokenizer=resident.tokenizer)

    reports = resident.run_at_once([functools.partial(run, i) for i in range(2)])
    assert [len(report) for report in reports] == [2, 2]
    assert ran_on and set(ran_on) == {threading.current_thread().name}
    assert loop_threads == {"loop-0": 1, "loop-1": 1}
    assert len(ran_on) < 8  # 2 runs x 2 steps x (sampling + forward_backward), some shared


def test_run_at_once_returns_each_loops_result_and_raises_a_failed_ones_error_after_all_end(
    resident: ResidentBase,
) -> None:
    assert resident.run_at_once([lambda: "a", lambda: "b"]) == ["a", "b"]
    ended: list[str] = []

    def failing() -> None:
        ended.append("failing")
        raise ValueError("this loop failed")

    with pytest.raises(ValueError, match="this loop failed"):
        resident.run_at_once([failing, lambda: ended.append("other")])
    assert sorted(ended) == ["failing", "other"]

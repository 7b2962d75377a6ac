"""Sessions on one resident base: isolation, memory, forward, packing, custom losses, the
optimizer, and both kinds of checkpoint."""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from mint.config import Settings
from mint.errors import Conflict, InvalidRequest, NotFound
from mint.schemas.base_models import BaseModelSpec
from mint.trainer import checkpoint
from mint.trainer.head_logprobs import token_logprobs
from mint.trainer.lora import wrapped_targets
from mint.trainer.models import load_base_model
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import TrainingSession
from mint.trainer.types import AdamParams, Datum, ForwardOutput
from mint.worker.resident import base_options

pytestmark = pytest.mark.backend_free

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

ADAM = AdamParams(learning_rate=1e-2)


def train(session: TrainingSession, data: list[Datum], steps: int = 1, adam: AdamParams = ADAM) -> None:
    for _ in range(steps):
        session.forward_backward(data, "cross_entropy")
        session.optim_step(adam)


def snapshot(session: TrainingSession) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in session.named_parameters().items()}


def clear_grads(session: TrainingSession) -> None:
    for parameter in session.named_parameters().values():
        parameter.grad = None


def live_moments(session: TrainingSession) -> list[torch.Tensor]:
    """The live Adam moment tensors of a session's optimizer (not copies)."""
    optimizer = session._live_optimizer()._adamw
    return [state["exp_avg"] for state in optimizer.state.values()]


def max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b, strict=True) for x, y in zip(row_a, row_b, strict=True))


def test_forward_gives_one_finite_logprob_per_position(
    open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    output = open_session().forward(toy_data)
    assert [len(row) for row in output.logprobs] == [d.length for d in toy_data]
    assert all(torch.isfinite(torch.tensor(row)).all() and max(row) <= 0 for row in output.logprobs)
    assert output.metrics == {"tokens:sum": float(sum(d.length for d in toy_data))}


def test_packed_logprobs_equal_one_forward_per_datum(
    open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    session = open_session(seed=4)
    train(session, toy_data)  # a non-zero adapter, so the LoRA paths count too
    packed = session.forward(toy_data).logprobs
    one_by_one = [session.forward([datum]).logprobs[0] for datum in toy_data]
    assert max_gap(packed, one_by_one) < 1e-5


def test_a_pass_runs_its_decoder_layers_on_real_tokens_only_with_the_numbers_of_padded_rows(
    resident: ResidentBase,
    open_session: Callable[..., TrainingSession],
    toy_data: list[Datum],
    request: pytest.FixtureRequest,
) -> None:
    """Data of unequal lengths run end to end through the decoder's layers (only attention sees
    them as padded rows): a layer sees the data's real tokens, not B x L positions, and the
    logprobs and LoRA gradients are those of one datum per padded row."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from mint.trainer.packing import pack, packed_logprobs

    session = open_session(seed=4)
    train(session, toy_data)  # a non-zero adapter, so the LoRA paths count too
    layer = next(m for m in resident.model.modules() if isinstance(m, GradientCheckpointingLayer))
    seen: list[int] = []
    hook = layer.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[:-1].numel()))
    request.addfinalizer(hook.remove)

    def backward_pass(end_to_end: bool) -> tuple[list[list[float]], dict[str, torch.Tensor]]:
        clear_grads(session)
        with resident._use(session.session_id) as model:
            logprobs = packed_logprobs(model, pack(toy_data, resident.device, share_prefixes=end_to_end))
            torch.cat(logprobs).sum().backward()
        grads = {name: p.grad.clone() for name, p in session.named_parameters().items() if p.grad is not None}
        return [lp.detach().tolist() for lp in logprobs], grads

    rows_logprobs, rows_grads = backward_pass(end_to_end=False)
    assert seen == [len(toy_data) * max(d.length for d in toy_data)]
    seen.clear()
    logprobs, grads = backward_pass(end_to_end=True)
    assert seen == [sum(d.length for d in toy_data)]
    assert max_gap(logprobs, rows_logprobs) < 1e-5
    assert grads.keys() == rows_grads.keys() and grads
    for name, grad in grads.items():
        assert torch.allclose(grad, rows_grads[name], rtol=1e-4, atol=1e-6), name


def test_a_large_pass_recomputes_each_layer_in_the_backward_with_the_same_numbers(
    resident: ResidentBase,
    open_session: Callable[..., TrainingSession],
    toy_data: list[Datum],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """In a large pass (activations above `LARGE_PASS_ACTIVATION_BYTES`) each decoder layer runs
    twice (forward, then again in the backward) and keeps only its input; logprobs, loss and
    gradients stay those of the plain pass, LoRA dropout included (its masks are replayed), and
    the layers leave as they came."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from mint.trainer import packing

    session = open_session(seed=4, train_mlp=False, train_experts=False, dropout=0.1)
    train(session, toy_data)
    layer = next(m for m in resident.model.modules() if isinstance(m, GradientCheckpointingLayer))
    calls: list[int] = []
    # transformers replays the layer's `forward`, not its `__call__`: a hook on a part of it sees the replay.
    hook = next(layer.children()).register_forward_hook(lambda *args: calls.append(1))
    request.addfinalizer(hook.remove)

    def backward_pass() -> tuple[ForwardOutput, dict[str, torch.Tensor]]:
        clear_grads(session)
        torch.manual_seed(7)  # the same dropout masks in both passes
        output = session.forward_backward(toy_data, "cross_entropy")
        return output, {name: p.grad.clone() for name, p in session.named_parameters().items() if p.grad is not None}

    plain, plain_grads = backward_pass()
    assert len(calls) == 1
    calls.clear()
    monkeypatch.setattr(packing, "LARGE_PASS_ACTIVATION_BYTES", 0)
    recomputed, grads = backward_pass()
    assert len(calls) == 2  # the forward, and its replay in the backward
    assert max_gap(recomputed.logprobs, plain.logprobs) < 1e-6
    assert recomputed.metrics["loss:sum"] == pytest.approx(plain.metrics["loss:sum"], rel=1e-6)
    assert grads.keys() == plain_grads.keys() and grads
    for name, grad in grads.items():
        assert torch.allclose(grad, plain_grads[name], rtol=1e-4, atol=1e-7), name
    assert not layer.training and not layer.gradient_checkpointing


def test_eight_sessions_share_the_base_and_stay_isolated(
    resident: ResidentBase, open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    base_weights = {n: p for n, p in resident.model.named_parameters() if "lora_" not in n}
    base_before = resident.forward(toy_data).logprobs
    sessions = [open_session(seed=i) for i in range(8)]
    assert [s.session_id for s in resident.sessions] == [s.session_id for s in sessions]
    # The base is shared, not copied: the same frozen tensors.
    assert {n: p for n, p in resident.model.named_parameters() if "lora_" not in n} == base_weights
    assert not any(p.requires_grad for p in base_weights.values())

    untouched = [snapshot(s) for s in sessions[1:]]
    outputs_before = [s.forward(toy_data).logprobs for s in sessions[1:]]
    # Gradients accumulate per adapter, even when another session runs in between.
    sessions[0].forward_backward(toy_data, "cross_entropy")
    grads_0 = {n: p.grad.clone() for n, p in sessions[0].named_parameters().items() if p.grad is not None}
    sessions[1].forward_backward(toy_data[:1], "cross_entropy")
    assert all(torch.equal(sessions[0].named_parameters()[n].grad, g) for n, g in grads_0.items())
    clear_grads(sessions[1])
    sessions[0].optim_step(ADAM)

    assert max_gap(sessions[0].forward(toy_data).logprobs, base_before) > 1e-3
    for session, weights, before in zip(sessions[1:], untouched, outputs_before, strict=True):
        assert all(torch.equal(p, weights[n]) for n, p in session.named_parameters().items())
        assert session.forward(toy_data).logprobs == before
    assert resident.forward(toy_data).logprobs == base_before

    # Memory of one more session: its adapter, its gradients while they accumulate, two Adam moments.
    sessions[0].forward_backward(toy_data, "cross_entropy")
    memory = sessions[0].memory_bytes()
    adapter_bytes = sum(p.numel() * p.element_size() for p in sessions[0].named_parameters().values())
    assert memory == {"adapter": adapter_bytes, "gradients": adapter_bytes, "optimizer": 2 * adapter_bytes}
    assert sessions[0].memory_bytes()["adapter"] == sessions[7].memory_bytes()["adapter"]
    print(f"\nper extra session (tiny-glm-moe, defaults): {memory} = {sum(memory.values())} bytes at peak")


def test_closing_a_session_deletes_its_adapter(
    resident: ResidentBase, open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    kept, closed = open_session(), open_session()
    train(closed, toy_data)
    # Weak references: nothing may keep the adapter's tensors or moments alive after close.
    lora_b = weakref.ref(next(p for n, p in closed.named_parameters().items() if ".lora_B." in n))
    moment = weakref.ref(next(iter(live_moments(closed))))
    resident.close(closed.session_id)
    gc.collect()
    assert lora_b() is None and moment() is None
    assert closed.closed and closed.named_parameters() == {}
    assert not any(f".{closed.session_id}." in name for name, _ in resident.model.named_parameters())
    with pytest.raises(NotFound):
        resident.get(closed.session_id)
    with pytest.raises(NotFound):
        closed.forward(toy_data)
    assert kept.forward(toy_data).logprobs == resident.forward(toy_data).logprobs


def test_session_ids_and_the_session_limit(
    spec: BaseModelSpec, base_cache: Path, resident: ResidentBase, open_session: Callable[..., TrainingSession]
) -> None:
    named = resident.create_session(session_id="run-1")
    assert resident.get("run-1") is named
    for bad in ("a.b", "lora", "x", "model"):
        with pytest.raises(InvalidRequest):
            resident.create_session(session_id=bad)
    with pytest.raises(Conflict):
        resident.create_session(session_id="run-1")
    limit, resident.max_sessions = resident.max_sessions, 2
    try:
        open_session()
        with pytest.raises(Conflict, match="close one"):
            open_session()
    finally:
        resident.max_sessions = limit
    assert ResidentBase.shared(spec, base_cache) is ResidentBase.shared(spec, base_cache)


def test_a_workers_settings_choose_how_its_base_mixes_sessions(
    spec: BaseModelSpec, base_cache: Path, tmp_path: Path
) -> None:
    default = base_options(Settings(home=tmp_path))
    assert default == {"max_sessions": 64, "mix_backward": None, "batch_invariant": False}
    chosen = base_options(Settings(home=tmp_path, worker_mix_backward=True, worker_batch_invariant=True))
    base = ResidentBase(spec, base_cache, **chosen)
    assert base.mix_backward and base.batch_invariant
    assert base.model.config._experts_implementation == "eager"  # experts as per-expert `linear`, tiled
    assert not ResidentBase(spec, base_cache, **default).mix_backward  # a CPU base runs calls one by one


def test_expert_lora_weights_get_gradients_and_change(
    open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    session = open_session(seed=5)
    experts = {n: p for n, p in session.named_parameters().items() if ".mlp.experts." in n}
    assert len(experts) == 3 * 4  # 3 MoE layers x (gate_up_proj, down_proj) x (A, B)
    before = {n: p.detach().clone() for n, p in experts.items()}
    session.forward_backward(toy_data, "cross_entropy")
    # B starts at zero, so only B has a gradient at first; A follows once B has moved.
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in experts.items() if ".lora_B." in n)
    session.optim_step(ADAM)
    train(session, toy_data)
    assert all(not torch.equal(p, before[n]) for n, p in experts.items())


def test_custom_loss_matches_cross_entropy(open_session: Callable[..., TrainingSession], toy_data: list[Datum]) -> None:
    session = open_session(seed=6)
    train(session, toy_data)  # non-zero B, so every LoRA weight has a gradient
    builtin = session.forward_backward(toy_data, "cross_entropy")
    builtin_grads = {n: p.grad.clone() for n, p in session.named_parameters().items()}
    clear_grads(session)

    def negative_weighted_logprob(
        data: list[Datum], logprobs: list[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        loss = sum(
            -(torch.tensor(d.loss_fn_inputs["weights"]) * lp).sum() for d, lp in zip(data, logprobs, strict=True)
        )
        assert isinstance(loss, torch.Tensor)
        return loss, {"custom_calls:sum": 1.0}

    custom = session.forward_backward_custom(toy_data, negative_weighted_logprob)
    assert custom.metrics["loss:sum"] == pytest.approx(builtin.metrics["loss:sum"], rel=1e-6)
    assert custom.metrics["custom_calls:sum"] == 1.0
    assert custom.logprobs == builtin.logprobs
    for name, parameter in session.named_parameters().items():
        assert parameter.grad is not None
        assert torch.allclose(parameter.grad, builtin_grads[name], atol=1e-6, rtol=0), name
    clear_grads(session)
    with pytest.raises(InvalidRequest, match="exactly one ':'"):
        session.forward_backward_custom(toy_data, lambda data, logprobs: (logprobs[0].sum(), {"bad": 1.0}))


def test_optim_step_clips_the_gradient_norm(
    tmp_path: Path, open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    # With a huge eps Adam's first step is lr * g / eps: an update proportional to the (clipped) gradient.
    linear_adam = {"learning_rate": 1.0, "eps": 1e3}
    steps = {}
    for clip in (0.0, 0.5):
        session = open_session(seed=7)
        before = snapshot(session)
        session.forward_backward(toy_data, "cross_entropy")
        metrics = session.optim_step(AdamParams(grad_clip_norm=clip, **linear_adam))
        after = session.named_parameters()
        steps[clip] = torch.linalg.vector_norm(torch.cat([(after[n] - before[n]).flatten() for n in before])).item()
        assert session.step == 1
        assert all(p.grad is None for p in after.values())
        # The first moment is (1 - beta1) * g: its norm shows the clipped gradient.
        moments = checkpoint.read_state(session.save_state(tmp_path / f"clip-{clip}")).optimizer
        first_moment = torch.cat([t.flatten() for k, t in moments.items() if k.startswith("exp_avg/")])
        grad_norm = metrics["grad_norm:mean"]
        expected = 0.1 * (min(grad_norm, clip) if clip else grad_norm)
        assert torch.linalg.vector_norm(first_moment).item() == pytest.approx(expected, rel=1e-4)
    assert grad_norm > 5 * 0.5  # the clip really bites
    assert steps[0.5] <= 0.5 / 1e3 * 1.001 < steps[0.0]


def test_weight_decay_is_decoupled(open_session: Callable[..., TrainingSession], toy_data: list[Datum]) -> None:
    session = open_session(seed=8)
    before = snapshot(session)
    # Zero weights on a fresh optimizer: zero gradients and moments, so Adam's update is 0 and
    # only the decay acts (on A; B is still 0).
    silent = [
        Datum(model_input=d.model_input, loss_fn_inputs={"target_tokens": d.target_tokens, "weights": [0.0] * d.length})
        for d in toy_data
    ]
    session.forward_backward(silent, "cross_entropy")
    session.optim_step(AdamParams(learning_rate=0.1, weight_decay=0.5))
    for name, parameter in session.named_parameters().items():
        assert torch.allclose(parameter, before[name] * (1 - 0.1 * 0.5), atol=1e-7, rtol=1e-6), name


def test_save_and_load_state_resumes_exactly(
    tmp_path: Path, resident: ResidentBase, open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    adam = AdamParams(learning_rate=1e-2, weight_decay=0.01, grad_clip_norm=5.0)
    straight = open_session(seed=9)
    train(straight, toy_data, steps=3, adam=adam)

    first_leg = open_session(seed=9)
    train(first_leg, toy_data, steps=1, adam=adam)
    folder = first_leg.save_state(tmp_path / "state")
    assert sorted(p.name for p in folder.iterdir()) == ["adapter.safetensors", "optimizer.safetensors", "state.json"]
    assert json.loads((folder / "state.json").read_text())["step"] == 1
    resident.close(first_leg.session_id)

    resumed = resident.create_session_from_state(folder)
    assert resumed.step == 1
    train(resumed, toy_data, steps=2, adam=adam)
    assert resumed.step == straight.step == 3
    expected = straight.named_parameters()
    for name, parameter in resumed.named_parameters().items():
        assert torch.allclose(parameter, expected[name], atol=1e-6, rtol=0), name

    # load_state into a session of the same shape works too; another rank is refused.
    same_shape = open_session(seed=0)
    same_shape.load_state(folder)
    assert same_shape.step == 1
    with pytest.raises(InvalidRequest, match="rank"):
        open_session(rank=4).load_state(folder)


def test_sampler_weights_load_with_plain_peft(
    tmp_path: Path,
    spec: BaseModelSpec,
    base_cache: Path,
    resident: ResidentBase,
    open_session: Callable[..., TrainingSession],
    toy_data: list[Datum],
) -> None:
    session = open_session(seed=10)
    train(session, toy_data, steps=2)
    folder = session.save_weights_for_sampler(tmp_path / "sampler")
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    # Only LoRA tensors: the unchanged base lm_head is not copied in.
    assert all(".lora_" in key for key in load_file(folder / "adapter_model.safetensors"))

    fresh_base, _ = load_base_model(spec, base_cache)
    reloaded = PeftModel.from_pretrained(fresh_base, folder)
    # Loading did not rewrite the dense-MLP parameter targets into the experts (the MoE trap).
    assert wrapped_targets(reloaded, "default") == (session.targets.modules, session.targets.parameters)
    input_ids = torch.tensor([toy_data[2].model_input])
    with torch.no_grad():
        expected = reloaded(input_ids=input_ids).logits[0]
        with resident._use(session.session_id) as model:
            actual = model(input_ids=input_ids).logits[0]
    assert torch.allclose(actual, expected, atol=1e-5, rtol=0)
    assert session.forward(toy_data[2:]).logprobs[0] == pytest.approx(
        token_logprobs(expected, torch.tensor(toy_data[2].target_tokens)).tolist(), abs=1e-5
    )


def test_a_large_pass_gives_freed_blocks_back_to_the_system() -> None:
    """200 MB of 2 MB tensors freed during a large pass have left the process's resident memory
    when the pass ends, however much the heaps held before it (glibc maps such blocks on their
    own in a fresh heap, and the pass trims what it reused); `bench/pass_memory.py` measures the
    peak of a whole pass."""
    import os
    import sys

    from mint.trainer.host_memory import can_return_memory, returning_large_blocks

    assert can_return_memory() is sys.platform.startswith("linux")

    def resident_mb() -> float:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    with returning_large_blocks():
        blocks = [torch.ones(512 * 1024) for _ in range(100)]  # 2 MB each, every page written
        held = resident_mb()
        del blocks
    assert held - resident_mb() > 150


ARENA_PROBE = """
import ctypes, sys, threading
from mint.trainer import host_memory
if sys.argv[1] == "one":
    host_memory.share_one_arena()
kept = []
def allocate():
    kept.append([bytearray(4096) for _ in range(64)])  # small blocks: from the thread's arena
threads = [threading.Thread(target=allocate) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ctypes.CDLL("libc.so.6").malloc_stats()  # one "Arena N:" section per arena, on stderr
"""


def test_a_resident_base_keeps_its_threads_on_one_heap() -> None:
    """Threads that allocate share the main heap once `share_one_arena` ran (every ResidentBase
    runs it first), where each would otherwise get an arena of its own that keeps what a pass
    freed (measured: 4 RL jobs at once peaked at 6.9 GB with their arenas, 3.5 GB without)."""
    import subprocess
    import sys

    from mint.trainer.host_memory import can_return_memory

    assert can_return_memory()  # glibc, whose arenas this is about

    def arenas(mode: str) -> int:
        probe = subprocess.run([sys.executable, "-c", ARENA_PROBE, mode], capture_output=True, text=True, check=True)
        return probe.stderr.count("Arena ")

    assert arenas("default") > 1  # the probe sees the arenas that threads get
    assert arenas("one") == 1

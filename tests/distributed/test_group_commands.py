"""What a worker group's followers accept on the command channel (`mint.trainer.group`).

The channel is torch.distributed's and authenticates no one, so a follower decodes a command
with a restricted unpickler: only Mint's call types as globals, tensors as typed bytes, losses
by registry name, bases and sessions by reference, and only mirrored methods as the call. A
payload naming anything else (`os.system`, `builtins.eval`, torch's own tensor pickling, whose
storages run `torch.load` on a nested pickle) is refused before any of it runs. Every real
mirrored call of a base and its sessions still crosses the channel intact: here rank 0's
commands are encoded and decoded in one process, exactly as a follower would decode them.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from mint.config import PROJECT_ROOT
from mint.schemas.base_models import get_base_model_spec
from mint.trainer.group import (
    MIRRORED_METHODS,
    ForbiddenCommand,
    Group,
    decode_command,
    encode_command,
)
from mint.trainer.prompt_scores import PromptQuery
from mint.trainer.session import ResidentBase
from mint.trainer.types import AdamParams, Datum, LoraOptions, SampleRequest, SamplingParams

pytestmark = [pytest.mark.torch, pytest.mark.backend_free]

BASE = "tiny-glm-moe"


def no_references(ref: tuple[str, ...]) -> Any:
    raise AssertionError(f"nothing here should be resolved, got {ref!r}")


class RunsShell:
    """What an attacker pickles: unpickling it would run a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


class Evaluates:
    def __reduce__(self) -> tuple[Any, ...]:
        return (eval, ("__import__('os').getcwd()",))


def test_a_command_naming_os_system_is_refused_before_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = pickle.dumps(("optim_step", None, (RunsShell(f"touch {marker}"),), {}))
    with pytest.raises(ForbiddenCommand, match=r"names (posix|os|nt)\.system, which is not one of Mint's call types"):
        decode_command(payload, no_references)
    assert not marker.exists()
    # The same payload as a whole message, and other globals an attacker would reach for.
    with pytest.raises(ForbiddenCommand, match="system"):
        decode_command(pickle.dumps(RunsShell(f"touch {marker}")), no_references)
    with pytest.raises(ForbiddenCommand, match=r"builtins\.eval"):
        decode_command(pickle.dumps(("close", None, (Evaluates(),), {})), no_references)
    with pytest.raises(ForbiddenCommand, match=r"builtins\.getattr"):  # a bound method pickles as getattr(obj, name)
        decode_command(pickle.dumps(("close", None, ("text".upper,), {})), no_references)
    assert not marker.exists()


def test_torch_pickling_of_tensors_is_refused_and_tensors_travel_as_typed_bytes() -> None:
    # torch's own pickling rebuilds a storage with torch.load over a nested pickle: refused.
    with pytest.raises(ForbiddenCommand, match="not one of Mint's call types"):
        decode_command(pickle.dumps(("_set_state", None, (torch.ones(3),), {})), no_references)
    tensors = {
        "float": torch.randn(2, 3),
        "bf16": torch.randn(4, 2).to(torch.bfloat16),
        "ids": torch.arange(5),
        "flag": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "leaf": torch.zeros(3, requires_grad=True),
        "view": torch.arange(12.0).reshape(3, 4)[:, 1],
    }
    name, _, args, kwargs = decode_command(encode_command(("_set_state", None, (tensors,), {"step": 3})), no_references)
    assert (name, kwargs) == ("_set_state", {"step": 3})
    for key, sent in tensors.items():
        got = args[0][key]
        assert (got.dtype, got.shape, got.requires_grad) == (sent.dtype, sent.shape, sent.requires_grad), key
        assert torch.equal(got.detach(), sent.detach()), key


def test_commands_that_are_not_mirrored_calls_or_known_references_are_refused() -> None:
    # A method that is not mirrored (save_state writes files where it is told).
    with pytest.raises(ForbiddenCommand, match="'save_state', which is not a mirrored method"):
        decode_command(encode_command(("save_state", None, ("/tmp/x",), {})), no_references)
    with pytest.raises(ForbiddenCommand, match="is \\(method name, target, args, kwargs\\)"):
        decode_command(encode_command(["optim_step"]), no_references)

    def crafted(pid: Any) -> bytes:
        class WithReference(pickle.Pickler):
            def persistent_id(self, obj: Any) -> Any:
                return pid if obj == "here" else None

        buffer = io.BytesIO()
        WithReference(buffer, protocol=5).dump(("close", "here", (), {}))
        return buffer.getvalue()

    for pid, refused in (
        (("module", "os"), "unknown kind 'module'"),
        (("loss", "no_such_loss"), "unknown loss 'no_such_loss'"),
        (("method", ("base",), "save_state"), "unknown kind 'method'"),
        (("tensor", "float32", (4,), b"\0" * 3, "cpu", False), "do not match its shape"),
        (("tensor", "Tensor", (1,), b"\0" * 4, "cpu", False), "unknown dtype 'Tensor'"),
        (("object", ("session",)), "no base or session here"),
    ):
        with pytest.raises(ForbiddenCommand, match=refused):
            decode_command(crafted(pid), lambda ref: {("base",): object()}[ref])
    with pytest.raises(ForbiddenCommand, match="cannot be read"):
        decode_command(encode_command(("close", None, ("s",), {}))[:-3], no_references)


class LoopbackGroup(Group):
    """Rank 0 of a group whose follower is this very process: each command is encoded as
    `Group.send` would put it on the channel and decoded as `Group.receive` would read it. It
    counts as one rank, so that its passes run whole (no process group exists to split them)."""

    def __init__(self, resolve: Any) -> None:
        super().__init__(rank=0, world_size=1, device=torch.device("cpu"), commands=None, mesh=None)
        self.resolve = resolve
        self.sent: list[tuple[Any, Any]] = []

    def send(self, message: Any) -> None:
        self.sent.append((message, decode_command(encode_command(message), self.resolve)))


def same(a: Any, b: Any) -> bool:
    """Deep equality that compares tensors by dtype, shape and value."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.fixture(scope="module")
def grouped_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ResidentBase, LoopbackGroup]]:
    """The tiny base (float32, CPU) as rank 0 of a loopback group: every mirrored call is sent."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    spec = get_base_model_spec(BASE, PROJECT_ROOT / "configs" / "models")
    base = ResidentBase(spec, tmp_path_factory.mktemp("bases"))
    group = LoopbackGroup(base._resolve_ref)
    base.group = group  # no FSDP sharding: only the command channel is under test
    yield base, group
    torch.set_num_threads(previous)


def test_every_mirrored_call_round_trips_through_the_command_codec(
    grouped_base: tuple[ResidentBase, LoopbackGroup], tmp_path: Path
) -> None:
    base, group = grouped_base
    tokens = [5, 17, 932, 44, 88, 1203, 7, 311]
    datum = Datum(
        model_input=tokens[:-1], loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)}
    )
    session = base.create_session(LoraOptions(rank=4, seed=3, dropout=0.1, train_mlp=False, train_experts=False))
    session.forward([datum], "cross_entropy")
    base.evaluate(session.session_id, [datum], "cross_entropy", None, backward=False, train_mode=session._lora_dropout)
    session.forward_backward([datum], "cross_entropy")
    session.optim_step(AdamParams(learning_rate=1e-2))
    base.score_prompt(session.session_id, PromptQuery(prompt=tokens, logprobs=True, top_k=2))
    session.sample_batch([SampleRequest(prompt_tokens=tokens[:3], params=SamplingParams(max_tokens=2, stop=["x"]))])
    state = session.save_state(tmp_path / "state")
    restored = base.create_session_from_state(state)
    sampler_weights = session.save_weights_for_sampler(tmp_path / "sampler")
    from_adapter = base.create_session_from_adapter(sampler_weights)
    for opened in (restored, from_adapter, session):
        base.close(opened.session_id)

    assert {message[0] for message, _ in group.sent} == MIRRORED_METHODS
    modes = [received[3].get("train_mode") for _, received in group.sent if received[0] == "_score"]
    assert session._lora_dropout in modes  # a session's dropout context travels by reference
    for message, received in group.sent:
        name, target, args, kwargs = received
        assert name == message[0] and target is message[1], name
        assert set(kwargs) == set(message[3]), name
        if name == "forward_backward_many":  # calls hold sessions by reference, requests by value
            assert [call.session for call in args[0]] == [call.session for call in message[2][0]]
            assert [call.request for call in args[0]] == [call.request for call in message[2][0]]
        elif name == "_score":
            assert same(args, message[2]), name
            assert kwargs["backward"] == message[3]["backward"]
            sent_mode, got_mode = message[3].get("train_mode"), kwargs.get("train_mode")
            assert got_mode == sent_mode, name  # nullcontext, or the same session's bound method
        else:
            assert same(args, message[2]) and same(kwargs, message[3]), name

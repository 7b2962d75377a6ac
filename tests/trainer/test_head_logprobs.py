"""The output head's logprobs with a gradient computed only where the loss reads them.

`selective_head_logprobs` must give `token_logprobs(head(hidden))` bit for bit, and gradients
(for the hidden states and for weights trained on the head) as close to float64's as autograd's
own; its backward pass must run the head on the positions with a gradient only; and a session's
forward_backward through it must train as the checkpointed head does, to float32 rounding, with
a LoRA adapter on the head (Tinker's default) and without one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mint.trainer import packing
from mint.trainer.head_logprobs import selective_head_fits, selective_head_logprobs, token_logprobs
from mint.trainer.training_session import TrainingSession
from mint.trainer.types import Datum

pytestmark = pytest.mark.backend_free

POSITIONS, HIDDEN, VOCAB = 24, 32, 500


@contextmanager
def _head_rows(weight: torch.Tensor) -> Iterator[list[int]]:
    """How many rows each `linear` through `weight` multiplies, in order (in any thread: the
    backward pass may run in autograd's)."""
    rows: list[int] = []
    linear = F.linear

    def counting(x: torch.Tensor, w: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if w is weight:
            rows.append(x.shape[0])
        return linear(x, w, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(F, "linear", counting)
        yield rows


class _LowRankHead(nn.Module):
    """A frozen head with a trained low-rank term, as LoRA on the head computes it."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.base.weight.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(4, HIDDEN) * 0.1)
        self.b = nn.Parameter(torch.randn(VOCAB, 4) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(x, self.a), self.b)


@pytest.mark.parametrize("k", [1, 3])
def test_logprobs_are_autograds_bits_and_the_gradients_are_as_close_to_float64(k: int) -> None:
    torch.manual_seed(0)
    head = _LowRankHead()
    hidden = torch.randn(POSITIONS, HIDDEN)
    targets = torch.randint(0, VOCAB, (POSITIONS, k))
    grad = torch.randn(POSITIONS, k)
    grad[::3] = 0.0  # a third of the positions take no part in the loss

    def gradients(compute: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> list[torch.Tensor]:
        head.zero_grad()
        x = x.clone().requires_grad_()
        (compute(x) * grad.to(x.dtype)).sum().backward()
        assert x.grad is not None and head.a.grad is not None and head.b.grad is not None
        return [x.grad.double(), head.a.grad.double(), head.b.grad.double()]

    got = selective_head_logprobs(head, hidden, targets)
    assert torch.equal(got, token_logprobs(head(hidden), targets))
    mine = gradients(lambda x: selective_head_logprobs(head, x, targets), hidden)
    autograd = gradients(lambda x: token_logprobs(head(x), targets), hidden)
    head.double()
    exact = gradients(lambda x: token_logprobs(head(x), targets), hidden.double())
    for computed in (mine, autograd):
        for tensor, want in zip(computed, exact, strict=True):
            assert (tensor - want).norm() <= 1e-6 * want.norm()
    assert not mine[0][::3].any()


def test_the_backward_pass_runs_the_head_on_the_positions_with_a_gradient_only() -> None:
    head = nn.Linear(HIDDEN, VOCAB, bias=False).requires_grad_(False)
    hidden = torch.randn(POSITIONS, HIDDEN, requires_grad=True)
    targets = torch.randint(0, VOCAB, (POSITIONS, 1))
    weights = torch.zeros(POSITIONS, 1)
    weights[-5:] = 1.0  # the completion: 5 of 24 positions
    with _head_rows(head.weight) as recorded:
        (selective_head_logprobs(head, hidden, targets) * weights).sum().backward()
    assert recorded == [POSITIONS, 5]

    nothing = torch.randn(POSITIONS, HIDDEN, requires_grad=True)
    with _head_rows(head.weight) as recorded:
        (selective_head_logprobs(head, nothing, targets) * 0.0).sum().backward()
    assert recorded == [POSITIONS] and nothing.grad is not None and not nothing.grad.any()


def test_a_head_with_dropout_at_work_is_recomputed_whole() -> None:
    head = nn.Sequential(nn.Dropout(0.1), nn.Linear(HIDDEN, VOCAB, bias=False))
    assert not selective_head_fits(head.train())  # a mask drawn for fewer rows would differ
    assert selective_head_fits(head.eval())
    assert selective_head_fits(nn.Sequential(nn.Dropout(0.0), nn.Linear(HIDDEN, VOCAB)).train())


@pytest.mark.parametrize("train_unembed", [True, False])
def test_a_session_trains_as_with_the_checkpointed_head(
    train_unembed: bool,
    open_session: Callable[..., TrainingSession],
    sft: Callable[..., Datum],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = open_session(train_mlp=False, train_experts=False, train_unembed=train_unembed, seed=0)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a trained B, so that the gradient reaches A as well
        for name, parameter in session.named_parameters().items():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    data = [sft([(11 * i + 37 * j) % 4000 + 5 for j in range(12 + 5 * i)], prompt_length=8 + 3 * i) for i in range(3)]

    def trained() -> tuple[list[list[float]], float, dict[str, torch.Tensor]]:
        output = session.forward_backward(data, "cross_entropy")
        grads = {name: p.grad.clone() for name, p in session.named_parameters().items() if p.grad is not None}
        for parameter in session.named_parameters().values():
            parameter.grad = None
        return output.logprobs, output.metrics["loss:sum"], grads

    head = session.base.model.get_output_embeddings()
    head_weight = getattr(head, "base_layer", head).weight
    with _head_rows(head_weight) as recorded:
        selective = trained()
    positions = sum(datum.length for datum in data)
    weighted = sum(int(sum(weight != 0 for weight in datum.loss_fn_inputs["weights"])) for datum in data)
    assert recorded == [positions, weighted]  # one chunk; its backward on the weighted positions
    monkeypatch.setattr(packing, "selective_head_fits", lambda head: False)
    checkpointed = trained()

    assert selective[0] == checkpointed[0] and selective[1] == checkpointed[1]
    assert selective[2].keys() == checkpointed[2].keys()
    assert any("lm_head" in name for name in selective[2]) == train_unembed
    for name, grad in selective[2].items():
        assert torch.allclose(grad, checkpointed[2][name], rtol=1e-4, atol=1e-7), name

"""Several sessions' LoRA adapters in one forward/backward pass, each span of tokens through its own.

peft runs one active adapter at a time (`set_adapter`), and its mixed-batch mode
(`adapter_names`) is for inference only. Here the data of several sessions are the rows of one
batch (`packing.pack`, one datum per row), each session's data a contiguous span of rows, and
every LoRA linear layer computes

    y = W x                                  over the whole batch (the base runs once),
    y[span] += s_a * B_a A_a dropout_a(x[span])   for each span, with that span's adapter a,

with peft's own adapters switched off for the pass and a forward hook adding the spans. Autograd
then sends each session's gradient to its own A and B only, from its own tokens only: the other
sessions' tokens never pass through its adapter, attention never crosses rows, and
the caller adds the sessions' losses, whose derivatives do not mix.

The output head runs in chunks of real positions (`packing.packed_logprobs`), each inside one span:
the pass's `scope(i)` tells the layers that what they see now is span i alone. Only plain
linear LoRA layers can be mixed. Adapters on parameters (peft's `ParamWrapper`, e.g. the routed
experts of a MoE base) change the weight itself: `can_mix` says when the sessions must run one
after another instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Span:
    """Units [start, stop) that run through `adapter` (None: the base only). A unit is a batch
    row (all its positions), in training and in decoding alike. With a `width`, the adapter runs
    on each row's first `width` positions only (the rest is padding): the LoRA term of a
    batch-invariant pass is computed on exactly the positions the session's batch has alone."""

    adapter: str | None
    start: int
    stop: int
    width: int | None = None


def by_adapter(owners: Iterable[str | None]) -> list[Span]:
    """The spans of a batch whose rows, in order, run through `owners` (None: the base alone):
    one span per run of consecutive rows with one owner."""
    spans: list[Span] = []
    for row, owner in enumerate(owners):
        if spans and spans[-1].adapter == owner:
            spans[-1] = Span(owner, spans[-1].start, row + 1)
        else:
            spans.append(Span(owner, row, row + 1))
    return spans


def _check_tiling(spans: Sequence[Span]) -> None:
    if any(a.stop != b.start for a, b in zip(spans, spans[1:], strict=False)) or (spans and spans[0].start != 0):
        raise ValueError("spans must tile the batch rows from row 0, in order")


def _lora_layers(model: nn.Module, adapters: set[str]) -> list[Any]:
    from peft.tuners.lora import LoraLayer

    return [
        module
        for module in model.modules()
        if isinstance(module, LoraLayer) and any(name in module.lora_A for name in adapters)
    ]


def _is_linear_lora(module: Any) -> bool:
    from peft.tuners.lora.layer import Linear

    return type(module) is Linear and isinstance(module.get_base_layer(), nn.Linear)


def can_mix(model: nn.Module, adapters: Sequence[str]) -> bool:
    """Whether these adapters can share one pass: every layer they adapt is a plain linear LoRA layer."""
    return all(_is_linear_lora(module) for module in _lora_layers(model, set(adapters)))


def _with_adapter(module: Any, adapter: str | None, x_S_I: torch.Tensor, y_S_O: torch.Tensor) -> torch.Tensor:
    """`y_S_O` plus the adapter's LoRA term for inputs `x_S_I` (unchanged if it does not adapt `module`)."""
    if adapter is None or adapter not in module.lora_A:
        return y_S_O
    lora_A, lora_B = module.lora_A[adapter], module.lora_B[adapter]
    delta_S_O = lora_B(lora_A(module.lora_dropout[adapter](x_S_I.to(lora_A.weight.dtype)))) * module.scaling[adapter]
    return y_S_O + delta_S_O.to(y_S_O.dtype)


class MixedPass:
    """The spans of one pass, and the forward hook that adds each span's adapter."""

    def __init__(self, spans: Sequence[Span]) -> None:
        self.spans = list(spans)
        self.total = self.spans[-1].stop if self.spans else 0
        self._only: Span | None = None

    @contextmanager
    def scope(self, index: int) -> Iterator[None]:
        """While open, every adapted layer's whole input belongs to span `index` (a head chunk)."""
        previous, self._only = self._only, self.spans[index]
        try:
            yield
        finally:
            self._only = previous

    @contextmanager
    def using(self, spans: Sequence[Span]) -> Iterator[None]:
        """While open, the layers see a batch laid out as `spans` (which must tile its rows from
        0, in order, through adapters the pass was opened for)."""
        _check_tiling(spans)
        saved = (self.spans, self.total)
        self.spans, self.total = list(spans), spans[-1].stop if spans else 0
        try:
            yield
        finally:
            self.spans, self.total = saved

    def rows(self, counts: Sequence[int]) -> AbstractContextManager[None]:
        """While open, the layers see a batch of `counts[i]` rows through span i's adapter, in
        order (a pass over the parts' shared prefixes, `shared_prefixes`)."""
        return self.using(
            by_adapter(span.adapter for span, count in zip(self.spans, counts, strict=True) for _ in range(count))
        )

    def rows_of(self, owners: Sequence[str | None]) -> Callable[[list[tuple[int, int]]], AbstractContextManager[None]]:
        """For `sampling.generate_batch`: each live request's rows (request index, rows) through
        its owner's adapter (`owners[index]`, None: the base)."""

        def rows_context(rows: list[tuple[int, int]]) -> AbstractContextManager[None]:
            return self.using(by_adapter(owners[index] for index, units in rows for _ in range(units)))

        return rows_context

    def hook(self, module: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        x = args[0]
        if self._only is not None:
            return _with_adapter(module, self._only.adapter, x, output)
        x_M_I = x.reshape(-1, x.shape[-1])
        y_M_O = output.reshape(-1, output.shape[-1])
        per_unit, rest = divmod(y_M_O.shape[0], self.total)
        if rest or not per_unit:
            raise RuntimeError(
                f"a mixed-adapter pass over {self.total} units met a layer input of {y_M_O.shape[0]} positions"
            )
        # `split`, not one slice per span: the backward of a split is one concatenation, where
        # each slice's backward would fill a zero tensor of the whole batch (K spans, K times).
        sizes = [(span.stop - span.start) * per_unit for span in self.spans]
        pieces = [
            _with_adapter(module, span.adapter, x_S_I, y_S_O)
            if span.width is None or span.width >= per_unit
            else _within_width(module, span, per_unit, x_S_I, y_S_O)
            for span, x_S_I, y_S_O in zip(self.spans, x_M_I.split(sizes), y_M_O.split(sizes), strict=True)
        ]
        return torch.cat(pieces).reshape(output.shape)


def _within_width(module: Any, span: Span, per_unit: int, x_S_I: torch.Tensor, y_S_O: torch.Tensor) -> torch.Tensor:
    """`_with_adapter` on each row's first `span.width` positions; the rest of `y_S_O` as it is."""
    assert span.width is not None
    rows = span.stop - span.start
    x_R_W_I = x_S_I.view(rows, per_unit, -1)[:, : span.width]
    y_R_L_O = y_S_O.view(rows, per_unit, -1)
    inside_R_W_O = _with_adapter(module, span.adapter, x_R_W_I, y_R_L_O[:, : span.width])
    return torch.cat([inside_R_W_O, y_R_L_O[:, span.width :]], dim=1).reshape(y_S_O.shape)


@contextmanager
def mixed_adapters(
    peft_model: Any, spans: Sequence[Span], trainable: Sequence[nn.Parameter] = ()
) -> Iterator[MixedPass]:
    """Run `peft_model`'s forward (and the backward of what it computes) with each span through
    its own adapter; `trainable` are the parameters that get gradients.

    The spans must tile the rows of the batch in order; every position of a row runs through
    its row's adapter. peft's adapters are switched off for the duration (`disable_adapter`,
    which also restores which adapter is active and trainable on exit). Yields the pass, whose
    `scope` the output head's chunks use.
    """
    adapters = {span.adapter for span in spans if span.adapter is not None}
    _check_tiling(spans)
    if not can_mix(peft_model, sorted(adapters)):
        raise ValueError("these adapters cannot share a pass (they adapt parameters); run them one by one")
    mixed = MixedPass(spans)
    with peft_model.disable_adapter():
        handles = [layer.register_forward_hook(mixed.hook) for layer in _lora_layers(peft_model, adapters)]
        for parameter in trainable:
            parameter.requires_grad_(True)
        try:
            yield mixed
        finally:
            for handle in handles:
                handle.remove()

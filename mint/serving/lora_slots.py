"""LoRA slots: many adapters' factors stacked beside a base's layers, applied per row of a batch.

The torch engine (`mint.serving.torch_engine`) wraps the base's adaptable layers with the
modules here and loads each adapter into a *slot*, as in Punica and S-LoRA:

- `LoraLinear` wraps an `nn.Linear` with stacked slot tensors `A (S, r, in)` (scaled by the
  adapter's alpha / r) and `B^T (S, r, out)`, and adds to the base's `x W^T` each row's delta
  `(x A_s^T) B_s^T`: two plain matmuls when the whole batch uses one adapter, else two grouped
  matmuls over the tokens sorted by slot (`grouped_mm`, Punica's SGMV), else (no grouped
  matmul on this device and dtype) each token's factors gathered and applied by `bmm`.
- `LoraExperts` wraps fused routed experts (`gate_up_proj` (E, 2I, H), `down_proj` (E, H, I))
  and runs their math expert by expert, each expert's base weight once on all its tokens and
  each adapter's per-expert delta on that adapter's tokens.
- `SlotContext` is the slot of each row of the forward pass now running, shared by every
  wrapper of one engine. Slot 0 is "no adapter" and stays zero.

`parse_adapter` checks a PEFT adapter against the wrapped layers and splits it into the
per-module factors (`AdapterFactors`) that go into one slot of each stack.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from mint.errors import InvalidRequest
from mint.serving.engine import AdapterTensors
from mint.serving.peft_format import factor_pairs, lora_settings
from mint.trainer.packed_linear import PackedLinear

EXPERT_PARAMETERS = ("gate_up_proj", "down_proj")


# ---- an adapter split into per-module factors ---------------------------------------------------


@dataclass(frozen=True)
class _LinearDelta:
    """One linear layer's LoRA factors: the update is scale * B @ A."""

    module: str
    a_r_in: torch.Tensor
    b_out_r: torch.Tensor


@dataclass(frozen=True)
class _ExpertDelta:
    """One fused expert parameter's LoRA factors, one pair per expert, in activation order:
    the update to an expert's output is scale * (x A_e^T) B_e^T."""

    module: str
    parameter: str
    a_e_r_in: torch.Tensor
    b_e_out_r: torch.Tensor


@dataclass(frozen=True)
class AdapterFactors:
    """An adapter checked against the base and split into per-module factors."""

    rank: int
    scale: float
    linears: tuple[_LinearDelta, ...]
    experts: tuple[_ExpertDelta, ...]

    @property
    def numel(self) -> int:
        tensors = [t for d in self.linears for t in (d.a_r_in, d.b_out_r)]
        tensors += [t for d in self.experts for t in (d.a_e_r_in, d.b_e_out_r)]
        return sum(t.numel() for t in tensors)


def _expert_in_out(experts: nn.Module, parameter: str) -> tuple[int, int, int]:
    """(experts, in features, out features) of a fused expert parameter, as the activations see it."""
    count, first, second = getattr(experts, parameter).shape
    # transformers stores experts as (E, out, in) unless the class says it is transposed (E, in, out).
    return (count, first, second) if getattr(experts, "is_transposed", False) else (count, second, first)


def _expert_delta(
    module: str, experts: nn.Module, taken: set[str], a: torch.Tensor, b: torch.Tensor, rank: int
) -> _ExpertDelta:
    """Which fused parameter a nested peft wrapper adapts, told by its factors' shapes, and its per-expert factors.

    peft saves the pairs of one module's parameter wrappers under `experts.lora_A`,
    `experts.base_layer.lora_A`, ... in an order that depends on the config, but the shapes
    differ: gate_up_proj's A reads H features and its B writes 2I; down_proj's A reads I and B writes H.
    """
    for parameter in EXPERT_PARAMETERS:
        count, in_features, out_features = _expert_in_out(experts, parameter)
        fits = a.shape == (rank * count, in_features) and b.shape == (out_features, rank * count)
        if parameter not in taken and fits:
            taken.add(parameter)
            # peft lays A out as (E*r, in) expert-major and B as (out, r*E) expert-minor.
            a_e_r_in = a.reshape(count, rank, in_features)
            b_e_out_r = b.reshape(out_features, rank, count).permute(2, 0, 1)
            return _ExpertDelta(module, parameter, a_e_r_in, b_e_out_r)
    raise InvalidRequest(
        f"the adapter's factors for the experts of {module!r} ({tuple(a.shape)}, {tuple(b.shape)}) fit neither "
        f"{' nor '.join(EXPERT_PARAMETERS)} of this base at rank {rank}",
        param="adapter",
    )


def parse_adapter(
    source: AdapterTensors,
    *,
    linears: Mapping[str, nn.Linear | PackedLinear],
    experts: Mapping[str, nn.Module],
    max_rank: int,
    base_model: str,
) -> AdapterFactors:
    """Check an adapter against the base's adaptable modules and split it into per-module factors."""
    rank, scale = lora_settings(source.config, max_rank)
    linear_deltas: list[_LinearDelta] = []
    expert_deltas: list[_ExpertDelta] = []
    taken: dict[str, set[str]] = {}
    pairs = factor_pairs(source.tensors, is_factor=lambda tensor: isinstance(tensor, torch.Tensor))
    for (module, depth), pair in sorted(pairs.items()):
        a, b = pair["A"], pair["B"]
        if module in linears and depth == 0:
            linear = linears[module]
            if a.shape != (rank, linear.in_features) or b.shape != (linear.out_features, rank):
                raise InvalidRequest(
                    f"the adapter's factors for {module!r} have shapes {tuple(a.shape)} and {tuple(b.shape)}; "
                    f"base {base_model!r} needs ({rank}, {linear.in_features}) and ({linear.out_features}, {rank}): "
                    "it was trained on another base",
                    param="adapter",
                )
            linear_deltas.append(_LinearDelta(module, a, b))
        elif module in experts:
            expert_deltas.append(_expert_delta(module, experts[module], taken.setdefault(module, set()), a, b, rank))
        else:
            raise InvalidRequest(
                f"the adapter adapts {module!r}, which base {base_model!r} has not or Mint does not serve "
                "(served: attention and MLP projections, the output head, fused routed experts)",
                param="adapter",
            )
    return AdapterFactors(rank, scale, tuple(linear_deltas), tuple(expert_deltas))


# ---- slots: which adapter each row of the batch uses --------------------------------------------


GroupedMatmul = Callable[..., torch.Tensor]


def grouped_matmul(dtype: torch.dtype, device: torch.device) -> GroupedMatmul | None:
    """torch's grouped matmul (`F.grouped_mm`, the SGMV kernel of Punica in one op) if it runs
    here in `dtype`, checked on a tiny case; None where it does not (older torch, some GPUs)."""
    function = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    if function is None:
        return None
    x = torch.arange(48, dtype=torch.float32, device=device).reshape(3, 16).to(dtype)
    w = torch.ones((2, 16, 8), dtype=dtype, device=device)
    try:
        y = function(x, w, offs=torch.tensor([1, 3], dtype=torch.int32, device=device))
    except (RuntimeError, NotImplementedError):
        return None
    return function if torch.allclose(y.float(), (x @ w[0]).float()) else None


@dataclass(frozen=True)
class _Grouping:
    """The tokens of one forward pass sorted by slot, one group per slot, for grouped matmuls."""

    order_N: torch.Tensor | None  # token indices in slot order; None when the tokens already are
    ends_S: torch.Tensor  # int32: where each slot's group ends in that order
    ends: tuple[int, ...]  # the same, as Python ints


class SlotContext:
    """The slot of each row of the forward pass now running, read by every LoRA wrapper of one engine.

    Slot 0 is the base: its factors are zeros in every stack.
    """

    def __init__(self, slots: int, max_rank: int, dtype: torch.dtype, device: torch.device) -> None:
        self.slots = slots
        self.max_rank = max_rank
        self.dtype = dtype
        self.device = device
        self.grouped_mm = grouped_matmul(dtype, device)
        self.slots_B: torch.Tensor | None = None
        self.active: frozenset[int] = frozenset()
        # The one slot every row uses, when they all use the same adapter (plain matmuls then).
        self.uniform: int | None = None
        self._groupings: dict[int, _Grouping] = {}

    @contextmanager
    def serving(self, slots: Sequence[int]) -> Iterator[None]:
        """Route the rows of the next forward pass to `slots` (0: the base)."""
        distinct = set(slots)
        self.active = frozenset(distinct - {0})
        self.uniform = next(iter(distinct)) if len(distinct) == 1 else None
        self.slots_B = torch.tensor(list(slots), dtype=torch.long, device=self.device) if self.active else None
        try:
            yield
        finally:
            self.slots_B, self.active, self.uniform, self._groupings = None, frozenset(), None, {}

    def per_token(self, tokens: int) -> torch.Tensor:
        """The slot of each of `tokens` flattened (B*T) positions: each row's slot repeated T times."""
        assert self.slots_B is not None
        rows = self.slots_B.shape[0]
        if tokens % rows:
            raise RuntimeError(f"a flattened input of {tokens} tokens does not split into {rows} rows")
        return self.slots_B.repeat_interleave(tokens // rows)

    def grouping(self, tokens: int) -> _Grouping:
        """The slot order of `tokens` flattened positions; computed once per forward pass and size."""
        if tokens not in self._groupings:
            slots_N = self.per_token(tokens)
            in_order = bool((slots_N[1:] >= slots_N[:-1]).all())
            order_N = None
            if not in_order:
                slots_N, order_N = torch.sort(slots_N, stable=True)
            ends_S = torch.bincount(slots_N, minlength=self.slots).cumsum(0).to(torch.int32)
            self._groupings[tokens] = _Grouping(order_N, ends_S, tuple(ends_S.tolist()))
        return self._groupings[tokens]


class SlotStack:
    """Stacked LoRA factors of one weight, one slot per adapter: A (S, *lead, r, in), scaled by the
    adapter's alpha / r, and B^T (S, *lead, r, out).

    Like vLLM's LoRA slots, this is memory the engine reserves: it grows (doubling, up to the
    engine's slot count) when an adapter lands in a slot beyond it, and is reused, never
    reallocated, as adapters come and go. Ranks below max_rank are zero-padded, which adds
    nothing to the product; an empty slot is all zeros.
    """

    def __init__(self, slots: int, lead: tuple[int, ...], max_rank: int, in_features: int, out_features: int) -> None:
        self.slots = slots
        self.shape_a = (*lead, max_rank, in_features)
        self.shape_bt = (*lead, max_rank, out_features)
        self.a: torch.Tensor | None = None
        self.bt: torch.Tensor | None = None
        self.occupied: set[int] = set()

    def _reserve(self, slot: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.a is None or self.bt is None or slot >= self.a.shape[0]:
            capacity = min(self.slots, 1 << slot.bit_length())  # the next power of two above `slot`
            kept = 0 if self.a is None else self.a.shape[0]
            # Uninitialized, then each byte written once: the old slots copied, the new ones zeroed.
            a = torch.empty((capacity, *self.shape_a), dtype=like.dtype, device=like.device)
            bt = torch.empty((capacity, *self.shape_bt), dtype=like.dtype, device=like.device)
            if self.a is not None and self.bt is not None:
                a[:kept] = self.a
                bt[:kept] = self.bt
            a[kept:].zero_()
            bt[kept:].zero_()
            self.a, self.bt = a, bt
        return self.a, self.bt

    def load(self, slot: int, a: torch.Tensor, b: torch.Tensor, scale: float, like: torch.Tensor) -> None:
        """Copy factors A (*lead, r, in) and B (*lead, out, r) into `slot`, in `like`'s dtype and
        device, with A scaled by `scale` (the adapter's alpha / r) so that no forward multiplies by it."""
        stack_a, stack_bt = self._reserve(slot, like)
        slot_a, slot_bt = stack_a[slot], stack_bt[slot]
        rank = a.shape[-2]
        if rank < slot_a.shape[-2]:
            # Only the ranks past the adapter's are zeroed: the rest is overwritten.
            slot_a[..., rank:, :].zero_()
            slot_bt[..., rank:, :].zero_()
        # Written in place, with no temporary: a new version's first request waits on every load.
        torch.mul(a.to(torch.float32), scale, out=slot_a[..., :rank, :])
        slot_bt[..., :rank, :].copy_(b.transpose(-1, -2))
        self.occupied.add(slot)

    def clear(self, slot: int) -> None:
        """Zero `slot`: nothing of the adapter that held it stays."""
        self.occupied.discard(slot)
        if self.a is not None and self.bt is not None:
            self.a[slot].zero_()
            self.bt[slot].zero_()

    def used_by(self, context: SlotContext) -> bool:
        return bool(self.occupied & context.active)

    @property
    def size_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.a, self.bt) if t is not None)


class LoraLinear(nn.Module):
    """A base `nn.Linear` (or its weight prepacked, `PackedLinear`) plus each row's LoRA delta
    from its adapter's slot.

    The deltas are exact whichever way they are computed:
    - one adapter for the whole batch: two plain matmuls with its factors;
    - otherwise, tokens sorted by slot and two grouped matmuls over the slot stacks (each
      adapter's factors read once, in place, for all its tokens: Punica's SGMV);
    - where torch has no grouped matmul for this device and dtype: each token's factors gathered
      and applied by `torch.bmm` (a copy per token: correct, slower).
    """

    def __init__(self, base: nn.Linear | PackedLinear, context: SlotContext, slots: int) -> None:
        super().__init__()
        self.base = base
        self.context = context
        self.stack = SlotStack(slots, (), context.max_rank, base.in_features, base.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # the base weight, once for every row
        if not self.stack.used_by(self.context):
            return y
        return y + self._delta(x)

    def _delta(self, x: torch.Tensor) -> torch.Tensor:
        context, a_S_r_in, bt_S_r_out = self.context, self.stack.a, self.stack.bt
        assert a_S_r_in is not None and bt_S_r_out is not None
        if context.uniform is not None:
            slot = context.uniform
            return (x @ a_S_r_in[slot].T) @ bt_S_r_out[slot]
        x_N_in = x.reshape(-1, x.shape[-1])
        if context.grouped_mm is not None:
            delta_N_out = self._grouped(x_N_in, a_S_r_in, bt_S_r_out, context.grouped_mm)
        else:
            delta_N_out = self._gathered(x_N_in, a_S_r_in, bt_S_r_out)
        return delta_N_out.reshape(*x.shape[:-1], -1)

    def _grouped(
        self, x_N_in: torch.Tensor, a_S_r_in: torch.Tensor, bt_S_r_out: torch.Tensor, grouped_mm: GroupedMatmul
    ) -> torch.Tensor:
        grouping = self.context.grouping(x_N_in.shape[0])
        # This stack may not reach the highest slots (it grows as they are used): their tokens,
        # last in slot order, get no delta here.
        capacity = a_S_r_in.shape[0]
        ends_S, covered = grouping.ends_S[:capacity], grouping.ends[capacity - 1]
        order_N = grouping.order_N
        x_sorted_N_in = x_N_in if order_N is None else x_N_in.index_select(0, order_N)
        h_N_r = grouped_mm(x_sorted_N_in, a_S_r_in.transpose(1, 2), offs=ends_S)
        delta_sorted_N_out = grouped_mm(h_N_r, bt_S_r_out, offs=ends_S)
        if covered < x_N_in.shape[0]:
            delta_sorted_N_out[covered:] = 0  # rows past the last group are left unwritten by grouped_mm
        if order_N is None:
            return delta_sorted_N_out
        return torch.empty_like(delta_sorted_N_out).index_copy_(0, order_N, delta_sorted_N_out)

    def _gathered(self, x_N_in: torch.Tensor, a_S_r_in: torch.Tensor, bt_S_r_out: torch.Tensor) -> torch.Tensor:
        slots_N = self.context.per_token(x_N_in.shape[0])
        capacity = a_S_r_in.shape[0]
        slots_N = torch.where(slots_N < capacity, slots_N, torch.zeros_like(slots_N))  # slot 0 holds zeros
        h_N_1_r = torch.bmm(x_N_in.unsqueeze(1), a_S_r_in[slots_N].transpose(1, 2))
        return torch.bmm(h_N_1_r, bt_S_r_out[slots_N]).squeeze(1)


def experts_supported(experts: nn.Module) -> bool:
    """Whether `LoraExperts` can run this experts module's math: fused gate_up/down, no biases, no post-norm."""
    return (
        all(isinstance(getattr(experts, name, None), nn.Parameter) for name in EXPERT_PARAMETERS)
        and getattr(experts, "has_gate", True)
        and not getattr(experts, "has_bias", False)
        and not getattr(experts, "has_post_expert_norm", False)
        and callable(getattr(experts, "_apply_gate", None))
        and experts.gate_up_proj.ndim == 3
    )


class LoraExperts(nn.Module):
    """A fused routed-experts module plus per-expert LoRA on `gate_up_proj` and `down_proj`.

    Batches with no expert LoRA run the experts' own (fastest) implementation. Otherwise the
    experts' math runs here, expert by expert as transformers' eager path does, with each
    expert's base weight applied once to all its tokens and each adapter's delta to the group
    of its own tokens.
    """

    def __init__(self, experts: nn.Module, context: SlotContext, slots: int) -> None:
        super().__init__()
        self.experts = experts
        self.context = context
        self.transposed = bool(getattr(experts, "is_transposed", False))
        self.stacks: dict[str, SlotStack] = {}
        for parameter in EXPERT_PARAMETERS:
            count, in_features, out_features = _expert_in_out(experts, parameter)
            self.stacks[parameter] = SlotStack(slots, (count,), context.max_rank, in_features, out_features)

    def forward(self, hidden_N_H: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        if not any(stack.used_by(self.context) for stack in self.stacks.values()):
            return self.experts(hidden_N_H, top_k_index, top_k_weights)
        slots_N = self.context.per_token(hidden_N_H.shape[0])
        count = self.experts.gate_up_proj.shape[0]
        out_N_H = torch.zeros_like(hidden_N_H)
        # (E, k, N): which tokens chose expert e in which of their top-k places.
        expert_mask = nn.functional.one_hot(top_k_index, num_classes=count + 1).permute(2, 1, 0)
        for expert in (expert_mask[:count].sum(dim=(-1, -2)) > 0).nonzero().flatten().tolist():
            place, token = torch.where(expert_mask[expert])
            gate_up = self._project(hidden_N_H[token], "gate_up_proj", expert, slots_N[token])
            down = self._project(self.experts._apply_gate(gate_up), "down_proj", expert, slots_N[token])
            out_N_H.index_add_(0, token, (down * top_k_weights[token, place, None]).to(out_N_H.dtype))
        return out_N_H

    def _project(self, x_n_in: torch.Tensor, parameter: str, expert: int, slots_n: torch.Tensor) -> torch.Tensor:
        weight = getattr(self.experts, parameter)[expert]
        y_n_out = x_n_in @ weight if self.transposed else nn.functional.linear(x_n_in, weight)
        stack = self.stacks[parameter]
        if not stack.used_by(self.context):
            return y_n_out
        assert stack.a is not None and stack.bt is not None
        for slot in sorted(stack.occupied & self.context.active):
            rows = (slots_n == slot).nonzero().flatten()
            if rows.numel():
                h_n_r = x_n_in[rows] @ stack.a[slot, expert].T
                y_n_out.index_add_(0, rows, h_n_r @ stack.bt[slot, expert])
        return y_n_out


def replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, leaf, module)

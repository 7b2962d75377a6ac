"""The torch engine: many LoRA adapters on one resident base, served in mixed batches.

One forward pass serves a batch whose rows use different adapters (or none). The base's weights
are applied once for the whole batch; each row's LoRA delta comes from its adapter's *slot*,
as in Punica and S-LoRA:

- Every adaptable `nn.Linear` of the base (attention and MLP projections, the output head) is
  wrapped by a `LoraLinear` holding stacked slot tensors `A (S, r, in)` and `B^T (S, r, out)`.
  For a batch whose row b uses slot s_b it computes `y = x W^T + (x A_s^T) B_s^T` (A is stored
  scaled by the adapter's alpha / r):
  `x W^T` once for all rows, the deltas by two grouped matmuls over the tokens sorted by slot
  (torch's `grouped_mm`, Punica's SGMV), each adapter's factors read in place. Slot 0 is "no
  adapter" and stays zero.
- The routed experts of an MoE base (fused `gate_up_proj` (E, 2I, H) and `down_proj` (E, H, I))
  are wrapped by a `LoraExperts` that runs the experts' own math expert by expert, applying
  each expert's base weight once to all its tokens and each adapter's per-expert delta to the
  tokens of that adapter (one group per distinct adapter), with no weight ever merged.
- Every wrapper reads the current batch's slot of each row from one shared `SlotContext`, set
  by the engine around each forward.

Requests are scheduled by continuous batching: up to `max_batch_size` run together; between
decode steps finished requests leave and waiting ones join (prefilled together, then merged
into the running batch). The running batch keeps one transformers `DynamicCache`, left-padded:
each row's real tokens end at the last column, an attention mask hides the padding, and
position ids count each row's own tokens. When rows leave, the columns that are padding for
every remaining row are dropped.

Adapters come in the PEFT format written by `peft` and by Mint's trainer
(`save_weights_for_sampler`): module LoRA (`target_modules`), parameter LoRA on a linear's
weight, and parameter LoRA on fused experts (`target_parameters`, one rank-r pair per expert).
Adding an adapter copies its tensors into a free slot (a copy, no allocation, once the slot
stacks have grown to that slot); removing it zeroes the slot, makes it reusable at once, and
keeps no reference to the adapter's tensors. As with vLLM's `max_loras`, the slot stacks are
memory the engine reserves, bounded by max_adapters x max_rank.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from mint.errors import ConfigurationError, Conflict, InvalidRequest, NotFound
from mint.schemas.base_models import BaseModelSpec
from mint.serving.engine import (
    AdapterInfo,
    AdapterSource,
    AdapterTensors,
    BatchEngine,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    StreamEvent,
    Usage,
    check_adapter_id,
)
from mint.serving.peft_format import adapter_files, factor_pairs, holdback, lora_settings, read_config
from mint.trainer.lora import TargetCatalogue
from mint.trainer.models import load_base_model
from mint.trainer.packing import token_logprobs
from mint.trainer.sampling import choose_tokens, end_of_sequence_ids
from mint.trainer.types import SamplingParams

DEFAULT_MAX_ADAPTERS = 8
DEFAULT_MAX_RANK = 16
DEFAULT_MAX_BATCH_SIZE = 16
EXPERT_PARAMETERS = ("gate_up_proj", "down_proj")


# ---- reading a PEFT adapter -------------------------------------------------------------------


def read_adapter_folder(folder: Path) -> AdapterTensors:
    """The adapter in a PEFT folder, in memory: its config and its safetensors weights (never pickle)."""
    config_file, weights_file = adapter_files(folder)
    config = read_config(config_file)
    try:
        tensors = load_file(weights_file)
    except (OSError, ValueError, SafetensorError) as exc:
        raise InvalidRequest(f"the adapter in {folder} cannot be read: {exc}", param="adapter") from exc
    return AdapterTensors(config=config, tensors=tensors)


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
class _Adapter:
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
    linears: Mapping[str, nn.Linear],
    experts: Mapping[str, nn.Module],
    max_rank: int,
    base_model: str,
) -> _Adapter:
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
    return _Adapter(rank, scale, tuple(linear_deltas), tuple(expert_deltas))


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


class _SlotStack:
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
            a = torch.zeros((capacity, *self.shape_a), dtype=like.dtype, device=like.device)
            bt = torch.zeros((capacity, *self.shape_bt), dtype=like.dtype, device=like.device)
            if self.a is not None and self.bt is not None:
                a[: self.a.shape[0]] = self.a
                bt[: self.bt.shape[0]] = self.bt
            self.a, self.bt = a, bt
        return self.a, self.bt

    def load(self, slot: int, a: torch.Tensor, b: torch.Tensor, scale: float, like: torch.Tensor) -> None:
        """Copy factors A (*lead, r, in) and B (*lead, out, r) into `slot`, in `like`'s dtype and
        device, with A scaled by `scale` (the adapter's alpha / r) so that no forward multiplies by it."""
        stack_a, stack_bt = self._reserve(slot, like)
        rank = a.shape[-2]
        stack_a[slot].zero_()
        stack_bt[slot].zero_()
        stack_a[slot, ..., :rank, :] = a.to(torch.float32) * scale
        stack_bt[slot, ..., :rank, :] = b.transpose(-1, -2)
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
    """A base `nn.Linear` plus each row's LoRA delta from its adapter's slot.

    The deltas are exact whichever way they are computed:
    - one adapter for the whole batch: two plain matmuls with its factors;
    - otherwise, tokens sorted by slot and two grouped matmuls over the slot stacks (each
      adapter's factors read once, in place, for all its tokens: Punica's SGMV);
    - where torch has no grouped matmul for this device and dtype: each token's factors gathered
      and applied by `torch.bmm` (a copy per token: correct, slower).
    """

    def __init__(self, base: nn.Linear, context: SlotContext, slots: int) -> None:
        super().__init__()
        self.base = base
        self.context = context
        self.stack = _SlotStack(slots, (), context.max_rank, base.in_features, base.out_features)

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
        self.stacks: dict[str, _SlotStack] = {}
        for parameter in EXPERT_PARAMETERS:
            count, in_features, out_features = _expert_in_out(experts, parameter)
            self.stacks[parameter] = _SlotStack(slots, (count,), context.max_rank, in_features, out_features)

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


def _replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, leaf, module)


# ---- requests while they run ------------------------------------------------------------------


class _CompletionText:
    """A request's completion text while tokens arrive: stop strings found, stream deltas released safely."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str], streaming: bool) -> None:
        self._decode = decode
        self._stops = tuple(stops)
        self._longest_stop = max((len(s) for s in self._stops), default=0)
        self._streaming = streaming
        self._searched = 0  # characters of the text already searched for stop strings
        self._sent = 0  # characters already streamed

    def advance(self, tokens: list[int]) -> tuple[str, tuple[str, str] | None]:
        """(text to stream now, (final text, matched stop string) if a stop string now appears)."""
        if not self._stops and not self._streaming:
            return "", None
        text = self._decode(tokens)
        found = self._find_stop(text)
        if found is not None:
            cut, stop = found
            return "", (text[:cut], stop)
        if not self._streaming:
            return "", None
        safe = len(text) - holdback(text, self._stops)
        delta = text[self._sent : safe] if safe > self._sent else ""
        self._sent = max(self._sent, safe)
        return delta, None

    def _find_stop(self, text: str) -> tuple[int, str] | None:
        # A new match ends in the newest token's text, so only the tail needs searching again.
        start = max(0, self._searched - self._longest_stop + 1)
        self._searched = len(text)
        found = [(index, stop) for stop in self._stops if (index := text.find(stop, start)) >= 0]
        return min(found) if found else None

    def rest(self, final_text: str) -> str:
        """The part of the final text not streamed yet."""
        rest = final_text[self._sent :] if self._streaming else ""
        self._sent = len(final_text)
        return rest


@dataclass(eq=False)
class _Row:
    """One request from admission to its last token."""

    index: int
    adapter_id: str | None
    slot: int
    prompt: list[int]
    max_new_tokens: int
    params: SamplingParams
    stop_token_ids: frozenset[int]
    text: _CompletionText
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    final_text: str = ""
    finish_reason: FinishReason | None = None
    stop_match: str | int | None = None

    @property
    def next_position(self) -> int:
        """The position of the newest token, the one the next decode step feeds."""
        return len(self.prompt) + len(self.tokens) - 1

    def usage(self) -> Usage:
        return Usage(prompt_tokens=len(self.prompt), completion_tokens=len(self.tokens))

    def result(self) -> GenerateResult:
        assert self.finish_reason is not None
        return GenerateResult(
            index=self.index,
            adapter_id=self.adapter_id,
            tokens=list(self.tokens),
            text=self.final_text,
            logprobs=list(self.logprobs),
            finish_reason=self.finish_reason,
            stop_match=self.stop_match,
            usage=self.usage(),
        )


@dataclass
class _Batch:
    """Rows decoding together: one left-padded KV cache, its attention mask and each row's slot."""

    rows: list[_Row]
    cache: Any  # transformers DynamicCache, (B, heads, T, head_dim) per layer
    mask_B_T: torch.Tensor

    def layers(self) -> list[Any]:
        return list(self.cache.layers)

    def keep(self, keep: list[int]) -> _Batch | None:
        """The batch with only rows `keep`, minus the columns that are padding for all of them."""
        if not keep:
            return None
        if len(keep) < len(self.rows):
            index = torch.tensor(keep, dtype=torch.long, device=self.mask_B_T.device)
            for layer in self.layers():
                layer.keys, layer.values = layer.keys[index], layer.values[index]
            self.mask_B_T = self.mask_B_T[index]
            self.rows = [self.rows[i] for i in keep]
        lead = int(self.mask_B_T.any(dim=0).long().argmax())
        if lead:
            for layer in self.layers():
                layer.keys, layer.values = layer.keys[:, :, lead:], layer.values[:, :, lead:]
            self.mask_B_T = self.mask_B_T[:, lead:]
        return self

    def join(self, other: _Batch) -> _Batch:
        """This batch with `other`'s rows appended; the shorter cache is padded on the left."""
        length, other_length = self.mask_B_T.shape[1], other.mask_B_T.shape[1]
        width = max(length, other_length)
        for mine, theirs in zip(self.layers(), other.layers(), strict=True):
            mine.keys = torch.cat([_left_pad(mine.keys, width, 2), _left_pad(theirs.keys, width, 2)])
            mine.values = torch.cat([_left_pad(mine.values, width, 2), _left_pad(theirs.values, width, 2)])
        self.mask_B_T = torch.cat([_left_pad(self.mask_B_T, width, 1), _left_pad(other.mask_B_T, width, 1)])
        self.rows = self.rows + other.rows
        return self


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _generator(seed: int | None, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()  # fresh entropy: an unseeded request must not repeat another's sample
    else:
        generator.manual_seed(seed)
    return generator


# ---- the engine ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Loaded:
    slot: int
    info: AdapterInfo
    modules: tuple[str, ...]


class TorchEngine(BatchEngine):
    """The `Engine` contract on a transformers base in this process: CPU or one GPU, dense or MoE.

    The engine takes the model over: it wraps the model's adaptable layers in place, so the
    model must be a plain transformers model (not a peft model) used by nothing else.
    Thread-safe: one forward pass runs at a time; concurrent streams interleave by step.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        base_model: str,
        context_length: int | None = None,
        max_adapters: int = DEFAULT_MAX_ADAPTERS,
        max_rank: int = DEFAULT_MAX_RANK,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    ) -> None:
        if max_adapters < 1 or max_rank < 1 or max_batch_size < 1:
            raise ConfigurationError("max_adapters, max_rank and max_batch_size must be at least 1")
        if hasattr(model, "peft_config"):
            raise ConfigurationError("the torch engine serves a plain transformers model, not a peft model")
        model.requires_grad_(False)
        model.eval()
        self._model = model
        self.tokenizer = tokenizer
        self._base_model = base_model
        self._max_adapters = max_adapters
        self.max_rank = max_rank
        self.max_batch_size = max_batch_size
        self.device = model.get_input_embeddings().weight.device
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.context_length = int(context_length or model.config.max_position_embeddings)
        self.eos_token_ids = frozenset(end_of_sequence_ids(tokenizer, model))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._pad_token_id = int(pad or 0)
        weight = model.get_input_embeddings().weight
        self._context = SlotContext(max_adapters + 1, max_rank, weight.dtype, self.device)
        self._linears, self._experts = self._wrap(model, TargetCatalogue.from_model(model))
        self._loaded: dict[str, _Loaded] = {}
        self._free_slots = list(range(1, max_adapters + 1))
        self._in_use: Counter[str] = Counter()
        self._lock = threading.RLock()

    @classmethod
    def from_spec(
        cls,
        spec: BaseModelSpec,
        cache_dir: Path,
        *,
        dtype: str | None = None,
        device: str = "cpu",
        max_adapters: int = DEFAULT_MAX_ADAPTERS,
        max_rank: int = DEFAULT_MAX_RANK,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    ) -> TorchEngine:
        """Load the base named by `spec` (pulled into `cache_dir` if needed) and serve it."""
        model, tokenizer = load_base_model(spec, cache_dir, dtype=dtype, device=device)
        return cls(
            model,
            tokenizer,
            base_model=spec.name,
            context_length=spec.context_length,
            max_adapters=max_adapters,
            max_rank=max_rank,
            max_batch_size=max_batch_size,
        )

    def _wrap(
        self, model: nn.Module, catalogue: TargetCatalogue
    ) -> tuple[dict[str, LoraLinear], dict[str, LoraExperts]]:
        """Wrap every adaptable linear and every supported fused-experts module, by the base's own names."""
        slots = self._max_adapters + 1
        linears: dict[str, LoraLinear] = {}
        for name in (*catalogue.attention, *catalogue.mlp, *([catalogue.unembed] if catalogue.unembed else [])):
            base = model.get_submodule(name)
            if isinstance(base, nn.Linear):
                linears[name] = LoraLinear(base, self._context, slots)
                _replace_module(model, name, linears[name])
        experts: dict[str, LoraExperts] = {}
        for module_name in sorted({name.rpartition(".")[0] for name in catalogue.experts}):
            module = model.get_submodule(module_name)
            if experts_supported(module):
                experts[module_name] = LoraExperts(module, self._context, slots)
                _replace_module(model, module_name, experts[module_name])
        return linears, experts

    # ---- the Engine contract: adapters ----------------------------------------------------------

    def add_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        """Copy a PEFT adapter into a free slot; a no-op if `adapter_id` is already loaded."""
        check_adapter_id(adapter_id)
        with self._lock:
            if adapter_id in self._loaded:
                return
        tensors = read_adapter_folder(source) if isinstance(source, Path) else source
        if not isinstance(tensors, AdapterTensors):
            raise InvalidRequest("an adapter source is a PEFT folder (Path) or AdapterTensors", param="adapter")
        adapter = parse_adapter(
            tensors,
            linears={name: wrapper.base for name, wrapper in self._linears.items()},
            experts={name: wrapper.experts for name, wrapper in self._experts.items()},
            max_rank=self.max_rank,
            base_model=self._base_model,
        )
        with self._lock, torch.no_grad():
            if adapter_id in self._loaded:
                return
            if not self._free_slots:
                raise Conflict(
                    f"all {self._max_adapters} adapter slots of base {self._base_model!r} are taken; "
                    "remove an adapter first",
                    param="adapter_id",
                )
            slot = self._free_slots.pop(0)
            modules = self._fill_slot(slot, adapter)
            size_bytes = adapter.numel * self._context.dtype.itemsize  # in the engine's dtype
            info = AdapterInfo(adapter_id=adapter_id, rank=adapter.rank, size_bytes=size_bytes)
            self._loaded[adapter_id] = _Loaded(slot, info, modules)

    def _fill_slot(self, slot: int, adapter: _Adapter) -> tuple[str, ...]:
        filled: list[_SlotStack] = []
        try:
            for delta in adapter.linears:
                wrapped = self._linears[delta.module]
                wrapped.stack.load(slot, delta.a_r_in, delta.b_out_r, adapter.scale, like=wrapped.base.weight)
                filled.append(wrapped.stack)
            for expert_delta in adapter.experts:
                wrapper = self._experts[expert_delta.module]
                stack = wrapper.stacks[expert_delta.parameter]
                like = getattr(wrapper.experts, expert_delta.parameter)
                stack.load(slot, expert_delta.a_e_r_in, expert_delta.b_e_out_r, adapter.scale, like=like)
                filled.append(stack)
        except BaseException:
            for stack in filled:
                stack.clear(slot)
            self._free_slots.insert(0, slot)
            raise
        return tuple([d.module for d in adapter.linears] + [f"{d.module}.{d.parameter}" for d in adapter.experts])

    def _stacks_of(self, module: str) -> _SlotStack:
        if module in self._linears:
            return self._linears[module].stack
        experts_module, _, parameter = module.rpartition(".")
        return self._experts[experts_module].stacks[parameter]

    def remove_adapter(self, adapter_id: str) -> None:
        """Zero the adapter's slot and make it reusable; refuses while a running stream uses the adapter."""
        with self._lock, torch.no_grad():
            loaded = self._loaded.get(adapter_id)
            if loaded is None:
                raise NotFound(f"adapter {adapter_id!r} is not loaded on base {self._base_model!r}", param="adapter_id")
            if self._in_use[adapter_id]:
                raise Conflict(
                    f"adapter {adapter_id!r} still serves {self._in_use[adapter_id]} running request(s); "
                    "remove it when they finish",
                    param="adapter_id",
                )
            for module in loaded.modules:
                self._stacks_of(module).clear(loaded.slot)
            del self._loaded[adapter_id]
            self._free_slots.append(loaded.slot)
            self._free_slots.sort()

    def adapters(self) -> list[AdapterInfo]:
        """The loaded adapters, oldest first."""
        with self._lock:
            return [loaded.info for loaded in self._loaded.values()]

    def close(self) -> None:
        """Unload every adapter not in use; the base goes with this object (no process to stop)."""
        for info in self.adapters():
            with suppress(NotFound, Conflict):
                self.remove_adapter(info.adapter_id)

    def slot_of(self, adapter_id: str) -> int:
        """The slot an adapter occupies (1..max_adapters)."""
        with self._lock:
            loaded = self._loaded.get(adapter_id)
            if loaded is None:
                raise NotFound(f"adapter {adapter_id!r} is not loaded on base {self._base_model!r}", param="adapter_id")
            return loaded.slot

    def memory_bytes(self) -> int:
        """Bytes the slot stacks reserve: zero before the first adapter, then growing with the highest
        slot in use (to at most max_adapters slots at max_rank), reused as adapters come and go."""
        with self._lock:
            stacks = [w.stack for w in self._linears.values()]
            stacks += [s for w in self._experts.values() for s in w.stacks.values()]
            return sum(stack.size_bytes for stack in stacks)

    # ---- the Engine contract: generation ---------------------------------------------------------

    def _resolve(self, requests: Sequence[GenerateRequest], *, streaming: bool) -> list[_Row]:
        """Turn requests into rows; the whole batch is checked before anything runs."""
        rows = []
        for index, request in enumerate(requests):
            if not isinstance(request, GenerateRequest):
                raise InvalidRequest(f"request {index} is not a GenerateRequest", param="requests")
            rows.append(self._row(index, request, streaming))
        return rows

    def _row(self, index: int, request: GenerateRequest, streaming: bool) -> _Row:
        loaded, prompt = self._checked(index, request)
        slot = 0 if loaded is None else loaded.slot
        params = SamplingParams(temperature=request.temperature, top_p=request.top_p, top_k=request.top_k)
        stop_ids = set(request.stop_token_ids) | (set() if request.ignore_eos else set(self.eos_token_ids))
        return _Row(
            index=index,
            adapter_id=request.adapter_id,
            slot=slot,
            prompt=prompt,
            max_new_tokens=min(request.max_tokens, self.context_length - len(prompt)),
            params=params,
            stop_token_ids=frozenset(stop_ids),
            text=_CompletionText(self._detokenize, request.stop, streaming),
            generator=None if request.temperature == 0.0 else _generator(request.seed, self.device),
        )

    def _admit(self, requests: Sequence[GenerateRequest], *, streaming: bool) -> list[_Row]:
        """Resolve the batch and mark its adapters in use, under the lock so no removal slips between."""
        with self._lock:
            rows = self._resolve(requests, streaming=streaming)
            self._in_use.update(row.adapter_id for row in rows if row.adapter_id is not None)
        return rows

    def _release(self, row: _Row) -> None:
        if row.adapter_id is not None:
            with self._lock:
                self._in_use[row.adapter_id] -= 1
                if self._in_use[row.adapter_id] <= 0:
                    del self._in_use[row.adapter_id]

    def _detokenize(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    # ---- continuous batching ---------------------------------------------------------------------

    def _run(self, rows: list[_Row]) -> Generator[list[StreamEvent], None, None]:
        """Decode `rows` with continuous batching; yields each step's events."""
        waiting = deque(rows)
        running: _Batch | None = None
        unfinished = set(range(len(rows)))
        try:
            while waiting or running is not None:
                with self._lock, torch.no_grad():
                    logits: list[tuple[_Row, torch.Tensor]] = []
                    if running is not None:
                        logits += zip(running.rows, self._decode_step(running), strict=True)
                    room = self.max_batch_size - (len(running.rows) if running is not None else 0)
                    joining = [waiting.popleft() for _ in range(min(room, len(waiting)))]
                    joined: _Batch | None = None
                    if joining:
                        joined, first_logits = self._prefill(joining)
                        logits += zip(joining, first_logits, strict=True)
                    events = self._sample([row for row, _ in logits], torch.stack([lg for _, lg in logits]))
                    running = self._regroup(running, joined)
                for row in (row for row, _ in logits if row.finish_reason is not None):
                    unfinished.discard(row.index)
                    self._release(row)
                yield events
        finally:
            for index in unfinished:  # a stream closed early: its rows no longer hold their adapters
                self._release(rows[index])

    def _regroup(self, running: _Batch | None, joined: _Batch | None) -> _Batch | None:
        """Drop finished rows from both batches and merge what is left into one."""
        batches = []
        for batch in (running, joined):
            if batch is not None:
                kept = batch.keep([i for i, row in enumerate(batch.rows) if row.finish_reason is None])
                if kept is not None:
                    batches.append(kept)
        if not batches:
            return None
        return batches[0] if len(batches) == 1 else batches[0].join(batches[1])

    def _forward(self, rows: list[_Row], **inputs: Any) -> Any:
        with self._context.serving([row.slot for row in rows]):
            return self._model(**inputs, use_cache=True, logits_to_keep=1)

    def _prefill(self, rows: list[_Row]) -> tuple[_Batch, torch.Tensor]:
        """Run the prompts of joining rows, left-padded to one length; (their batch, last logits (J, V))."""
        width = max(len(row.prompt) for row in rows)
        ids_J_P = torch.full((len(rows), width), self._pad_token_id, dtype=torch.long)
        mask_J_P = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids_J_P[i, width - len(row.prompt) :] = torch.tensor(row.prompt)
            mask_J_P[i, width - len(row.prompt) :] = 1
        ids_J_P, mask_J_P = ids_J_P.to(self.device), mask_J_P.to(self.device)
        positions_J_P = (mask_J_P.cumsum(dim=-1) - 1).clamp(min=0)
        output = self._forward(rows, input_ids=ids_J_P, attention_mask=mask_J_P, position_ids=positions_J_P)
        cache = output.cache
        if any(type(layer).__name__ != "DynamicLayer" for layer in cache.layers):
            raise ConfigurationError(
                f"base {self._base_model!r} uses a KV cache with sliding or special layers; "
                "the torch engine batches plain full-attention caches only"
            )
        return _Batch(rows, cache, mask_J_P), output.logits[:, -1]

    def _decode_step(self, batch: _Batch) -> torch.Tensor:
        """Feed every row's newest token; next-token logits (B, V)."""
        last_B_1 = torch.tensor([[row.tokens[-1]] for row in batch.rows], dtype=torch.long, device=self.device)
        positions_B_1 = torch.tensor([[row.next_position] for row in batch.rows], dtype=torch.long, device=self.device)
        batch.mask_B_T = torch.cat([batch.mask_B_T, batch.mask_B_T.new_ones((len(batch.rows), 1))], dim=1)
        output = self._forward(
            batch.rows, input_ids=last_B_1, attention_mask=batch.mask_B_T, position_ids=positions_B_1, cache=batch.cache
        )
        batch.cache = output.cache
        return output.logits[:, -1]

    def _sample(self, rows: list[_Row], logits_B_V: torch.Tensor) -> list[StreamEvent]:
        """Choose each row's next token with its own parameters and generator; record it; the events."""
        logits_B_V = logits_B_V.float()
        chosen_B = logits_B_V.argmax(dim=-1)
        for i, row in enumerate(rows):
            if row.generator is not None:
                chosen_B[i] = choose_tokens(logits_B_V[i : i + 1], row.params, row.generator)[0]
        logprobs_B = token_logprobs(logits_B_V, chosen_B)
        return [
            self._advance(row, token, logprob)
            for row, token, logprob in zip(rows, chosen_B.tolist(), logprobs_B.tolist(), strict=True)
        ]

    def _advance(self, row: _Row, token: int, logprob: float) -> StreamEvent:
        """Append one token to a row and decide whether it is finished."""
        row.tokens.append(token)
        row.logprobs.append(logprob)
        delta = ""
        if token in row.stop_token_ids:
            self._finish(row, "stop", token, self._detokenize(row.tokens[:-1]))
        else:
            delta, stopped = row.text.advance(row.tokens)
            if stopped is not None:
                self._finish(row, "stop", stopped[1], stopped[0])
            elif len(row.tokens) >= row.max_new_tokens:
                self._finish(row, "length", None, self._detokenize(row.tokens))
        if row.finish_reason is not None:
            delta += row.text.rest(row.final_text)
        return StreamEvent(
            index=row.index,
            token_ids=[token],
            text=delta,
            logprobs=[logprob],
            finish_reason=row.finish_reason,
            stop_match=row.stop_match,
            usage=row.usage() if row.finish_reason is not None else None,
        )

    @staticmethod
    def _finish(row: _Row, reason: FinishReason, match: str | int | None, text: str) -> None:
        row.finish_reason, row.stop_match, row.final_text = reason, match, text

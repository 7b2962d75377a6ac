"""Batched forward passes: one datum per row, right-padded, and their per-token logprobs.

The data become a [B, L] batch, datum i in row i, padded on the right to the longest. No
attention mask is needed: attention is causal, so a real token never sees the padding after it,
and no token of one row sees another row. With `attention_mask=None` and no cache, transformers
hands attention to sdpa as plain causal attention (`is_causal`), which takes the fused
flash/memory-efficient kernels: memory linear in L per row. (An earlier layout put all data in
one row with restarting position ids; transformers then builds a block-diagonal mask, which
forces sdpa's math path, quadratic in the whole row's length. Most of a large pass's memory is
its activations, though, which grow linearly: see `LARGE_PASS_ACTIVATION_BYTES`.)
Routed experts act per token, so MoE layers need nothing more; the padding's outputs are dropped
before the head. The tests check that batched logprobs equal one-forward-per-datum logprobs.

The real positions are then gathered, in data order, into one flat run of N tokens: the head,
the losses and the callers see data end to end, as before.

A pass of one adapter on an sdpa model runs the decoder on the data end to end instead (one row
of N real tokens, `DataRows`): every linear layer, norm and MLP sees the real tokens only, and
only attention spreads them into the [B, L] rows, runs sdpa's fused causal kernel there and
gathers them back (`row_attention`). The padding of a batch of data of unequal lengths then costs
attention a little, not the whole decoder: SmolLM2's SFT batches of 8 chat rows are about 1.5x as
many positions padded as real, and the activations a pass keeps for its backward grow with the
positions. Mixed passes of several adapters keep the rows (their LoRA spans are rows).

`head_logprobs.token_logprobs` is THE logprob computation: `forward`, `forward_backward` and
`sample` all use it, so that sampled logprobs and trained logprobs agree (no train/inference
mismatch in RL).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mint.trainer.batch_invariance import checkpoint_contexts, invariance_open
from mint.trainer.head_logprobs import selective_head_fits, selective_head_logprobs, token_logprobs
from mint.trainer.host_memory import returning_large_blocks
from mint.trainer.shared_prefixes import SharedPrefixes, decoder_positions, share, shared_hidden
from mint.trainer.types import Datum

# The token id the padding holds: any id the model embeds; its outputs are never read.
PAD_TOKEN_ID = 0


@dataclass(frozen=True)
class DataRows:
    """Data end to end in one row of N real tokens (position ids restarting at each datum), and
    where each token lies in the right-padded [B, L] batch, where attention runs."""

    input_ids_1_N: torch.Tensor
    position_ids_1_N: torch.Tensor
    real_B_L: torch.Tensor
    slots_N: torch.Tensor  # each real token's index in the flattened [B * L] batch

    def spread(self, states_1_H_N_D: torch.Tensor) -> torch.Tensor:
        """(1, heads, N, D) states of the tokens end to end as (B, heads, L, D) rows, zeros at
        the padding."""
        batch, width = self.real_B_L.shape
        states_N_H_D = states_1_H_N_D[0].transpose(0, 1)
        rows = states_N_H_D.new_zeros((batch * width, *states_N_H_D.shape[1:]))
        rows = rows.index_copy(0, self.slots_N, states_N_H_D)
        return rows.view(batch, width, *states_N_H_D.shape[1:]).transpose(1, 2)

    def gather(self, rows_B_L_H_D: torch.Tensor) -> torch.Tensor:
        """(B, L, heads, D) outputs of the rows back end to end: (1, N, heads, D)."""
        flat = rows_B_L_H_D.reshape(-1, *rows_B_L_H_D.shape[2:])
        return flat.index_select(0, self.slots_N).unsqueeze(0)


@dataclass(frozen=True)
class PackedBatch:
    """Data as a right-padded batch, one datum per row, and where their real tokens are."""

    input_ids_B_L: torch.Tensor
    position_ids_B_L: torch.Tensor
    real_B_L: torch.Tensor  # True at a datum's own tokens, False at padding
    # The real positions' next-token targets, data end to end: K per position, K the widest
    # datum's (1 for data with one target per position), narrower data padded on the right.
    targets_N_K: torch.Tensor
    lengths: list[int]
    widths: list[int | None]  # each datum's K, None for (N,) targets
    # The same data as a prefix pass and a suffix pass, where data share prefixes enough.
    shared: SharedPrefixes | None = None
    # The same data end to end, for a pass that runs its decoder on real tokens only (None where
    # one datum per row is asked for, or where there is no padding to save).
    rows: DataRows | None = None

    @property
    def decoder_positions(self) -> int:
        """The positions the decoder runs: both passes' where data share prefixes."""
        if self.shared is not None:
            return self.shared.prefix_ids_P_W.numel() + self.shared.suffix_ids_B_S.numel()
        return self.input_ids_B_L.numel()

    def split(self, logprobs_N_K: torch.Tensor) -> list[torch.Tensor]:
        """Per-datum logprobs from the batch's (N, K) table: (L,) for a datum with one target
        per position, (L, K) for one with K."""
        return [
            part_L_K[:, :width] if width is not None else part_L_K[:, 0]
            for part_L_K, width in zip(torch.split(logprobs_N_K, self.lengths), self.widths, strict=True)
        ]


def pack(
    data: Sequence[Datum], device: torch.device, part_sizes: Sequence[int] | None = None, share_prefixes: bool = True
) -> PackedBatch:
    """Lay `data` out one per row, right-padded, with next-token targets for their real tokens,
    and as shared prefixes and suffixes where consecutive data of one part (`part_sizes`: the
    parts' numbers of data, in order; one part by default) begin alike (`shared_prefixes`) and
    `share_prefixes` allows it; and end to end (`DataRows`) where `share_prefixes` allows a layout
    other than one datum per row (a batch-invariant pass does not)."""
    lengths = [datum.length for datum in data]
    width = max(lengths)
    input_ids = [list(datum.model_input) + [PAD_TOKEN_ID] * (width - datum.length) for datum in data]
    real = [[True] * length + [False] * (width - length) for length in lengths]
    widths = [datum.targets_per_position for datum in data]
    if all(k is None for k in widths):
        flat = [token for datum in data for token in datum.target_tokens]
        targets_N_K = torch.tensor(flat, dtype=torch.long, device=device).unsqueeze(-1)
    else:
        k = max(w or 1 for w in widths)
        rows = [
            (row if w is not None else [row]) + [PAD_TOKEN_ID] * (k - (w or 1))  # type: ignore[operator,list-item]
            for datum, w in zip(data, widths, strict=True)
            for row in datum.target_tokens
        ]
        targets_N_K = torch.tensor(rows, dtype=torch.long, device=device)
    real_B_L = torch.tensor(real, dtype=torch.bool, device=device)
    rows = None
    if share_prefixes and min(lengths) < width:
        rows = DataRows(
            input_ids_1_N=torch.tensor([[token for datum in data for token in datum.model_input]], device=device),
            position_ids_1_N=torch.tensor([[p for length in lengths for p in range(length)]], device=device),
            real_B_L=real_B_L,
            slots_N=real_B_L.flatten().nonzero().squeeze(-1),
        )
    return PackedBatch(
        input_ids_B_L=torch.tensor(input_ids, dtype=torch.long, device=device),
        position_ids_B_L=torch.arange(width, device=device).expand(len(data), width),
        real_B_L=real_B_L,
        rows=rows,
        targets_N_K=targets_N_K,
        lengths=lengths,
        widths=widths,
        shared=share([datum.model_input for datum in data], part_sizes or [len(data)], device, PAD_TOKEN_ID)
        if share_prefixes
        else None,
    )


# A pass with gradients whose activations would take more than this (by `activation_bytes`) is a
# large pass: each decoder layer keeps only its input and recomputes the rest in the backward
# pass (`checkpointed_layers`), and on the host freed blocks go back to the system
# (`host_memory.returning_large_blocks`). Measured with `bench/pass_memory.py` on SmolLM2-135M, 4
# data x 800 tokens: 5.0 GB over the loaded model in 11.9 s as an ordinary pass, 1.3 GB in 17.5 s
# as a large one (and up to 8.4 GB for the ordinary pass, as glibc's heaps happen to grow). Below
# the limit the ordinary pass is faster and small enough.
LARGE_PASS_ACTIVATION_BYTES = 2 << 30


def activation_bytes(config: Any, positions: int) -> int:
    """A rough size of what a pass with gradients keeps for its backward: per position and layer,
    about four hidden-sized and three MLP-sized tensors (norms, attention, residuals; the MLP's
    gate, up and product), in the parameters' precision (float32 on the host)."""
    hidden = int(getattr(config, "hidden_size", 0))
    mlp = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
    layers = int(getattr(config, "num_hidden_layers", 1))
    return positions * layers * (4 * hidden + 3 * mlp) * 4


def fits_one_pass(model: nn.Module, parts: Sequence[Sequence[Datum]]) -> bool:
    """Whether these parts' data (each part a list of data) make an ordinary pass together,
    not a large one: what a pass of several sessions is split by."""
    inputs = [datum.model_input for part in parts for datum in part]
    positions = decoder_positions(inputs, [len(part) for part in parts])
    return activation_bytes(_causal_lm(model).config, positions) <= LARGE_PASS_ACTIVATION_BYTES


def fitting_passes(model: nn.Module, parts: Sequence[Sequence[Datum]]) -> list[int]:
    """How many consecutive parts each pass takes, so that every pass's data make an ordinary
    pass (`fits_one_pass`); a part too large alone makes a pass of its own."""
    sizes: list[int] = []
    for index in range(len(parts)):
        if sizes and fits_one_pass(model, parts[index - sizes[-1] : index + 1]):
            sizes[-1] += 1
        else:
            sizes.append(1)
    return sizes


def _large_pass(model: nn.Module) -> AbstractContextManager[None]:
    stack = ExitStack()
    stack.enter_context(checkpointed_layers(model))
    device = next(model.parameters()).device
    if device.type == "cpu":
        stack.enter_context(returning_large_blocks())
    return stack


@contextmanager
def checkpointed_layers(model: nn.Module) -> Iterator[None]:
    """While open, every decoder layer (transformers' `GradientCheckpointingLayer`) of `model`
    runs under `torch.utils.checkpoint` in a pass with gradients: its activations are recomputed
    in the backward pass, with the same dropout masks (the RNG state is replayed).

    transformers checkpoints a layer when the layer's own `training` flag is set; the model stays
    in eval mode, so the flag is set on the layer objects alone, never on their children (LoRA
    dropout and attention dropout keep theirs).
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
    saved = [
        (layer.gradient_checkpointing, layer.training, layer.__dict__.get("_gradient_checkpointing_func"))
        for layer in layers
    ]
    for layer in layers:
        layer._gradient_checkpointing_func = functools.partial(
            checkpoint, use_reentrant=False, context_fn=checkpoint_contexts
        )
        layer.gradient_checkpointing, layer.training = True, True
    try:
        yield
    finally:
        for layer, (enabled, training, func) in zip(layers, saved, strict=True):
            layer.gradient_checkpointing, layer.training = enabled, training
            if func is None:
                layer.__dict__.pop("_gradient_checkpointing_func", None)
            else:
                layer._gradient_checkpointing_func = func


# The attention implementation of a model whose passes may run data end to end: transformers'
# sdpa, except in a pass given `data_rows` (`row_attention`).
ROW_ATTENTION = "mint_row_sdpa"
_rows_pass = threading.local()


def row_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention; with `data_rows` (a `DataRows`: the decoder's input is the
    data end to end), each datum's queries, keys and values are spread into its own row, sdpa runs
    causally over the rows (the fused kernel, memory linear in L), and the outputs are gathered
    back end to end. No token attends to another datum's."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rows: DataRows | None = kwargs.pop("data_rows", None)
    if rows is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    output_B_L_H_D, _ = sdpa_attention_forward(
        module,
        rows.spread(query),
        rows.spread(key),
        rows.spread(value),
        None,
        dropout=dropout,
        scaling=scaling,
        is_causal=True,
        **kwargs,
    )
    return rows.gather(output_B_L_H_D), None


def _row_attention_mask(*args: Any, **kwargs: Any) -> Any:
    """sdpa's mask, except in a pass of data end to end, whose attention needs none (transformers
    would build a block-diagonal one, N x N)."""
    from transformers.masking_utils import sdpa_mask

    return None if getattr(_rows_pass, "open", False) else sdpa_mask(*args, **kwargs)


@functools.cache
def _register_row_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(ROW_ATTENTION, row_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ROW_ATTENTION, _row_attention_mask)


def _runs_data_rows(causal: nn.Module) -> bool:
    """Whether this model's attention takes `data_rows`: an sdpa model is switched to
    `ROW_ATTENTION` (the same numbers in every other pass) on its first such pass."""
    if getattr(causal.config, "_attn_implementation", None) == "sdpa":
        _register_row_attention()
        causal.set_attn_implementation(ROW_ATTENTION)
    return getattr(causal.config, "_attn_implementation", None) == ROW_ATTENTION


@contextmanager
def _set_in_thread(local: threading.local, name: str, value: Any) -> Iterator[None]:
    """Set `local.name` to `value` for this thread while open, then put back what it was."""
    previous = getattr(local, name, None)
    setattr(local, name, value)
    try:
        yield
    finally:
        setattr(local, name, previous)


def _data_rows_open() -> AbstractContextManager[None]:
    return _set_in_thread(_rows_pass, "open", True)


# Architectures whose logits are exactly lm_head(final hidden state): no logit scaling or
# soft-capping between them, so the head can be applied in chunks outside the model's forward.
PLAIN_HEAD_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Glm4MoeForCausalLM", "Qwen3MoeForCausalLM"})
# Positions per chunk of the output head: bounds the (chunk, V) logits alive at once.
HEAD_CHUNK_POSITIONS = 128


def _causal_lm(model: nn.Module) -> nn.Module:
    """The transformers CausalLM under a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


# Turns the logits of real positions [start, stop) of a batch (data end to end) into per-position
# tensors (first dimension stop - start): what a pass computes from the output head.
Reduce = Callable[[torch.Tensor, int, int], tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class TargetLogprobs:
    """The `Reduce` of a pass that scores its targets: each real position's logprobs of its
    targets. A pass with gradients computes them with `head_logprobs.selective_head_logprobs`
    (the head again in the backward pass only where the loss has a gradient) where the head
    allows it and the pass is not batch-invariant; otherwise each chunk is recomputed whole."""

    targets_N_K: torch.Tensor

    def __call__(self, logits_C_V: torch.Tensor, start: int, stop: int) -> tuple[torch.Tensor, ...]:
        return (token_logprobs(logits_C_V, self.targets_N_K[start:stop]),)


@dataclass(frozen=True)
class PassShape:
    """What of a pass's layout decides the collectives it runs where the weights are sharded over
    a worker group's ranks (FSDP2: each call of a sharded module all-gathers its weights, and again
    in the backward pass): whether the decoder runs twice (a prefix pass and a suffix pass),
    whether its layers are recomputed in the backward pass (a large pass), and how many chunks the
    output head runs. Ranks that run different data in one pass (`data_parallel`) agree on it."""

    two_passes: bool
    large: bool
    head_chunks: int


_lockstep = threading.local()


def lockstep(agree: Callable[[PassShape], PassShape]) -> AbstractContextManager[None]:
    """While open, each pass of this thread takes the shape `agree` returns for the shape it would
    take alone: `agree` is a collective that every rank's pass calls at the same point, and its
    answer may only turn the two passes off, turn a large pass on, or add head chunks (which run
    on no positions)."""
    return _set_in_thread(_lockstep, "agree", agree)


def _agreed(shape: PassShape) -> PassShape:
    agree = getattr(_lockstep, "agree", None)
    return shape if agree is None else agree(shape)


def _chunk_outputs(
    head: nn.Module,
    hidden_C_H: torch.Tensor,
    reduce: Reduce,
    start: int,
    stop: int,
    scope: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> tuple[torch.Tensor, ...]:
    with scope():
        return reduce(head(hidden_C_H), start, stop)


def position_outputs(
    model: nn.Module,
    batch: PackedBatch,
    reduce: Reduce,
    spans: Sequence[tuple[int, int]] | None = None,
    mixed: Any = None,
) -> tuple[torch.Tensor, ...]:
    """One forward over the batch; `reduce` applied to the logits of its N real positions,
    its outputs concatenated over positions (with grad if enabled).

    For plain-head architectures the decoder runs once and the output head runs in chunks of
    real positions; with gradients on, each chunk is recomputed in the backward pass instead of
    keeping the whole (N, V) logits table alive, which is most of the activation memory of
    a small model with a large vocabulary. `spans` are ranges of the N real positions (data end
    to end) that chunks never cross (the parts of a mixed-session pass), so a part's head runs
    on the same chunks as it would alone, inside `mixed.scope(i)` for span i (forward and
    recomputation alike; `mixed` is the pass's `mixed_adapters.MixedPass`, or None). Without
    `mixed`, the decoder runs on the data end to end (`batch.rows`, `row_attention`); data that
    share prefixes (`batch.shared`) run as a prefix pass and a suffix pass instead where those
    run fewer positions.
    """
    causal = _causal_lm(model)
    architectures = getattr(causal.config, "architectures", None) or [type(causal).__name__]
    inputs = {
        "input_ids": batch.input_ids_B_L,
        "position_ids": batch.position_ids_B_L,
        "attention_mask": None,  # causal attention alone: right padding never reaches a real token
        "use_cache": False,
    }
    plain_head = architectures[0] in PLAIN_HEAD_ARCHITECTURES and hasattr(causal, "get_decoder")
    end_to_end = plain_head and mixed is None and batch.rows is not None and _runs_data_rows(causal)
    rows = batch.rows if end_to_end else None
    positions = batch.decoder_positions
    if rows is not None and (batch.shared is None or rows.input_ids_1_N.numel() <= positions):
        shared, positions = None, rows.input_ids_1_N.numel()  # end to end runs fewer positions
    else:
        shared, rows = batch.shared, None
    large = torch.is_grad_enabled() and activation_bytes(causal.config, positions) > LARGE_PASS_ACTIVATION_BYTES
    real = batch.targets_N_K.shape[0]
    bounds = [
        (index, start, min(start + HEAD_CHUNK_POSITIONS, span_stop))
        for index, (span_start, span_stop) in enumerate(spans or [(0, real)])
        for start in range(span_start, span_stop, HEAD_CHUNK_POSITIONS)
    ]
    alone = PassShape(plain_head and shared is not None and not large, large, len(bounds) if plain_head else 0)
    shape = _agreed(alone)
    if shared is not None and not shape.two_passes:  # one decoder call, as the other ranks make
        shared, rows = None, batch.rows if end_to_end else None
    large = shape.large
    bounds += [(bounds[-1][0] if bounds else 0, real, real)] * (shape.head_chunks - len(bounds))
    layers_scope = _large_pass(causal) if large else nullcontext()
    if not plain_head:
        with layers_scope:
            logits_N_V = model(**inputs).logits[batch.real_B_L]
        return reduce(logits_N_V, 0, logits_N_V.shape[0])
    if shared is not None and not large:
        hidden_N_H = shared_hidden(causal.get_decoder(), shared, mixed)
    elif rows is not None:
        with layers_scope, _data_rows_open():
            hidden_N_H = causal.get_decoder()(
                input_ids=rows.input_ids_1_N,
                position_ids=rows.position_ids_1_N,
                attention_mask=None,
                use_cache=False,
                data_rows=rows,
            ).last_hidden_state[0]
    else:
        with layers_scope:
            hidden_N_H = causal.get_decoder()(**inputs).last_hidden_state[batch.real_B_L]
    head = causal.get_output_embeddings()
    # Target logprobs with gradients, in a pass whose bits may depend on the batch, through a head
    # that can run again on some of its positions.
    selective = isinstance(reduce, TargetLogprobs) and torch.is_grad_enabled() and not invariance_open()
    selective_targets = reduce.targets_N_K if selective and selective_head_fits(head) else None
    chunks = []
    # One split (whose backward is one concatenation), not a slice per chunk (whose backward
    # fills a zero tensor of all N positions, once per chunk).
    pieces = hidden_N_H.split([stop - start for _, start, stop in bounds])
    for (index, start, stop), hidden_C_H in zip(bounds, pieces, strict=True):
        scope = functools.partial(mixed.scope, index) if mixed is not None else nullcontext
        if selective_targets is not None:  # the backward pass runs the head where the loss reads it
            chunks.append((selective_head_logprobs(head, hidden_C_H, selective_targets[start:stop], scope),))
        elif torch.is_grad_enabled():  # recomputed in the backward pass, in its scope again
            chunks.append(
                checkpoint(
                    _chunk_outputs,
                    *(head, hidden_C_H, reduce, start, stop, scope),
                    use_reentrant=False,
                    context_fn=checkpoint_contexts,
                )
            )
        else:
            chunks.append(_chunk_outputs(head, hidden_C_H, reduce, start, stop, scope))
    return tuple(torch.cat(parts) for parts in zip(*chunks, strict=True))


def packed_logprobs(
    model: nn.Module, batch: PackedBatch, spans: Sequence[tuple[int, int]] | None = None, mixed: Any = None
) -> list[torch.Tensor]:
    """One forward over the batch; returns each datum's logprobs of its targets, (L,) or (L, K)
    (with grad if enabled). See `position_outputs` for the chunks and spans."""

    return batch.split(position_outputs(model, batch, TargetLogprobs(batch.targets_N_K), spans, mixed)[0])

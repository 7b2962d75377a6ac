"""Batch-invariant passes: a session's numbers do not depend on what else is in its batch.

A mixed pass (`mixed_adapters`) runs several sessions' rows through one base. Each session's
logprobs and gradients are then its own, but only to float rounding against running it alone:
the host's GEMM picks its blocking by the number of rows, so a row's dot products are summed in
another order when the matrix has more rows (measured on these CPUs: fp32 `linear` of one row
differs between 100 and 700 rows, for in_features 1536 on two threads and for any width at
fewer than 9 rows); attention blocks its sums by the padded width of the batch; and a MoE layer's
expert multiplies all sessions' tokens routed to it as one matrix.

Inside `batch_invariant()` every operation a row passes through gives that row the same bits
whatever the other rows are:

- `linear` (every `nn.Linear`, peft's LoRA A and B, the output head, eager MoE experts) runs as a
  batched GEMM over fixed tiles of `TILE_ROWS` rows, the last tile zero-padded. Each tile is a
  GEMM of one fixed shape, and the host computes a row of such a GEMM the same way wherever the
  row sits (measured for tiles of 16 and 32 rows, at every in/out width of SmolLM2 and the tiny
  MoE bases, on one and two threads). Its backward is tiled alike; a weight's gradient sums
  per-tile products over the same tiles in the same order.
- `scaled_dot_product_attention` runs per span of rows at that span's own width (`RowSpan`):
  the width the session's batch would have alone. Rows of one width are computed independently.
- The caller keeps the rest in step: each session's LoRA term is computed over its own rows at
  its own width (`mixed_adapters.Span.width`), MoE experts run eagerly (`linear` per expert,
  not a grouped GEMM), and data run one per row (no shared-prefix pass, whose layout depends on
  all sessions' data).

Element-wise operations, norms and softmaxes reduce within a row, and so were already invariant.
The price, measured on SmolLM2 on two CPU threads: a tiled `linear` takes 1.4-1.5x the time of
a plain one (forward and backward, 5,000 rows; larger tiles are not row-invariant on two
threads), and with the copies, the blocks and no shared prefixes a forward_backward of one RL
step takes 2.3x as long alone and 3.5x in a mixed pass of four sessions (4 RL jobs: 1.35x the
wall time one after another, 1.9x at once; `bench/rl_throughput.py --batch-invariant`).
`ResidentBase(batch_invariant=True)` turns it on, for isolation that holds bit for bit rather
than to rounding.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# Rows per GEMM tile: a fixed shape the host computes the same way for every row in it.
TILE_ROWS = 32
# Element-wise functions whose vectorized kernel and scalar remainder loop round differently
# (SLEEF against libm): a tensor's last few elements, or those at a thread's chunk boundary,
# would otherwise get other bits than the same value elsewhere in a larger tensor.
TRANSCENDENTAL = frozenset(
    {"sigmoid", "silu", "exp", "expm1", "log", "log1p", "cos", "sin", "tanh", "erf", "gelu", "softplus", "rsqrt"}
)
# Elements per block of an element-wise function: a multiple of every vector loop's step, and
# at most ATen's grain size (32,768), so one block runs whole in one thread's vectorized loop.
ELEMENTWISE_BLOCK = 16384
VECTOR_STEP = 64


@dataclass(frozen=True)
class RowSpan:
    """Batch rows [start, stop) whose attention runs at `width` positions (their own batch's)."""

    start: int
    stop: int
    width: int


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` as one batched GEMM over tiles of `TILE_ROWS` rows of x."""
    rows_M_I = x.reshape(-1, x.shape[-1])
    count = rows_M_I.shape[0]
    tiles = max(1, -(-count // TILE_ROWS))
    padded_M_I = F.pad(rows_M_I, (0, 0, 0, tiles * TILE_ROWS - count))
    weight_T_I_O = weight.t().unsqueeze(0).expand(tiles, *weight.t().shape)
    out_M_O = torch.bmm(padded_M_I.view(tiles, TILE_ROWS, -1), weight_T_I_O).reshape(tiles * TILE_ROWS, -1)[:count]
    if bias is not None:
        out_M_O = out_M_O + bias
    return out_M_O.reshape(*x.shape[:-1], weight.shape[0])


def blocked_elementwise(func: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """`func(x, ...)` for an element-wise `func`, on blocks of `ELEMENTWISE_BLOCK` elements, the
    last zero-padded to a whole `VECTOR_STEP`: every element goes through the vectorized loop
    (forward and backward alike, since the backward sees the same blocks)."""
    flat = x.reshape(-1)
    count = flat.numel()
    padded = F.pad(flat, (0, -count % VECTOR_STEP))
    blocks = [func(block, *args, **kwargs) for block in padded.split(ELEMENTWISE_BLOCK)]
    return torch.cat(blocks)[:count].view(x.shape)


def _attention_by_span(spans: Sequence[RowSpan] | None, query: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """`F.scaled_dot_product_attention` over (B, H, L, D) inputs, per span of rows at its width,
    each span's inputs contiguous; the positions past a span's width come back zero."""
    key, value, *rest = args
    mask = kwargs.pop("attn_mask", rest[0] if rest else None)
    rest = rest[1:]
    length = query.shape[-2]
    if spans is None:
        spans = [RowSpan(0, query.shape[0], length)]
    elif spans[-1].stop != query.shape[0] or max(span.width for span in spans) > length:
        raise RuntimeError(f"attention over {tuple(query.shape)} met row spans {spans} of another batch")
    pieces = []
    for span in spans:
        rows, width = slice(span.start, span.stop), slice(0, span.width)
        span_mask = None if mask is None else mask[rows, ..., width, width].contiguous()
        out = F.scaled_dot_product_attention(
            query[rows, ..., width, :].contiguous(),
            key[rows, ..., width, :].contiguous(),
            value[rows, ..., width, :].contiguous(),
            span_mask,
            *rest,
            **kwargs,
        )
        pieces.append(F.pad(out, (0, 0, 0, length - span.width)))
    return torch.cat(pieces)


def _is_float_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > 0


class _BatchInvariant(TorchFunctionMode):
    def __init__(self, spans: Sequence[RowSpan] | None) -> None:
        super().__init__()
        self.spans = list(spans) if spans is not None else None

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            return tiled_linear(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            return _attention_by_span(self.spans, *args, **kwargs)
        if getattr(func, "__name__", None) in TRANSCENDENTAL and args and _is_float_tensor(args[0]):
            return blocked_elementwise(func, *args, **kwargs)
        return func(*args, **kwargs)


_open = threading.local()


@contextmanager
def batch_invariant(spans: Sequence[RowSpan] | None = None) -> Iterator[None]:
    """While open (on this thread), `linear`, attention and transcendental element-wise functions
    give each row the same bits whatever the other rows are (see the module's docstring).
    `spans`: the batch's spans of rows and the width each attends over (None: one span of the
    whole batch)."""
    previous = getattr(_open, "spans", False)
    _open.spans = spans
    try:
        with _BatchInvariant(spans):
            yield
    finally:
        _open.spans = previous


def invariance_open() -> bool:
    """Whether a `batch_invariant()` block is open on this thread."""
    return getattr(_open, "spans", False) is not False


def checkpoint_contexts() -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]:
    """`torch.utils.checkpoint`'s `context_fn`: a checkpointed block recomputed in the backward
    pass runs as batch-invariant as its forward did (the backward does not see the forward's mode)."""
    return nullcontext(), (_BatchInvariant(_open.spans) if invariance_open() else nullcontext())

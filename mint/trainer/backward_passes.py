"""Backward passes: the forward_backward calls of several sessions, run as ONE batched pass.

Calls that overlap in time (`ResidentBase.backward_passes`, a combiner) come here together,
at most MAX_SESSIONS_PER_PASS of them. In a pass each session's data are a span of rows that
run through its own adapter (`mixed_adapters`), with its own LoRA dropout, so each session's
loss depends on its own tokens only and its gradient reaches its own adapter only; with a
batch-invariant base, each span also gets the numbers of its batch alone (`batch_invariance`).
A mixed pass pays where one session's batch leaves the device idle.

Sessions that cannot share a pass (adapters on parameters, or one session twice), or all of
them where the base does not mix backward passes, run one after another. Sessions whose data
together would make a large pass (`packing.fits_one_pass`) run as several passes of whole
sessions, in order, rather than one pass that recomputes its layers. The base holds the lock,
runs each pass (`score_parts`) and mirrors the call on a worker group; this module says which
calls share a pass and how a shared pass runs them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from torch import nn

from mint.trainer.batch_invariance import RowSpan, batch_invariant
from mint.trainer.mixed_adapters import MixedPass, Span, can_mix, mixed_adapters
from mint.trainer.packing import fitting_passes
from mint.trainer.scoring import RunningFn
from mint.trainer.training_session import BackwardCall

# Sessions whose forward_backward calls share one pass at most.
MAX_SESSIONS_PER_PASS = 8


def pass_groups(model: nn.Module, calls: Sequence[BackwardCall], *, mix: bool) -> list[Sequence[BackwardCall]]:
    """The passes `calls` run as, in order, each a run of whole calls: one pass per call where
    they cannot share one (`mix` off, a session twice, adapters that `can_mix` refuses), else as
    few as keep each pass small (`packing.fitting_passes`)."""
    names = [call.session.session_id for call in calls]
    apart = not mix or len(set(names)) < len(names) or not can_mix(model, names)
    sizes = [1] * len(calls) if apart else fitting_passes(model, [call.request.data for call in calls])
    groups: list[Sequence[BackwardCall]] = []
    start = 0
    for size in sizes:
        groups.append(calls[start : start + size])
        start += size
    return groups


def mixed_running(peft_model: Any, calls: Sequence[BackwardCall], *, invariant: bool) -> RunningFn:
    """How one pass runs several sessions' calls (`score_parts`' `running`), which the caller has
    checked can mix: each call's span of rows through its session's adapter, with its LoRA
    dropout on; with `invariant`, each span batch-invariant at its session's own width."""
    names = [call.session.session_id for call in calls]
    trainable = [parameter for call in calls for parameter in call.session._parameters.values()]
    # Each session's own width, where the pass must give it the numbers of its batch alone.
    widths = [max(d.length for d in call.request.data) if invariant else None for call in calls]

    @contextmanager
    def running(spans: list[tuple[int, int]]) -> Iterator[MixedPass]:
        with ExitStack() as stack:
            for call in calls:
                stack.enter_context(call.session._lora_dropout())
            parts = [Span(name, *span, width) for name, span, width in zip(names, spans, widths, strict=True)]
            if invariant:  # every part has its width
                stack.enter_context(batch_invariant([RowSpan(p.start, p.stop, p.width or 0) for p in parts]))
            yield stack.enter_context(mixed_adapters(peft_model, parts, trainable))

    return running

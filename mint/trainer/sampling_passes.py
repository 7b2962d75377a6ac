"""Sampling passes: the sample_batch calls of several adapters on one resident base, decoded as one batch.

Calls that overlap in time (`ResidentBase.sampling_passes`, a combiner) come here together,
each under one session's adapter or under the base itself (None). Their requests decode as the
rows of one batch, at most MAX_ROWS_PER_BATCH rows at a time, each row through its own
adapter (`mixed_adapters`: a span per run of rows with one owner), so several RL loops or
Tinker models sample at the cost of about one. Every sample is stamped with the version of the
weights that generated it (`BASE_VERSION` for the base). The base holds the lock, activates
adapters and mirrors the call on a worker group; this module holds the calls, the decoding
loops and the stamping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from mint.trainer.fused_decoder import FusedDecoder
from mint.trainer.mixed_adapters import by_adapter, mixed_adapters
from mint.trainer.prompt_cache import CachedPrompts
from mint.trainer.sampling import MAX_SAMPLES_PER_REQUEST, Decoding, decoding_chunks, generate_batch
from mint.trainer.types import SampledSequence, SampleRequest

# Rows (samples) decoded in one batch at most: bounds the KV cache as one request's largest
# number of samples does; a larger `sample_batch` runs as several batches.
MAX_ROWS_PER_BATCH = MAX_SAMPLES_PER_REQUEST
# The adapter version stamped on samples of the base itself (every adapter disabled).
BASE_VERSION = "base"

# A call's requests as the decoder runs them, under its adapter (None: the base).
CheckedCall = tuple[str | None, list[Decoding]]


@dataclass(frozen=True)
class SampleCall:
    """One sample_batch call: requests under one adapter (None: the base), perhaps decoded in one
    batch with other adapters' calls."""

    adapter: str | None
    requests: list[SampleRequest]


def decode_alone(
    model: nn.Module,
    decodings: Sequence[Decoding],
    decode: Callable[[list[int]], str],
    prompts: CachedPrompts | None = None,
    *,
    adapter: str | None = None,
    fuse: bool = False,
) -> list[list[SampledSequence]]:
    """Decode under `adapter`, the one active in `model` (None: adapters disabled), in batches of
    at most MAX_ROWS_PER_BATCH rows, each prompt from its cached prefix in `prompts` if any; one
    list of samples per decoding. With `fuse`, the decode steps run through a `FusedDecoder`
    where the model allows one."""
    samples: list[list[SampledSequence]] = []
    for chunk in decoding_chunks(decodings, MAX_ROWS_PER_BATCH):
        part = None if prompts is None else prompts.part(len(samples), len(samples) + len(chunk))
        fused = FusedDecoder.of(model, [adapter] * len(chunk)) if fuse else None
        samples += generate_batch(model, chunk, decode=decode, prompts=part, fused=fused)
    return samples


def decode_mixed(
    peft_model: Any,
    model: nn.Module,
    decodings: Sequence[Decoding],
    owners: Sequence[str | None],
    decode: Callable[[list[int]], str],
    prompts: CachedPrompts | None = None,
    *,
    fuse: bool = False,
) -> list[list[SampledSequence]]:
    """Decode each decoding through its owner's adapter, in batches of at most MAX_ROWS_PER_BATCH
    rows (the caller holds the base's lock, has checked that the owners can mix and has settled
    peft's active adapter); one list of samples per decoding. With `fuse`, the decode steps run
    through a `FusedDecoder` where the model allows one."""
    samples: list[list[SampledSequence]] = []
    for chunk in decoding_chunks(decodings, MAX_ROWS_PER_BATCH):
        chunk_owners = owners[len(samples) : len(samples) + len(chunk)]
        # One pass opened for the whole decoding (its hooks installed once); each forward
        # lays its live rows out by owner, a span per run of rows with one adapter.
        with mixed_adapters(peft_model, by_adapter(chunk_owners)) as mixed:
            rows_context = mixed.rows_of(chunk_owners)
            part = None if prompts is None else prompts.part(len(samples), len(samples) + len(chunk))
            fused = FusedDecoder.of(model, chunk_owners) if fuse else None
            samples += generate_batch(model, chunk, decode=decode, rows_context=rows_context, prompts=part, fused=fused)
    return samples


def per_call(samples: list[list[SampledSequence]], checked: Sequence[CheckedCall]) -> list[list[list[SampledSequence]]]:
    """The samples of every call's decodings, in order, cut back into one list per call."""
    results, start = [], 0
    for _, decodings in checked:
        results.append(samples[start : start + len(decodings)])
        start += len(decodings)
    return results


def stamped(
    checked: Sequence[CheckedCall],
    results: Sequence[list[list[SampledSequence]]],
    stamps: dict[str | None, str],
) -> list[list[list[SampledSequence]]]:
    """Each call's samples with `adapter_version` set to the stamp of its adapter."""
    return [
        [[sample.model_copy(update={"adapter_version": stamps[adapter]}) for sample in group] for group in groups]
        for (adapter, _), groups in zip(checked, results, strict=True)
    ]

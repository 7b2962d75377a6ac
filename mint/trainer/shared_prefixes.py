"""Data that begin with the same tokens run those tokens once: a prefix pass, then the rest.

An RL step trains on groups of samples of one prompt: every sample of a group begins with the
same prompt, often as long as the completions. Laid out one datum per row, the decoder runs
every prompt once per sample. Here the data that share a prefix (consecutive data of one part
of a pass, sharing at least `MIN_SHARED_TOKENS`) form a group, and the decoder runs in two
passes:

1. the prefix pass: each group's shared tokens once, one row per group, right-padded, with a
   KV cache;
2. the suffix pass: each datum's remaining tokens, one row per datum, right-padded, attending
   to its group's cached prefix (the cache rows are selected per datum, so autograd adds the
   gradients of a group's data into its prefix) and causally to its own tokens.

The suffix pass takes an explicit mask: a row may see its group's real prefix tokens and its
own earlier tokens, never another group's, the prefix pass's padding, or its own padding. A
datum without partners is a group of its own: it runs whole in the prefix pass, and its row of
the suffix pass is padding. Every position's hidden state is then gathered, data end to end, into the layout
`packing.pack` gives, so the output head and the losses see the same positions as before.

The numbers are those of running each datum whole (the same computation, split at a cache
boundary, as the sampler's prefill and decoding split it), up to float rounding. The prefix
pass is used only where it saves at least a fifth of the positions the decoder would run
(`share`), and never in a pass large enough to recompute its layers (whose checkpoints do not
keep a cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# The fewest tokens data must share to run them once: below this a prefix row costs more than
# it saves.
MIN_SHARED_TOKENS = 16
# The most data in one group: bounds the search for groups (quadratic in this).
MAX_GROUP = 256
# The largest share of the one-datum-per-row positions the two passes may run to be worth it.
MAX_COST_SHARE = 0.8


@dataclass(frozen=True)
class SharedPrefixes:
    """The two passes' inputs for data that share prefixes, and where each datum's positions lie."""

    prefix_ids_P_W: torch.Tensor
    prefix_rows_per_part: list[int]
    suffix_ids_B_S: torch.Tensor
    suffix_positions_B_S: torch.Tensor
    suffix_mask_B_1_S_T: torch.Tensor  # True where a suffix position may attend; T = W + S
    prefix_of_row_B: torch.Tensor  # each datum's prefix row
    # Each real position of the data, end to end, in the prefix pass's flat outputs (P * W)
    # followed by the suffix pass's (B * S).
    hidden_index_N: torch.Tensor


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


def _shared_length(members: Sequence[Sequence[int]]) -> int:
    """The tokens a group runs in the prefix pass: what all members share, each keeping one of
    its own (all of a lone datum's)."""
    if len(members) == 1:
        return len(members[0])
    common = min(_common_length(a, b) for a, b in zip(members, members[1:], strict=False))
    return min(common, *(len(member) - 1 for member in members))


def _groups(inputs: Sequence[Sequence[int]], part_sizes: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first datum, stop, shared length) of each group: consecutive data of one part that share
    at least MIN_SHARED_TOKENS, each member keeping one token of its own at least; a datum with
    no partner is a group of its own, all of whose tokens run in the prefix pass.

    A part is cut into groups so as to save the most positions, sum of (members - 1) x shared
    (by dynamic programming over the cut points): an RL step's samples of several prompts that
    all begin with one system prompt form a group per prompt, sharing the whole prompt, rather
    than one group sharing the system prompt alone."""
    groups, start = [], 0
    for size in part_sizes:
        # best[j]: the most positions saved by groups of the part's first j data; cut[j]: where
        # the last of those groups begins.
        best, cut = [0] * (size + 1), [0] * (size + 1)
        common = [_common_length(inputs[start + i], inputs[start + i + 1]) for i in range(size - 1)]
        for stop in range(1, size + 1):
            best[stop], cut[stop] = best[stop - 1], stop - 1
            shared = len(inputs[start + stop - 1]) - 1
            # The group [first, stop), growing leftwards, up to MAX_GROUP members.
            for first in range(stop - 2, max(stop - MAX_GROUP, 0) - 1, -1):
                shared = min(shared, common[first], len(inputs[start + first]) - 1)
                if shared < MIN_SHARED_TOKENS:
                    break
                saved = best[first] + (stop - first - 1) * shared
                if saved > best[stop]:
                    best[stop], cut[stop] = saved, first
        part_groups, stop = [], size
        while stop > 0:
            first = cut[stop]
            part_groups.append((start + first, start + stop, _shared_length(inputs[start + first : start + stop])))
            stop = first
        groups += part_groups[::-1]
        start += size
    return groups


def plain_positions(inputs: Sequence[Sequence[int]]) -> int:
    """The positions the decoder runs for these data one per row, right-padded."""
    return len(inputs) * max(len(ids) for ids in inputs)


def _shared_positions(inputs: Sequence[Sequence[int]], groups: Sequence[tuple[int, int, int]]) -> int:
    if len(groups) == len(inputs):  # nothing shared: the two passes would run everything twice over
        return 2 * plain_positions(inputs)
    width = max(shared for _, _, shared in groups)
    suffix = max(len(inputs[index]) - shared for first, stop, shared in groups for index in range(first, stop))
    return len(groups) * width + len(inputs) * suffix


def decoder_positions(inputs: Sequence[Sequence[int]], part_sizes: Sequence[int]) -> int:
    """The positions the decoder runs for these data, in the layout `share` chooses."""
    plain, shared = plain_positions(inputs), _shared_positions(inputs, _groups(inputs, part_sizes))
    return shared if shared <= MAX_COST_SHARE * plain else plain


def share(
    inputs: Sequence[Sequence[int]], part_sizes: Sequence[int], device: torch.device, pad_id: int
) -> SharedPrefixes | None:
    """The two-pass layout of these data (each part's data never grouped with another part's),
    or None where it would not save enough positions to be worth a second pass."""
    groups = _groups(inputs, part_sizes)
    if _shared_positions(inputs, groups) > MAX_COST_SHARE * plain_positions(inputs):
        return None
    shared_of = [0] * len(inputs)
    prefix_of = [0] * len(inputs)
    for row, (first, stop, shared) in enumerate(groups):
        for index in range(first, stop):
            shared_of[index], prefix_of[index] = shared, row
    width = max(shared for _, _, shared in groups)
    suffix = max(len(ids) - shared for ids, shared in zip(inputs, shared_of, strict=True))

    prefix_ids = [list(inputs[first][:shared]) + [pad_id] * (width - shared) for first, _, shared in groups]
    suffix_ids, positions, index_N = [], [], []
    mask_B_S_T = torch.zeros((len(inputs), suffix, width + suffix), dtype=torch.bool)
    own_B_S_S = torch.ones((suffix, suffix), dtype=torch.bool).tril()
    suffix_base = len(groups) * width
    for index, (ids, shared) in enumerate(zip(inputs, shared_of, strict=True)):
        rest = len(ids) - shared
        suffix_ids.append(list(ids[shared:]) + [pad_id] * (suffix - rest))
        positions.append(list(range(shared, shared + suffix)))
        mask_B_S_T[index, :, :shared] = True
        mask_B_S_T[index, :, width:] = own_B_S_S
        index_N += [prefix_of[index] * width + p for p in range(shared)]
        index_N += [suffix_base + index * suffix + p for p in range(rest)]
    rows_per_part, start = [], 0
    for size in part_sizes:
        rows_per_part.append(sum(1 for first, _, _ in groups if start <= first < start + size))
        start += size
    return SharedPrefixes(
        prefix_ids_P_W=torch.tensor(prefix_ids, dtype=torch.long, device=device),
        prefix_rows_per_part=rows_per_part,
        suffix_ids_B_S=torch.tensor(suffix_ids, dtype=torch.long, device=device),
        suffix_positions_B_S=torch.tensor(positions, dtype=torch.long, device=device),
        suffix_mask_B_1_S_T=mask_B_S_T.unsqueeze(1).to(device),
        prefix_of_row_B=torch.tensor(prefix_of, dtype=torch.long, device=device),
        hidden_index_N=torch.tensor(index_N, dtype=torch.long, device=device),
    )


def shared_hidden(decoder: nn.Module, shared: SharedPrefixes, mixed: Any = None) -> torch.Tensor:
    """The decoder's last hidden states at the data's real positions, end to end (N, H), by the
    two passes. `mixed` (a `mixed_adapters.MixedPass`, or None) is told how many rows each part
    has in the prefix pass, so each runs through its part's adapter."""
    from transformers import DynamicCache

    width = shared.prefix_ids_P_W.shape[1]
    rows: AbstractContextManager[Any] = mixed.rows(shared.prefix_rows_per_part) if mixed is not None else nullcontext()
    with rows:
        prefix = decoder(
            input_ids=shared.prefix_ids_P_W,
            position_ids=torch.arange(width, device=shared.prefix_ids_P_W.device).expand_as(shared.prefix_ids_P_W),
            attention_mask=None,  # causal: the right padding comes after every real token
            use_cache=True,
        )
    selected = [
        (keys.index_select(0, shared.prefix_of_row_B), values.index_select(0, shared.prefix_of_row_B))
        for keys, values, *_ in prefix.cache
    ]
    suffix = decoder(
        input_ids=shared.suffix_ids_B_S,
        position_ids=shared.suffix_positions_B_S,
        attention_mask=shared.suffix_mask_B_1_S_T,
        cache=DynamicCache(ddp_cache_data=selected),
        use_cache=True,
    )
    hidden_M_H = torch.cat([prefix.last_hidden_state.flatten(0, 1), suffix.last_hidden_state.flatten(0, 1)])
    return hidden_M_H.index_select(0, shared.hidden_index_N)

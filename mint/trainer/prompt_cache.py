"""The prompt cache: the KV of prompt prefixes kept across requests, so that a prompt whose
beginning was run before (an RL group's prompt sampled again, a multi-turn conversation whose
previous turn is the next one's prefix, a repeated system prompt) prefills only the rest.

Prefixes are cached in blocks of BLOCK_TOKENS tokens, as vLLM's prefix caching does: a block's
key hashes its tokens with its parent block's key, so a key names a whole prefix, and prompts
that share a beginning share its blocks. The chain starts from the weights that computed the
KV: an owner (an adapter, or None for the base) and the version of its weights. A weight update
(an optimizer step, a new adapter in a slot) changes the version, and the first lookup or store
under the new version drops every block of the old one, so no KV outlives the weights that
made it. A hit is at most the prompt's length minus one, rounded down to whole blocks: the last
prompt token always runs, since its logits choose the first sampled token.

Blocks are bounded by bytes and evicted least recently used first. A lookup touches a chain's
blocks from its last to its first, so the first blocks of a prefix, which every longer prompt
needs, are evicted after the blocks that extend it. Blocks are copies, never views of a batch's
KV, and a hit is copied into the batch that uses it (`Spliced`): decoding never writes into
the cache.

`Spliced` lays out a prefill whose rows may start from cached prefixes: each row's cached KV
right-aligned in a past of the longest hit's width, its remaining prompt tokens left-padded
after it, an attention mask that hides both paddings and position ids that continue each row's
prefix. With no hit it is exactly the plain left-padded prefill. Used by the trainer's sampler
(`mint.trainer.sampling`) and the torch serving engine (`mint.serving.torch_engine`).
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

BLOCK_TOKENS = 16
# The default bound on the bytes of cached KV, per base (a sampler's or an engine's cache).
DEFAULT_MAX_BYTES = 512 * 2**20


@dataclass(frozen=True)
class _Block:
    """One block's KV in every layer: keys and values of shape (heads, BLOCK_TOKENS, head_dim)."""

    owner: Hashable
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    nbytes: int


@dataclass(frozen=True)
class Hit:
    """The cached KV of a prompt's first `tokens` tokens: per layer, (heads, tokens, head_dim)."""

    tokens: int
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class PromptCacheStats:
    """What a prompt cache has done since it was made, and what it holds now."""

    lookups: int
    hits: int
    hit_tokens: int
    stored_blocks: int
    evicted_blocks: int
    invalidated_blocks: int
    blocks: int
    bytes: int
    max_bytes: int


class PromptCache:
    """Prompt prefixes' KV by block chain, bounded by `max_bytes`, least recently used evicted first."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be 0 or more")
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()
        self._versions: dict[Hashable, Hashable] = {}
        self._owned: dict[Hashable, set[bytes]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self._lookups = self._hits = self._hit_tokens = 0
        self._stored = self._evicted = self._invalidated = 0

    def stats(self) -> PromptCacheStats:
        with self._lock:
            return PromptCacheStats(
                lookups=self._lookups,
                hits=self._hits,
                hit_tokens=self._hit_tokens,
                stored_blocks=self._stored,
                evicted_blocks=self._evicted,
                invalidated_blocks=self._invalidated,
                blocks=len(self._blocks),
                bytes=self._bytes,
                max_bytes=self.max_bytes,
            )

    def lookup(self, owner: Hashable, version: Hashable, prompt: Sequence[int]) -> Hit | None:
        """The longest cached prefix of `prompt` under these weights, whole blocks, shorter than the prompt."""
        with self._lock:
            self._lookups += 1
            self._settle(owner, version)
            found: list[tuple[bytes, _Block]] = []
            for key in _chain(owner, version, prompt, (len(prompt) - 1) // BLOCK_TOKENS):
                block = self._blocks.get(key)
                if block is None:
                    break
                found.append((key, block))
            if not found:
                return None
            for key, _ in reversed(found):
                self._blocks.move_to_end(key)
            self._hits += 1
            self._hit_tokens += len(found) * BLOCK_TOKENS
        blocks = [block for _, block in found]
        return Hit(
            tokens=len(found) * BLOCK_TOKENS,
            keys=tuple(torch.cat(layer, dim=1) for layer in zip(*(b.keys for b in blocks), strict=True)),
            values=tuple(torch.cat(layer, dim=1) for layer in zip(*(b.values for b in blocks), strict=True)),
        )

    def store(
        self,
        owner: Hashable,
        version: Hashable,
        prompt: Sequence[int],
        first: int,
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
    ) -> None:
        """Keep the whole blocks of `prompt` from token `first` (a multiple of BLOCK_TOKENS): `keys`
        and `values` hold, per layer, the KV of `prompt[first:]`, (heads, len(prompt) - first,
        head_dim). Blocks already cached are only touched; the copies are made here."""
        if first % BLOCK_TOKENS:
            raise ValueError(f"a stored prefix starts on a block boundary, not at token {first}")
        chain = _chain(owner, version, prompt, len(prompt) // BLOCK_TOKENS)
        with self._lock:
            self._settle(owner, version)
            for index in range(len(chain) - 1, first // BLOCK_TOKENS - 1, -1):
                key = chain[index]
                if key in self._blocks:
                    self._blocks.move_to_end(key)
                    continue
                start = index * BLOCK_TOKENS - first
                span = slice(start, start + BLOCK_TOKENS)
                block_keys = tuple(layer[:, span].clone() for layer in keys)
                block_values = tuple(layer[:, span].clone() for layer in values)
                nbytes = sum(t.numel() * t.element_size() for t in (*block_keys, *block_values))
                if nbytes > self.max_bytes:
                    return
                self._blocks[key] = _Block(owner, block_keys, block_values, nbytes)
                self._owned.setdefault(owner, set()).add(key)
                self._bytes += nbytes
                self._stored += 1
            # Blocks were added last block first: the chain's first block is now the most recent.
            while self._bytes > self.max_bytes:
                key, block = self._blocks.popitem(last=False)
                self._forget(key, block)
                self._evicted += 1

    def invalidate(self, owner: Hashable) -> None:
        """Drop every block computed by `owner`'s weights (its adapter was removed or replaced)."""
        with self._lock:
            self._drop(owner)
            self._versions.pop(owner, None)

    def _settle(self, owner: Hashable, version: Hashable) -> None:
        """Make `version` the owner's current one; the blocks of any other version go."""
        if self._versions.get(owner, version) != version:
            self._drop(owner)
        self._versions[owner] = version

    def _drop(self, owner: Hashable) -> None:
        for key in self._owned.pop(owner, set()):
            block = self._blocks.pop(key)
            self._bytes -= block.nbytes
            self._invalidated += 1

    def _forget(self, key: bytes, block: _Block) -> None:
        self._bytes -= block.nbytes
        owned = self._owned.get(block.owner)
        if owned is not None:
            owned.discard(key)


def _chain(owner: Hashable, version: Hashable, prompt: Sequence[int], blocks: int) -> list[bytes]:
    """The keys of the prompt's first `blocks` blocks: each hashes its tokens with its parent's key."""
    parent = hashlib.blake2b(repr((owner, version)).encode(), digest_size=16).digest()
    keys = []
    for index in range(blocks):
        tokens = array("q", prompt[index * BLOCK_TOKENS : (index + 1) * BLOCK_TOKENS]).tobytes()
        parent = hashlib.blake2b(parent + tokens, digest_size=16).digest()
        keys.append(parent)
    return keys


@dataclass
class Spliced:
    """A prefill's inputs for rows that may start from cached prefixes.

    `input_ids`, `position_ids` (R, S): each row's uncached prompt tokens, left-padded; `mask`
    (R, C + S): the attention mask over the past's C columns and the new S; `past`: per layer
    the keys and values (R, heads, C, head_dim) of each row's hit, right-aligned and zero-padded
    on the left, or None when no row hit (C = 0: the plain left-padded prefill)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    mask: torch.Tensor
    past: list[tuple[torch.Tensor, torch.Tensor]] | None
    cached: list[int]

    @classmethod
    def of(
        cls, prompts: Sequence[Sequence[int]], hits: Sequence[Hit | None], pad_token_id: int, device: torch.device
    ) -> Spliced:
        cached = [0 if hit is None else hit.tokens for hit in hits]
        width = max(len(prompt) - c for prompt, c in zip(prompts, cached, strict=True))
        past_width = max(cached)
        ids_R_S = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
        mask_R_T = torch.zeros((len(prompts), past_width + width), dtype=torch.long)
        for index, (prompt, c) in enumerate(zip(prompts, cached, strict=True)):
            rest = len(prompt) - c
            ids_R_S[index, width - rest :] = torch.tensor(list(prompt[c:]), dtype=torch.long)
            mask_R_T[index, past_width - c : past_width] = 1
            mask_R_T[index, past_width + width - rest :] = 1
        ids_R_S, mask_R_T = ids_R_S.to(device), mask_R_T.to(device)
        cached_R_1 = torch.tensor(cached, dtype=torch.long, device=device).unsqueeze(-1)
        positions_R_S = (cached_R_1 + mask_R_T[:, past_width:].cumsum(dim=-1) - 1).clamp(min=0)
        past = None
        if past_width:
            like = next(hit for hit in hits if hit is not None)
            past = []
            for layer, (keys, values) in enumerate(zip(like.keys, like.values, strict=True)):
                keys_R = keys.new_zeros((len(prompts), keys.shape[0], past_width, keys.shape[-1]))
                values_R = values.new_zeros((len(prompts), values.shape[0], past_width, values.shape[-1]))
                for index, hit in enumerate(hits):
                    if hit is not None:
                        keys_R[index, :, past_width - hit.tokens :] = hit.keys[layer]
                        values_R[index, :, past_width - hit.tokens :] = hit.values[layer]
                past.append((keys_R, values_R))
        return cls(ids_R_S, positions_R_S, mask_R_T, past, cached)

    def past_cache(self) -> Any:
        """The past as a transformers `DynamicCache` (None when no row hit), for the prefill's forward."""
        if self.past is None:
            return None
        from transformers import DynamicCache

        return DynamicCache(ddp_cache_data=self.past)

    def suffix_kv(
        self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]], row: int, prompt_length: int
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """After the prefill, row `row`'s KV of its uncached prompt tokens (the last columns of
        `layers`, each (R, heads, C + S, head_dim)): what `PromptCache.store` takes."""
        rest = prompt_length - self.cached[row]
        keys = [k[row, :, k.shape[2] - rest :] for k, _ in layers]
        values = [v[row, :, v.shape[2] - rest :] for _, v in layers]
        return keys, values


@dataclass(frozen=True)
class CachedPrompts:
    """A prompt cache as one batch uses it: `weights[i]` is the (owner, version) of the weights
    that run request i, under which its prefixes are looked up and stored."""

    cache: PromptCache
    weights: tuple[tuple[Hashable, Hashable], ...]

    def part(self, start: int, stop: int) -> CachedPrompts:
        """The same cache for requests `start` to `stop` of the batch (a chunk decoded alone)."""
        return CachedPrompts(self.cache, self.weights[start:stop])

    def lookup(self, prompts: Sequence[Sequence[int]]) -> list[Hit | None]:
        return [
            self.cache.lookup(owner, version, prompt)
            for (owner, version), prompt in zip(self.weights, prompts, strict=True)
        ]

    def store(self, prompts: Sequence[Sequence[int]], spliced: Spliced, kv_cache: object) -> None:
        """Keep each prompt's new whole blocks from a prefill's transformers cache; a cache with
        sliding-window or other special layers is not kept (its KV is not a plain prefix)."""
        layers = list(getattr(kv_cache, "layers", ()))
        if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
            return
        kv = [(layer.keys, layer.values) for layer in layers]
        for row, ((owner, version), prompt) in enumerate(zip(self.weights, prompts, strict=True)):
            if len(prompt) // BLOCK_TOKENS > spliced.cached[row] // BLOCK_TOKENS:
                keys, values = spliced.suffix_kv(kv, row, len(prompt))
                self.cache.store(owner, version, prompt, spliced.cached[row], keys, values)

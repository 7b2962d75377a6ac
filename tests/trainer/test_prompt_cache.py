"""The prompt cache on the trainer's sampler: a prompt whose whole blocks were run before
prefills only the rest, with the same samples (float32: greedy tokens equal, logprobs to 1e-5)
whether the batch mixes hits, misses and prompts of other lengths; hits are counted in whole
blocks and reported on every sample; an optimizer step (new weights) gets no hit; the cache
stays within its bytes, evicting least recently used blocks first."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from mint.trainer.prompt_cache import BLOCK_TOKENS, PromptCache
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import TrainingSession
from mint.trainer.types import AdamParams, SampledSequence, SampleRequest, SamplingParams
from tests.trainer.conftest import sft_datum

pytestmark = pytest.mark.backend_free

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, stop=[])


def tokens(count: int, seed: int) -> list[int]:
    return torch.randint(100, 40000, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture
def cache(resident: ResidentBase) -> Iterator[PromptCache]:
    """A fresh cache on the shared base for this test; the base's own one restored afterwards."""
    previous = resident.prompt_cache
    resident.prompt_cache = PromptCache()
    yield resident.prompt_cache
    resident.prompt_cache = previous


def uncached(resident: ResidentBase, run: Callable[[], list[list[SampledSequence]]]) -> list[list[SampledSequence]]:
    """What `run` samples with the prompt cache switched off."""
    previous, resident.prompt_cache = resident.prompt_cache, None
    try:
        return run()
    finally:
        resident.prompt_cache = previous


def assert_same(expected: list[list[SampledSequence]], got: list[list[SampledSequence]]) -> None:
    for want_group, got_group in zip(expected, got, strict=True):
        for want, sample in zip(want_group, got_group, strict=True):
            assert sample.tokens == want.tokens
            assert sample.logprobs == pytest.approx(want.logprobs, abs=1e-5)
            assert sample.top_logprobs is not None and want.top_logprobs is not None
            for want_top, top in zip(want.top_logprobs, sample.top_logprobs, strict=True):
                assert [t for t, _ in top] == [t for t, _ in want_top]
                assert [lp for _, lp in top] == pytest.approx([lp for _, lp in want_top], abs=1e-5)


def test_a_repeated_prompt_reads_its_whole_blocks_and_samples_the_same(
    resident: ResidentBase, cache: PromptCache
) -> None:
    prompt = tokens(40, seed=1)
    request = SampleRequest(prompt, GREEDY, 2, top_logprobs=3)
    expected = uncached(resident, lambda: resident.sample_batch(None, [request]))
    first = resident.sample_batch(None, [request])
    second = resident.sample_batch(None, [request])
    assert [s.prompt_cache_hit_tokens for s in first[0]] == [0, 0]
    # 40 tokens: two whole blocks (32); the last token always runs.
    assert [s.prompt_cache_hit_tokens for s in second[0]] == [2 * BLOCK_TOKENS] * 2
    assert_same(expected, first)
    assert_same(expected, second)
    stats = cache.stats()
    assert (stats.lookups, stats.hits, stats.hit_tokens, stats.blocks) == (2, 1, 32, 2)
    # A prompt of exactly two blocks keeps its last block's last token to run: one block hits.
    exact = SampleRequest(prompt[:32], GREEDY, 1, top_logprobs=3)
    assert resident.sample_batch(None, [exact])[0][0].prompt_cache_hit_tokens == BLOCK_TOKENS


def test_a_batch_splices_hits_misses_and_longer_turns(resident: ResidentBase, cache: PromptCache) -> None:
    """Left-padded rows of different lengths, some from cached prefixes of different lengths
    (a multi-turn conversation whose previous turn is its prefix), sample as they do uncached."""
    system = tokens(20, seed=2)
    turn_1 = system + tokens(30, seed=3)  # 50 tokens
    turn_2 = turn_1 + tokens(27, seed=4)  # 77 tokens: turn 1 is its prefix
    other = system + tokens(5, seed=5)  # 25 tokens: shares the system prompt's first block
    fresh = tokens(9, seed=6)  # shorter than a block
    params = [
        SamplingParams(temperature=0.0, max_tokens=5, stop=[]),
        SamplingParams(temperature=0.9, max_tokens=7, seed=11, stop=[]),
        SamplingParams(temperature=0.7, top_k=20, max_tokens=4, seed=12, stop=[]),
        SamplingParams(temperature=0.0, max_tokens=3, stop=[]),
    ]
    batch = [
        SampleRequest(turn_2, params[0], 1, top_logprobs=2),
        SampleRequest(other, params[1], 3, top_logprobs=2),
        SampleRequest(fresh, params[2], 2, top_logprobs=2),
        SampleRequest(turn_1, params[3], 1, top_logprobs=2),
    ]
    expected = uncached(resident, lambda: resident.sample_batch(None, batch))
    resident.sample_batch(None, [SampleRequest(turn_1, GREEDY, 1)])  # the previous turn: 3 blocks stored
    got = resident.sample_batch(None, batch)
    assert [group[0].prompt_cache_hit_tokens for group in got] == [48, 16, 0, 48]
    assert_same(expected, got)
    # The batch stored turn 2's new blocks: the next turn hits all four of them.
    turn_3 = turn_2 + tokens(3, seed=7)
    assert resident.sample_batch(None, [SampleRequest(turn_3, GREEDY, 1)])[0][0].prompt_cache_hit_tokens == 64


def test_an_optimizer_step_gets_no_hit(
    resident: ResidentBase, cache: PromptCache, open_session: Callable[..., TrainingSession]
) -> None:
    session = open_session(rank=4, seed=3)
    prompt = tokens(40, seed=8)
    request = SampleRequest(prompt, GREEDY, 1)
    name = session.session_id
    resident.sample_batch(name, [request])
    assert resident.sample_batch(name, [request])[0][0].prompt_cache_hit_tokens == 32
    # The base's own weights are another owner: no hit from the adapter's blocks.
    assert resident.sample_batch(None, [request])[0][0].prompt_cache_hit_tokens == 0
    session.forward_backward([sft_datum(prompt[:12])], "cross_entropy")
    session.optim_step(AdamParams(learning_rate=1e-2))
    after = resident.sample_batch(name, [request])[0][0]
    assert after.prompt_cache_hit_tokens == 0
    assert cache.stats().invalidated_blocks == 2  # the old version's blocks went at once
    expected = uncached(resident, lambda: resident.sample_batch(name, [request]))
    again = resident.sample_batch(name, [request])
    assert again[0][0].prompt_cache_hit_tokens == 32
    assert again[0][0].tokens == expected[0][0].tokens
    assert again[0][0].logprobs == pytest.approx(expected[0][0].logprobs, abs=1e-5)
    blocks = cache.stats().blocks
    resident.close(name)  # a closed session's blocks go with it; the base's stay
    assert cache.stats().blocks == blocks - 2 == 2


def test_the_cache_stays_within_its_bytes_and_evicts_least_recently_used_first() -> None:
    layers, heads, dim = 2, 2, 4
    block_bytes = layers * 2 * heads * BLOCK_TOKENS * dim * 4
    cache = PromptCache(max_bytes=3 * block_bytes)

    def store(prompt: list[int]) -> None:
        kv = [torch.randn(heads, len(prompt), dim) for _ in range(layers)]
        cache.store(None, "v1", prompt, 0, kv, kv)

    a, b = tokens(32, seed=9), tokens(33, seed=10)
    store(a)
    store(b)  # 4 blocks: over the bound by one
    stats = cache.stats()
    assert stats.bytes <= stats.max_bytes == 3 * block_bytes
    assert (stats.blocks, stats.evicted_blocks) == (3, 1)
    # a's last block went first (a chain's first block is kept after the blocks that extend it).
    hit = cache.lookup(None, "v1", [*a, 1])
    assert hit is not None and hit.tokens == BLOCK_TOKENS
    assert cache.lookup(None, "v1", [*b, 1]) is not None
    assert cache.lookup(None, "v2", [*b, 1]) is None  # another version: nothing, and v1's blocks go
    assert cache.stats().blocks == 0 and cache.stats().bytes == 0
    # A block larger than the whole bound is not kept.
    tiny = PromptCache(max_bytes=block_bytes - 1)
    tiny.store(None, "v1", a, 0, [torch.randn(heads, 32, dim)] * layers, [torch.randn(heads, 32, dim)] * layers)
    assert tiny.stats().blocks == 0

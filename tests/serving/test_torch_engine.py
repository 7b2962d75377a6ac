"""The torch engine's own promises: the base runs once per step for the whole mixed batch, slot
memory is really freed, and MoE adapters (fused experts, on GLM and Qwen3 bases) and dense
adapters (SmolLM2) serve exactly what peft computes, in batches that mix several of them."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

from mint.config import PROJECT_ROOT
from mint.schemas.base_models import get_base_model_spec
from mint.serving.engine import AdapterTensors, GenerateRequest
from mint.serving.torch_engine import TorchEngine, read_adapter_folder
from mint.trainer.checkpoint import write_sampler_weights
from mint.trainer.head_logprobs import token_logprobs
from mint.trainer.models import load_base_model
from mint.trainer.packed_linear import PackedLinear

if TYPE_CHECKING:
    from tests.serving.conftest import AdapterKit

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

CONFIGS = PROJECT_ROOT / "configs" / "models"
PROMPTS = [[17, 932, 4401, 88, 1203], [5, 19000, 23], [3001, 42, 9, 870, 12, 13, 14, 15, 16]]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def greedy(adapter_id: str | None, prompt: list[int], max_tokens: int = 6) -> GenerateRequest:
    return GenerateRequest(
        adapter_id=adapter_id, prompt_tokens=prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True
    )


@pytest.fixture(scope="module")
def glm_kit(kit_of: Callable[[str], AdapterKit]) -> AdapterKit:
    return kit_of("tiny-glm-moe")


@pytest.fixture(scope="module")
def glm_engine(serving_cache: Path) -> TorchEngine:
    return TorchEngine.from_spec(
        get_base_model_spec("tiny-glm-moe", CONFIGS), serving_cache, max_adapters=3, max_batch_size=4
    )


@pytest.fixture
def engine(glm_engine: TorchEngine) -> Iterator[TorchEngine]:
    yield glm_engine
    for info in glm_engine.adapters():
        glm_engine.remove_adapter(info.adapter_id)


def test_the_base_runs_once_per_step_for_the_whole_mixed_batch(engine: TorchEngine, glm_kit: AdapterKit) -> None:
    names = ["alpha", "beta", "gamma"]
    for name in names:
        engine.add_adapter(glm_kit[name].adapter_id, glm_kit[name].folder)
    q_proj = engine._linears["model.layers.0.self_attn.q_proj"].base
    rows_seen: list[int] = []
    forwards: list[int] = []
    hooks = [
        q_proj.register_forward_hook(lambda module, args, output: rows_seen.append(args[0].shape[0])),
        engine._model.register_forward_hook(lambda module, args, output: forwards.append(1)),
    ]
    try:
        requests = [greedy(glm_kit[n].adapter_id, PROMPTS[i]) for i, n in enumerate(names)]
        results = engine.generate([*requests, greedy(None, PROMPTS[0])])
    finally:
        for hook in hooks:
            hook.remove()
    # One prefill and five decode steps, each one forward with all four rows, not one per request.
    assert len(forwards) == 6
    assert rows_seen == [4] * 6
    for result, name, prompt in zip(results, [*names, None], [*PROMPTS, PROMPTS[0]], strict=True):
        assert result.tokens == glm_kit.reference(name, prompt, 6).tokens


def test_a_batch_on_one_adapter_serves_it(engine: TorchEngine, glm_kit: AdapterKit) -> None:
    alpha = glm_kit["alpha"]
    engine.add_adapter(alpha.adapter_id, alpha.folder)
    results = engine.generate([greedy(alpha.adapter_id, prompt) for prompt in PROMPTS])
    for result, prompt in zip(results, PROMPTS, strict=True):
        reference = glm_kit.reference("alpha", prompt, 6)
        assert result.tokens == reference.tokens
        assert result.logprobs == pytest.approx(reference.logprobs, abs=2e-4)


def test_end_of_sequence_stops_unless_ignored(engine: TorchEngine, glm_kit: AdapterKit) -> None:
    """The base's end-of-sequence tokens end a request by default (the random base never emits its
    real one, so a token it does emit stands in for it)."""
    tokens = glm_kit.reference(None, PROMPTS[1], 6).tokens
    stand_in = next(t for i, t in enumerate(tokens) if i >= 2 and t not in tokens[:i])
    eos, engine.eos_token_ids = engine.eos_token_ids, frozenset({stand_in})
    try:
        request = GenerateRequest(prompt_tokens=PROMPTS[1], max_tokens=6, temperature=0.0)
        stopped, ignored = engine.generate([request, request.model_copy(update={"ignore_eos": True})])
    finally:
        engine.eos_token_ids = eos
    assert stopped.tokens == tokens[: tokens.index(stand_in) + 1]
    assert (stopped.finish_reason, stopped.stop_match) == ("stop", stand_in)
    assert (ignored.tokens, ignored.finish_reason) == (tokens, "length")


def test_without_grouped_matmul_the_gathered_path_serves_the_same(engine: TorchEngine, glm_kit: AdapterKit) -> None:
    """Where torch has no grouped matmul for the device and dtype, per-row gathered factors and bmm."""
    for name in ("alpha", "beta"):
        engine.add_adapter(glm_kit[name].adapter_id, glm_kit[name].folder)
    plan = [("alpha", PROMPTS[0]), (None, PROMPTS[1]), ("beta", PROMPTS[2]), ("alpha", PROMPTS[1])]
    grouped_mm, engine._context.grouped_mm = engine._context.grouped_mm, None
    try:
        results = engine.generate([greedy(glm_kit[n].adapter_id if n else None, p) for n, p in plan])
    finally:
        engine._context.grouped_mm = grouped_mm
    assert grouped_mm is not None  # torch 2.13 on CPU has it: the default path is the grouped one
    for result, (name, prompt) in zip(results, plan, strict=True):
        reference = glm_kit.reference(name, prompt, 6)
        assert result.tokens == reference.tokens
        assert result.logprobs == pytest.approx(reference.logprobs, abs=2e-4)


def test_removing_an_adapter_empties_its_slot_and_keeps_nothing_of_it(serving_cache: Path, glm_kit: AdapterKit) -> None:
    engine = TorchEngine.from_spec(get_base_model_spec("tiny-glm-moe", CONFIGS), serving_cache, max_adapters=3)
    assert engine.memory_bytes() == 0  # nothing is reserved before the first adapter
    folder = glm_kit["alpha"].folder
    tensors = load_file(folder / "adapter_model.safetensors")
    watched = weakref.ref(next(iter(tensors.values())))
    engine.add_adapter("alpha", AdapterTensors(config=read_adapter_folder(folder).config, tensors=tensors))
    del tensors
    gc.collect()
    assert watched() is None  # the engine copied the weights into its slot and kept no reference
    engine.add_adapter("beta", glm_kit["beta"].folder)
    assert (engine.slot_of("alpha"), engine.slot_of("beta")) == (1, 2)
    reserved = engine.memory_bytes()

    q_proj = engine._linears["model.layers.1.self_attn.q_proj"].stack
    assert q_proj.a is not None and q_proj.a[1].abs().sum() > 0
    engine.remove_adapter("alpha")
    assert q_proj.a[1].abs().sum() == 0 and q_proj.bt is not None and q_proj.bt[1].abs().sum() == 0
    engine.add_adapter("gamma", glm_kit["gamma"].folder)
    assert engine.slot_of("gamma") == 1  # alpha's slot, reused
    for _ in range(3):  # adapters coming and going reuse the reserved slots: no growth
        engine.remove_adapter("gamma")
        engine.add_adapter("gamma", glm_kit["gamma"].folder)
    assert engine.memory_bytes() == reserved
    (result,) = engine.generate([greedy("gamma", PROMPTS[0])])
    assert result.tokens == glm_kit.reference("gamma", PROMPTS[0], 6).tokens


def test_an_engine_with_a_thread_of_its_own_computes_only_there_until_closed(
    serving_cache: Path, glm_kit: AdapterKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a compute thread of its own (what `open_engine` gives a serving node), the engine
    loads its base, fills and empties slots, and runs every step of streams that three threads
    read at once on that thread alone, serves what peft computes, and ends the thread on close."""
    from mint.serving import lora_slots, torch_engine

    threads: dict[str, set[str]] = {"load": set(), "fill": set(), "clear": set(), "forward": set()}

    def on(kind: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            threads[kind].add(threading.current_thread().name)
            return function(*args, **kwargs)

        return recorded

    monkeypatch.setattr(torch_engine, "load_base_model", on("load", torch_engine.load_base_model))
    monkeypatch.setattr(lora_slots.SlotStack, "load", on("fill", lora_slots.SlotStack.load))
    monkeypatch.setattr(lora_slots.SlotStack, "clear", on("clear", lora_slots.SlotStack.clear))
    spec = get_base_model_spec("tiny-glm-moe", CONFIGS)
    engine = TorchEngine.from_spec(spec, serving_cache, max_adapters=2, max_batch_size=2, own_thread=True)
    try:
        engine._model.register_forward_hook(lambda *_: threads["forward"].add(threading.current_thread().name))
        for name in ("alpha", "beta"):
            engine.add_adapter(glm_kit[name].adapter_id, glm_kit[name].folder)
        plan = [("alpha", PROMPTS[0]), ("beta", PROMPTS[2]), (None, PROMPTS[1])]
        tokens: dict[int, list[int]] = {}

        def read(index: int) -> None:
            name, prompt = plan[index]
            request = greedy(glm_kit[name].adapter_id if name else None, prompt)
            tokens[index] = [token for event in engine.stream([request]) for token in event.token_ids]

        readers = [threading.Thread(target=read, args=(index,), name=f"reader-{index}") for index in range(len(plan))]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        engine.remove_adapter(glm_kit["beta"].adapter_id)
    finally:
        engine.close()
    one = {"torch-engine"}
    assert threads == {"load": one, "fill": one, "clear": one, "forward": one}
    for index, (name, prompt) in enumerate(plan):
        assert tokens[index] == glm_kit.reference(name, prompt, 6).tokens
    assert "torch-engine" not in {thread.name for thread in threading.enumerate()}


def test_an_engine_that_fails_to_load_leaves_no_thread_of_its_own(
    serving_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mint.errors import ConfigurationError
    from mint.serving import torch_engine

    def unreadable(*_: Any, **__: Any) -> Any:
        raise ConfigurationError("the checkpoint is unreadable")

    monkeypatch.setattr(torch_engine, "load_base_model", unreadable)
    with pytest.raises(ConfigurationError, match="unreadable"):
        TorchEngine.from_spec(get_base_model_spec("tiny-glm-moe", CONFIGS), serving_cache, own_thread=True)
    assert "torch-engine" not in {thread.name for thread in threading.enumerate()}


def test_a_cpu_engine_holds_each_base_weight_once_prepacked_and_serves_the_same(
    serving_cache: Path, glm_kit: AdapterKit
) -> None:
    spec = get_base_model_spec("tiny-glm-moe", CONFIGS)
    model, tokenizer = load_base_model(spec, serving_cache)
    plain_weights = {
        name: weakref.ref(module.weight)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    packed = TorchEngine(model, tokenizer, base_model=spec.name, max_adapters=2)
    unpacked = TorchEngine(
        *load_base_model(spec, serving_cache), base_model=spec.name, max_adapters=2, prepack_weights=False
    )
    assert packed._linears.keys() == unpacked._linears.keys()
    assert all(isinstance(wrapper.base, PackedLinear) for wrapper in packed._linears.values())
    assert not any(isinstance(wrapper.base, PackedLinear) for wrapper in unpacked._linears.values())
    del model
    gc.collect()
    # The packed layout replaced each plain weight: nothing holds the plain copies any more.
    assert [name for name in packed._linears if plain_weights[name]() is not None] == []

    requests = [greedy(None, PROMPTS[2])]
    for name, prompt in zip(["alpha", "beta"], PROMPTS, strict=False):
        for engine in (packed, unpacked):
            engine.add_adapter(glm_kit[name].adapter_id, glm_kit[name].folder)
        requests.append(greedy(glm_kit[name].adapter_id, prompt))
    for result, reference in zip(packed.generate(requests), unpacked.generate(requests), strict=True):
        assert result.tokens == reference.tokens
        assert result.logprobs == pytest.approx(reference.logprobs, abs=1e-5)


def test_a_peft_model_is_not_taken_over(serving_cache: Path) -> None:
    from mint.errors import ConfigurationError

    spec = get_base_model_spec("tiny-glm-moe", CONFIGS)
    model, tokenizer = load_base_model(spec, serving_cache)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))
    with pytest.raises(ConfigurationError):
        TorchEngine(peft_model, tokenizer, base_model=spec.name)


# ---- against peft itself, on fresh models ------------------------------------------------------


def peft_greedy(model: Any, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and their logprobs, one request at a time with a KV cache (no engine involved)."""
    tokens: list[int] = []
    logprobs: list[float] = []
    with torch.no_grad():
        output = model(input_ids=torch.tensor([prompt]), use_cache=True)
        for _ in range(max_tokens):
            logits_1_V = output.logits[:, -1].float()
            token = logits_1_V.argmax(dim=-1)
            tokens.append(int(token))
            logprobs.append(float(token_logprobs(logits_1_V, token)[0]))
            output = model(input_ids=token[:, None], cache=output.cache, use_cache=True)
    return tokens, logprobs


def peft_adapters(
    model: Any, configs: dict[str, LoraConfig], folder: Path, seed: int, std: float = 0.05
) -> tuple[Any, dict[str, Path]]:
    """A peft model holding `configs` as adapters with seeded random A and B, each saved in the PEFT format.

    Adapter names must not be module names of the base: peft drops from a saved adapter every
    key that contains another adapter's name as a segment. peft draws A from torch's global
    generator, which is seeded here, so the adapters do not depend on the tests run before.
    """
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    peft_model: Any = None
    folders = {}
    for name, config in configs.items():
        if peft_model is None:
            peft_model = get_peft_model(model, config, adapter_name=name)
        else:
            peft_model.add_adapter(name, config)
        with torch.no_grad():
            for parameter_name, parameter in peft_model.named_parameters():
                if f"lora_B.{name}." in parameter_name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
        folders[name] = write_sampler_weights(peft_model, name, folder / name)
    peft_model.eval()
    return peft_model, folders


def reference_outputs(
    peft_model: Any, plan: list[tuple[str | None, list[int]]], max_tokens: int
) -> list[tuple[list[int], list[float]]]:
    outputs = []
    for name, prompt in plan:
        if name is None:
            with peft_model.disable_adapter():
                outputs.append(peft_greedy(peft_model, prompt, max_tokens))
        else:
            peft_model.set_adapter(name)
            outputs.append(peft_greedy(peft_model, prompt, max_tokens))
    return outputs


@pytest.mark.parametrize("base", ["tiny-glm-moe", "tiny-qwen3-moe"])
def test_expert_lora_serves_what_peft_computes(base: str, serving_cache: Path, tmp_path: Path) -> None:
    spec = get_base_model_spec(base, CONFIGS)
    model, _ = load_base_model(spec, serving_cache)
    configs = {
        # Routed experts only: their fused weights are all this adapter changes.
        "routed": LoraConfig(r=8, lora_alpha=16, target_modules=[], target_parameters=EXPERTS),
        "both": LoraConfig(r=4, lora_alpha=8, target_modules=ATTENTION, target_parameters=EXPERTS),
    }
    peft_model, folders = peft_adapters(model, configs, tmp_path, seed=5)
    plan: list[tuple[str | None, list[int]]] = [
        ("routed", PROMPTS[0]),
        ("both", PROMPTS[1]),
        (None, PROMPTS[2]),
        ("routed", PROMPTS[2]),
        ("both", PROMPTS[0]),
    ]
    expected = reference_outputs(peft_model, plan, 6)
    base_logprobs = reference_outputs(peft_model, [(None, PROMPTS[0])], 6)[0][1]
    # Expert LoRA alone changes the distribution (the tokens of a random model may stay the same).
    assert max(abs(a - b) for a, b in zip(expected[0][1], base_logprobs, strict=True)) > 1e-3

    engine = TorchEngine.from_spec(spec, serving_cache, max_adapters=2, max_batch_size=8)
    for name, folder in folders.items():
        engine.add_adapter(name, folder)
    results = engine.generate([greedy(name, prompt) for name, prompt in plan])
    for result, (tokens, logprobs) in zip(results, expected, strict=True):
        assert result.tokens == tokens
        assert result.logprobs == pytest.approx(logprobs, abs=2e-4)


@pytest.mark.slow
def test_dense_smollm2_mixed_batch_serves_what_peft_computes(serving_cache: Path, tmp_path: Path) -> None:
    spec = get_base_model_spec("smollm2-135m-instruct", CONFIGS)
    model, tokenizer = load_base_model(spec, serving_cache)  # the first load dequantizes the GGUF (~20 s)
    every_linear = list(spec.lora.target_modules)
    configs = {
        "one": LoraConfig(r=8, lora_alpha=16, target_modules=every_linear),
        "two": LoraConfig(r=16, lora_alpha=32, target_modules=[*every_linear, "lm_head"]),
    }
    peft_model, folders = peft_adapters(model, configs, tmp_path, seed=6, std=0.5)
    prompt = tokenizer.encode("What is the capital of France?")
    plan: list[tuple[str | None, list[int]]] = [("one", prompt), ("two", prompt[2:]), (None, prompt)]
    expected = reference_outputs(peft_model, plan, 5)
    assert len({tuple(tokens) for tokens, _ in expected}) == 3

    engine = TorchEngine.from_spec(spec, serving_cache, max_adapters=2, max_batch_size=4)
    for name, folder in folders.items():
        engine.add_adapter(name, folder)
    results = engine.generate([greedy(name, p, 5) for name, p in plan])
    for result, (tokens, logprobs) in zip(results, expected, strict=True):
        assert result.tokens == tokens
        assert result.logprobs == pytest.approx(logprobs, abs=2e-4)
    # The head shares its weight with the embeddings: it stays plain, one copy, where the rest is packed.
    head = engine._linears["lm_head"].base
    assert isinstance(head, torch.nn.Linear) and head.weight is engine._model.get_input_embeddings().weight
    assert isinstance(engine._linears["model.layers.0.mlp.down_proj"].base, PackedLinear)

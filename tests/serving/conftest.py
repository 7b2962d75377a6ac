"""Serving fixtures: engine factories, bases, and adapters whose correct outputs are known.

Every engine implementation is listed once in `ENGINE_FACTORIES`, with the base its contract
runs on; the contract tests run once per entry. The torch engine runs it on `tiny-glm-moe`,
so the MoE code paths (attention, dense and shared MLPs, fused routed experts) are covered; an
engine that cannot serve MoE LoRA here (vLLM on CPU) names `smollm2-135m-instruct`. A factory
returns any object that keeps the `Engine` protocol in this process, e.g. a client of an
engine running in a venv of its own.

Adapters are made by Mint's trainer: sessions on one `ResidentBase` whose LoRA B matrices are
set to seeded random values (so each adapter visibly changes the base's outputs), saved in the
PEFT format with `save_weights_for_sampler`. The sessions stay open, so the reference output of
each adapter is peft's own, computed by `TrainingSession.sample` with that single adapter
active. Bases are built into a pytest temporary cache, never under ~/.mint.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

if importlib.util.find_spec("torch") is None:  # the serve extra is not installed
    collect_ignore = ["test_engine_contract.py", "test_torch_engine.py", "test_sampler_trainer_logprobs.py"]
else:
    import torch

    from mint.config import PROJECT_ROOT
    from mint.schemas.base_models import BaseModelSpec, get_base_model_spec
    from mint.serving.engine import Engine
    from mint.serving.torch_engine import TorchEngine
    from mint.trainer.session import ResidentBase
    from mint.trainer.training_session import TrainingSession
    from mint.trainer.types import LoraOptions, SampledSequence, SamplingParams

    CONFIGS = PROJECT_ROOT / "configs" / "models"

    @dataclass(frozen=True)
    class EngineFactory:
        """How to build one engine implementation, and the base its contract tests run on.

        `make(spec, cache_dir, max_adapters, max_batch_size)` returns a started engine.
        """

        name: str
        base: str
        make: Callable[[BaseModelSpec, Path, int, int], Engine]
        # Every slot a contract test may fill at once.
        max_adapters: int = 3
        # Small, so that the contract's batches overflow it and exercise continuous batching.
        max_batch_size: int = 3

    def make_torch_engine(spec: BaseModelSpec, cache_dir: Path, max_adapters: int, max_batch_size: int) -> Engine:
        return TorchEngine.from_spec(spec, cache_dir, max_adapters=max_adapters, max_batch_size=max_batch_size)

    from tests.serving.vllm_factory import VLLM_BASE, make_vllm_engine, needs_vllm

    ENGINE_FACTORIES = [
        EngineFactory("torch", "tiny-glm-moe", make_torch_engine),
        pytest.param(EngineFactory("vllm", VLLM_BASE, make_vllm_engine), marks=needs_vllm),
    ]

    @pytest.fixture(scope="package", autouse=True)
    def one_torch_thread() -> Iterator[None]:
        """One intra-op thread: the tiny models gain nothing from more, and the machine is shared."""
        previous = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(previous)

    @pytest.fixture(scope="session")
    def serving_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return tmp_path_factory.mktemp("serving-base-models")

    def content_id(folder: Path) -> str:
        """An adapter id as callers derive it: the sha256 of the adapter's weights file."""
        return hashlib.sha256((folder / "adapter_model.safetensors").read_bytes()).hexdigest()

    @pytest.fixture(scope="session")
    def adapter_id_of() -> Callable[[Path], str]:
        """`content_id`, for tests that save adapters of their own."""
        return content_id

    def randomise_lora_b(session: TrainingSession, seed: int, std: float = 0.05) -> None:
        """Give a fresh adapter (B = 0) seeded random B matrices, so that it changes the outputs."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, parameter in session.named_parameters().items():
                if "lora_B" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)

    # name -> (LoRA options, seed of its B matrices). `alpha` adapts everything a session can on
    # the base (attention, dense and shared MLPs as parameters, fused experts, output head);
    # the others adapt no parameters, as peft needs when sessions differ in parameter targets.
    ADAPTER_RECIPES: dict[str, tuple[LoraOptions, int]] = {
        "alpha": (LoraOptions(seed=1), 101),
        "beta": (LoraOptions(seed=2, rank=8, train_mlp=False, train_experts=False), 102),
        "gamma": (LoraOptions(seed=3, rank=4, train_mlp=False, train_experts=False, train_unembed=False), 103),
        "delta": (LoraOptions(seed=4, train_mlp=False, train_experts=False), 104),
    }

    @dataclass
    class Adapter:
        name: str
        adapter_id: str
        folder: Path
        session: TrainingSession

    @dataclass
    class AdapterKit:
        """Adapters of one base in the PEFT format, and their reference outputs under peft."""

        resident: ResidentBase
        adapters: dict[str, Adapter]
        folder: Path
        _references: dict[tuple[str | None, tuple[int, ...], int], SampledSequence] = field(default_factory=dict)

        def __getitem__(self, name: str) -> Adapter:
            return self.adapters[name]

        def reference(self, name: str | None, prompt: list[int], max_tokens: int) -> SampledSequence:
            """Greedy tokens and logprobs of peft with adapter `name` alone active (None: the base)."""
            key = (name, tuple(prompt), max_tokens)
            if key not in self._references:
                sample = self.adapters[name].session.sample if name is not None else self.resident.sample
                params = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=[])
                self._references[key] = sample(prompt, params)[0]
            return self._references[key]

    def build_kit(base: str, cache_dir: Path, folder: Path) -> AdapterKit:
        resident = ResidentBase(get_base_model_spec(base, CONFIGS), cache_dir)
        adapters = {}
        for name, (options, seed) in ADAPTER_RECIPES.items():
            session = resident.create_session(options)
            randomise_lora_b(session, seed)
            saved = session.save_weights_for_sampler(folder / name)
            adapters[name] = Adapter(name, content_id(saved), saved, session)
        return AdapterKit(resident, adapters, folder)

    @pytest.fixture(scope="session", params=ENGINE_FACTORIES, ids=lambda factory: factory.name)
    def engine_factory(request: pytest.FixtureRequest) -> EngineFactory:
        factory: EngineFactory = request.param
        return factory

    @pytest.fixture(scope="session")
    def kit_of(serving_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], AdapterKit]:
        """The adapter kit of a base, built on first use and shared by every test after."""
        kits: dict[str, AdapterKit] = {}

        def kit_of_(base: str) -> AdapterKit:
            if base not in kits:
                kits[base] = build_kit(base, serving_cache, tmp_path_factory.mktemp(f"adapters-{base}"))
            return kits[base]

        return kit_of_

    @pytest.fixture(scope="session")
    def kit(engine_factory: EngineFactory, kit_of: Callable[[str], AdapterKit]) -> AdapterKit:
        return kit_of(engine_factory.base)

    @pytest.fixture(scope="session")
    def shared_engine(engine_factory: EngineFactory, serving_cache: Path) -> Engine:
        spec = get_base_model_spec(engine_factory.base, CONFIGS)
        return engine_factory.make(spec, serving_cache, engine_factory.max_adapters, engine_factory.max_batch_size)

    @pytest.fixture
    def engine(shared_engine: Engine) -> Iterator[Engine]:
        """The factory's engine, emptied of adapters after each test."""
        yield shared_engine
        for info in shared_engine.adapters():
            shared_engine.remove_adapter(info.adapter_id)

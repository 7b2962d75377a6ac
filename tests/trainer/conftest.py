"""Trainer fixtures: one tiny-glm-moe base (float32, CPU) loaded once for the whole run.

The base is built from its seed into a pytest temporary cache, never under ~/.mint. Tests
open sessions through `open_session`, which closes them afterwards, so every test starts
from a base with no adapters.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

if importlib.util.find_spec("torch") is None:  # the train extra is not installed: only the types run
    collect_ignore = ["test_lora.py", "test_losses.py", "test_sampling.py", "test_session.py"]
else:
    from mint.config import PROJECT_ROOT
    from mint.schemas.base_models import BaseModelSpec, get_base_model_spec
    from mint.trainer.session import ResidentBase
    from mint.trainer.training_session import TrainingSession
    from mint.trainer.types import Datum, LoraOptions

    BASE_NAME = "tiny-glm-moe"

    @pytest.fixture(scope="package", autouse=True)
    def one_torch_thread() -> Iterator[None]:
        """Run the trainer tests on one intra-op thread, then restore the setting.

        The tiny model's matmuls gain nothing from a second thread, and on a shared 2-core
        machine torch's spinning worker threads made this folder 5-8x slower (147 s against
        18 s measured while another process held a core). Results agree to float round-off
        (the order of a kernel's sums changes with the number of threads).
        """
        import torch

        previous = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(previous)

    @pytest.fixture(scope="session")
    def spec() -> BaseModelSpec:
        return get_base_model_spec(BASE_NAME, PROJECT_ROOT / "configs" / "models")

    @pytest.fixture(scope="session")
    def base_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return tmp_path_factory.mktemp("base-models")

    @pytest.fixture(scope="session")
    def resident(spec: BaseModelSpec, base_cache: Path) -> ResidentBase:
        # Mixed forward_backward passes, which a CPU base leaves off by default: the tests
        # check their isolation.
        return ResidentBase(spec, base_cache, mix_backward=True)

    @pytest.fixture(scope="package")
    def smollm2(tmp_path_factory: pytest.TempPathFactory) -> ResidentBase:
        """SmolLM2-135M-Instruct, a real dense model (dequantized from its GGUF once, ~20 s), for
        learning that needs what a random base lacks: embeddings in which classes of tokens
        (say, those that begin with a capital) share features, so that rewarding some raises all."""
        spec = get_base_model_spec("smollm2-135m-instruct", PROJECT_ROOT / "configs" / "models")
        return ResidentBase(spec, tmp_path_factory.mktemp("smollm2"))

    @pytest.fixture
    def open_session(resident: ResidentBase) -> Iterator[Callable[..., TrainingSession]]:
        """Open sessions on the shared base; every one still open is closed after the test."""

        def open_(options: LoraOptions | None = None, **switches: object) -> TrainingSession:
            return resident.create_session(options or LoraOptions.model_validate(switches))

        yield open_
        for session in resident.sessions:
            resident.close(session.session_id)

    def sft_datum(tokens: list[int], prompt_length: int = 0) -> Datum:
        """Next-token prediction on `tokens`, with the first `prompt_length` targets weighted 0."""
        inputs, targets = tokens[:-1], tokens[1:]
        weights = [0.0 if i < prompt_length else 1.0 for i in range(len(targets))]
        return Datum(model_input=inputs, loss_fn_inputs={"target_tokens": targets, "weights": weights})

    @pytest.fixture
    def sft() -> Callable[..., Datum]:
        """`sft_datum`, for tests that build their own sequences."""
        return sft_datum

    @pytest.fixture
    def toy_data() -> list[Datum]:
        """Three short sequences of different lengths (ids inside SmolLM2's vocabulary)."""
        return [
            sft_datum([17, 932, 4401, 88, 1203, 7, 311], prompt_length=2),
            sft_datum([5, 19000, 23, 23, 640]),
            sft_datum([3001, 42, 9, 870, 12, 13, 14, 15, 16, 2], prompt_length=3),
        ]

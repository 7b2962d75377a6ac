"""A saved adapter names its base by the registry name (`base_model_name_or_path`), never by the
folder this server loaded the base from: sampler weights are what jobs store as versions, Tinker
publishes and exports, and tenants download, and the folder (MINT_HOME/models/...) was the
server's. Mint itself reads a version's base from its own records, so such an adapter still
loads as a warm start, in the serving engine, and in plain peft."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mint.schemas.base_models import BaseModelSpec
from mint.serving.engine import GenerateRequest
from mint.serving.torch_engine import TorchEngine
from mint.trainer.models import load_base_model
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import TrainingSession
from mint.trainer.types import AdamParams, Datum, SamplingParams

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 2, 198, 1, 4093, 198]


def test_sampler_weights_name_the_base_and_load_as_warm_start_in_serving_and_in_peft(
    tmp_path: Path,
    spec: BaseModelSpec,
    base_cache: Path,
    resident: ResidentBase,
    open_session: Callable[..., TrainingSession],
    toy_data: list[Datum],
) -> None:
    session = open_session(seed=4)
    for _ in range(2):
        session.forward_backward(toy_data, "cross_entropy")
        session.optim_step(AdamParams(learning_rate=5e-2))
    folder = session.save_weights_for_sampler(tmp_path / "adapter")

    text = (folder / "adapter_config.json").read_text(encoding="utf-8")
    assert json.loads(text)["base_model_name_or_path"] == spec.name == "tiny-glm-moe"
    assert str(base_cache) not in text and str(base_cache.resolve()) not in text
    assert json.loads(text)["r"] == spec.lora.rank  # the rest is what peft wrote

    # A warm start (and an upload's validation) loads it into the resident base: the same weights.
    loaded = resident.create_session_from_adapter(folder)
    expected = session.named_parameters()
    assert all(torch.equal(parameter, expected[name]) for name, parameter in loaded.named_parameters().items())
    greedy = SamplingParams(max_tokens=6, temperature=0.0, stop=[])
    assert loaded.sample(PROMPT, greedy)[0].tokens == session.sample(PROMPT, greedy)[0].tokens

    # A serving node's engine takes it by folder.
    engine = TorchEngine.from_spec(spec, base_cache, max_adapters=1, max_batch_size=1)
    engine.add_adapter("named-base", folder)
    request = GenerateRequest(
        adapter_id="named-base", prompt_tokens=PROMPT, max_tokens=4, temperature=0.0, ignore_eos=True
    )
    (served,) = engine.generate([request])
    assert len(served.tokens) == 4

    # And plain peft, given the base (what a tenant does with a download), loads it too.
    from peft import PeftModel

    model, _ = load_base_model(spec, base_cache)
    peft_model = PeftModel.from_pretrained(model, folder)
    assert peft_model.peft_config["default"].base_model_name_or_path == "tiny-glm-moe"

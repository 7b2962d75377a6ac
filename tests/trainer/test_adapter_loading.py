"""A PEFT-format adapter (as `save_weights_for_sampler` writes it) opened as a new session on the
resident base samples exactly as the session that saved it; adapters that do not fit are refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mint.errors import InvalidRequest
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import TrainingSession
from mint.trainer.types import AdamParams, Datum, SamplingParams

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, stop=[])
SEEDED = SamplingParams(max_tokens=12, temperature=1.0, seed=5, stop=[])
PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 2, 198, 1, 4093, 198]


def trained(open_session: Callable[..., TrainingSession], toy_data: list[Datum]) -> TrainingSession:
    session = open_session(seed=3)
    for _ in range(3):
        session.forward_backward(toy_data, "cross_entropy")
        session.optim_step(AdamParams(learning_rate=5e-2))
    return session


def test_loaded_adapter_samples_like_the_session_that_saved_it(
    tmp_path: Path, resident: ResidentBase, open_session: Callable[..., TrainingSession], toy_data: list[Datum]
) -> None:
    original = trained(open_session, toy_data)
    folder = original.save_weights_for_sampler(tmp_path / "adapter")
    loaded = resident.create_session_from_adapter(folder)

    assert loaded.session_id != original.session_id and loaded.step == 0
    assert loaded.targets == original.targets
    expected = original.named_parameters()
    for name, parameter in loaded.named_parameters().items():
        assert torch.equal(parameter, expected[name]), name
    for params in (GREEDY, SEEDED):
        want = original.sample(PROMPT, params)[0]
        got = loaded.sample(PROMPT, params)[0]
        assert got.tokens == want.tokens
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    # The adapter changed the model: the base alone samples something else.
    assert resident.sample(PROMPT, GREEDY)[0].tokens != original.sample(PROMPT, GREEDY)[0].tokens
    # A loaded session trains on like any other: its optimizer starts empty.
    loaded.forward_backward(toy_data, "cross_entropy")
    loaded.optim_step(AdamParams(learning_rate=1e-3))
    assert loaded.step == 1


def test_adapters_that_do_not_fit_are_refused_and_leave_no_session(
    tmp_path: Path, resident: ResidentBase, open_session: Callable[..., TrainingSession]
) -> None:
    folder = open_session(seed=1).save_weights_for_sampler(tmp_path / "adapter")
    open_before = len(resident.sessions)

    dora = tmp_path / "dora"
    dora.mkdir()
    config = json.loads((folder / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    (dora / "adapter_model.safetensors").write_bytes((folder / "adapter_model.safetensors").read_bytes())
    with pytest.raises(InvalidRequest, match="use_dora"):
        resident.create_session_from_adapter(dora)

    resized = tmp_path / "resized"
    resized.mkdir()
    (resized / "adapter_config.json").write_text((folder / "adapter_config.json").read_text())
    weights = load_file(folder / "adapter_model.safetensors")
    name = sorted(weights)[0]
    weights[name] = torch.zeros(weights[name].shape[0] + 1, *weights[name].shape[1:])
    save_file(weights, resized / "adapter_model.safetensors")
    with pytest.raises(InvalidRequest, match="another base model"):
        resident.create_session_from_adapter(resized)

    with pytest.raises(Exception, match="PEFT adapter"):
        resident.create_session_from_adapter(tmp_path / "missing")
    assert len(resident.sessions) == open_before

"""A serving node refuses a machine that cannot hold its base (`mint.serving.fit`).

The check is a function of the base's serving profile, the engine the node would run and the
machine's resources, so it is tested here on stated machines (eight H100s, one H200, a laptop
with no GPU); then `mint serve` is started for real, on this machine, with bases whose profiles
need more than it has, and must exit saying what they need and what it has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from mint.config import PROJECT_ROOT
from mint.errors import ConfigurationError
from mint.schemas.base_models import ServingProfile, get_base_model_spec
from mint.serving.engines import vllm_parallel_options
from mint.serving.fit import MachineResources, machine_resources, refuse_unless_fits

pytestmark = pytest.mark.backend_free

CONFIGS = PROJECT_ROOT / "configs" / "models"
EIGHT_H100 = MachineResources(gpu_memory_gib=(79.6,) * 8, host_memory_gib=2048.0)
ONE_H200 = MachineResources(gpu_memory_gib=(139.8,), host_memory_gib=128.0)
LAPTOP = MachineResources(gpu_memory_gib=(), host_memory_gib=24.0)


def profile_of(name: str) -> ServingProfile:
    return get_base_model_spec(name, CONFIGS, include_disabled=True).serving


def test_bases_that_fit_are_let_through() -> None:
    refuse_unless_fits("minimax-m2", profile_of("minimax-m2"), "vllm", EIGHT_H100)  # 8 GPUs, 493 of 637 GiB
    refuse_unless_fits("glm-4.5-air", profile_of("glm-4.5-air"), "vllm", EIGHT_H100)  # 4 of the 8
    refuse_unless_fits("qwen3-30b-a3b", profile_of("qwen3-30b-a3b"), "vllm", ONE_H200)
    for tiny in ("tiny-glm-moe", "tiny-qwen3-moe", "smollm2-135m-instruct"):
        refuse_unless_fits(tiny, profile_of(tiny), "torch", LAPTOP)


def test_too_few_gpus_is_refused_saying_how_many() -> None:
    with pytest.raises(ConfigurationError) as refused:
        refuse_unless_fits("kimi-k2", profile_of("kimi-k2"), "vllm", EIGHT_H100)
    message = refused.value.message
    assert "kimi-k2 does not fit this machine" in message
    assert "needs 32 GPUs (tensor_parallel_size 8 x data parallel 4, experts over 32)" in message
    assert "with 2,228.0 GiB between them" in message
    assert (
        "this machine has 8 GPUs (79.6, 79.6, 79.6, 79.6, 79.6, 79.6, 79.6, 79.6 GiB) and 2,048.0 GiB of RAM" in message
    )
    assert "change the `serving:` profile" in message


def test_enough_gpus_with_too_little_memory_between_them_is_refused() -> None:
    # Four 24 GiB cards are four GPUs, but 96 GiB do not hold GLM-4.5-Air's 228.
    small_cards = MachineResources(gpu_memory_gib=(24.0,) * 4, host_memory_gib=256.0)
    with pytest.raises(ConfigurationError, match=r"needs 4 GPUs .* with 228\.0 GiB between them"):
        refuse_unless_fits("glm-4.5-air", profile_of("glm-4.5-air"), "vllm", small_cards)
    # The largest cards are counted first: one 80 GiB card beside small ones holds a 66 GiB base.
    mixed = MachineResources(gpu_memory_gib=(24.0, 80.0), host_memory_gib=64.0)
    refuse_unless_fits("qwen3-30b-a3b", profile_of("qwen3-30b-a3b"), "vllm", mixed)


def test_the_torch_engine_needs_the_memory_in_ram() -> None:
    with pytest.raises(ConfigurationError) as refused:
        refuse_unless_fits("qwen3-30b-a3b", profile_of("qwen3-30b-a3b"), "torch", LAPTOP)
    assert "on the torch engine it needs 66.0 GiB of RAM" in refused.value.message
    assert "this machine has no GPU and 24.0 GiB of RAM" in refused.value.message
    # GPUs do not help the torch engine, which runs on the host.
    with pytest.raises(ConfigurationError, match="66.0 GiB of RAM"):
        refuse_unless_fits(
            "qwen3-30b-a3b", profile_of("qwen3-30b-a3b"), "torch", replace(ONE_H200, host_memory_gib=24.0)
        )


def test_this_machine_is_read_and_holds_the_tiny_bases() -> None:
    here = machine_resources()
    assert here.host_memory_gib > 1
    for tiny in ("tiny-glm-moe", "tiny-qwen3-moe", "smollm2-135m-instruct"):
        refuse_unless_fits(tiny, profile_of(tiny), "torch", here)


def test_profiles_become_vllm_arguments_only_beyond_one_gpu() -> None:
    assert vllm_parallel_options(profile_of("tiny-glm-moe")) == {}
    assert vllm_parallel_options(profile_of("glm-4.5-air")) == {
        "tensor_parallel_size": 4,
        "enable_expert_parallel": True,
    }
    assert vllm_parallel_options(profile_of("kimi-k2")) == {
        "tensor_parallel_size": 8,
        "enable_expert_parallel": True,
        "data_parallel_size": 4,
    }


# ---- the node, started for real --------------------------------------------------------------------


def registry_with(tmp_path: Path, source: str, name: str, serving: dict[str, object]) -> Path:
    """A registry folder holding one enabled base: `source`'s file renamed, with this serving profile."""
    folder = tmp_path / "models"
    folder.mkdir()
    data = yaml.safe_load((CONFIGS / f"{source}.yaml").read_text(encoding="utf-8"))
    data.update(name=name, serving=serving, enabled=True)
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("source", "engine", "serving", "expected"),
    [
        pytest.param(
            "tiny-glm-moe",
            "auto",
            {"engine": "vllm", "memory_gib": 1_000_000},
            "on the torch engine it needs 1,000,000.0 GiB of RAM",
            id="torch-ram",
        ),
        pytest.param(
            "smollm2-135m-instruct",
            "vllm",
            {"engine": "vllm", "tensor_parallel_size": 2, "memory_gib": 2},
            "on vLLM it needs 2 GPUs (tensor_parallel_size 2 x data parallel 1, experts over 1) "
            "with 2.0 GiB between them",
            id="vllm-gpus",
        ),
    ],
)
def test_mint_serve_refuses_a_base_this_machine_cannot_hold(
    tmp_path: Path, source: str, engine: str, serving: dict[str, object], expected: str
) -> None:
    folder = registry_with(tmp_path, source, "too-big", serving)
    env = {
        **os.environ,
        "MINT_HOME": str(tmp_path / "home"),
        "MINT_MODEL_CONFIGS_DIR": str(folder),
        # Where vLLM would run: named, never started, since the node refuses before it opens an engine.
        "MINT_VLLM_PYTHON": str(tmp_path / "no-vllm" / "python"),
    }
    run = subprocess.run(
        [sys.executable, "-m", "mint", "serve", "--base", "too-big", "--engine", engine, "--port", "1"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 1, run.stderr
    error = " ".join(run.stderr.split())  # rich may fold a long line
    assert "too-big does not fit this machine" in error
    assert expected in error
    assert "this machine has" in error and "GiB of RAM" in error
    assert not (tmp_path / "home" / "models").exists(), "nothing was pulled before the refusal"

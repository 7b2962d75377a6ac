"""What each base needs in GPUs (`mint.schemas.sizing`), the sizing page's table of it, the serving
profiles sized by it, and `mint models resources` printing it. Arithmetic only: no torch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from mint.config import PROJECT_ROOT
from mint.schemas.base_models import BaseModelSpec, load_registry
from mint.schemas.sizing import base_resources, gpus_for, markdown_table

pytestmark = pytest.mark.backend_free

CONFIGS = PROJECT_ROOT / "configs" / "models"
SIZING_PAGE = PROJECT_ROOT / "docs" / "operators" / "sizing.md"
# The sizing page's table is the output of the command its marker names.
TABLE_MARKER = re.compile(r"<!-- resources-table: mint models resources (?P<names>[a-z0-9. -]+?) --markdown -->\n")


@pytest.fixture(scope="module")
def registry() -> dict[str, BaseModelSpec]:
    return load_registry(CONFIGS)


def sizing_table() -> tuple[list[str], str]:
    """The bases the sizing page's marker names, and the table that follows it."""
    text = SIZING_PAGE.read_text(encoding="utf-8")
    marker = TABLE_MARKER.search(text)
    assert marker is not None, "docs/operators/sizing.md has lost its resources-table marker"
    lines = []
    for line in text[marker.end() :].splitlines(keepends=True):
        if not line.startswith("|"):
            break
        lines.append(line)
    return marker["names"].split(), "".join(lines)


def test_the_sizing_table_is_what_the_function_computes(registry: dict[str, BaseModelSpec]) -> None:
    names, table = sizing_table()
    production = {name for name, spec in registry.items() if spec.source.kind == "local_path"}
    assert set(names) == production, "the sizing table lists every production entry"
    assert table == markdown_table([base_resources(registry[name]) for name in names])


def test_the_formulas_on_a_known_base(registry: dict[str, BaseModelSpec]) -> None:
    # GLM-4.5-Air: 106e9 bf16 parameters are 197.4 GiB of weights.
    glm = base_resources(registry["glm-4.5-air"])
    weights = 106e9 * 2 / 2**30
    assert glm.weights_gib == round(weights, 1)
    assert glm.lora_gib == round(weights * 1.2, 1) and glm.lora_gpus == 3  # 236.9 / 80 -> 3
    assert glm.full_gib == round(106e9 * 16 / 2**30 + weights * 0.2, 1) and glm.full_gpus == 21
    assert glm.serve_gib == round(weights * 1.15, 1) and glm.serve_gpus == 4  # 3 GPUs, up to a power of two
    # Larger GPUs need fewer of them; a 30B MoE trains with LoRA and serves on one.
    assert base_resources(registry["kimi-k2"], gpu_gib=141).serve_gpus == 16
    qwen = base_resources(registry["qwen3-30b-a3b"])
    assert (qwen.lora_gpus, qwen.serve_gpus) == (1, 1)


def test_gpu_counts_round_up_and_never_reach_zero() -> None:
    assert gpus_for(160.0, 80.0) == 2
    assert gpus_for(160.1, 80.0) == 3
    assert gpus_for(0.01, 80.0) == 1


def test_every_serving_profile_holds_its_base(registry: dict[str, BaseModelSpec]) -> None:
    for name, spec in registry.items():
        needs = base_resources(spec)
        assert spec.serving.memory_gib >= needs.serve_gib, name
        assert spec.serving.gpus == needs.serve_gpus, name
        assert spec.serving.gpus * 80 >= spec.serving.memory_gib, name


def test_production_entries_state_their_real_sizes(registry: dict[str, BaseModelSpec]) -> None:
    sizes = {name: (spec.parameters.total_billions, spec.parameters.active_billions) for name, spec in registry.items()}
    assert sizes["glm-4.5-air"] == (106, 12)
    assert sizes["qwen3-30b-a3b"] == (30.5, 3.3)
    assert sizes["deepseek-v3"] == (671, 37)
    assert sizes["kimi-k2"] == (1040, 32)
    assert sizes["minimax-m2"] == (230, 10)


def test_mint_models_resources_prints_json_and_the_sizing_table() -> None:
    def mint(*args: str) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "mint", "models", "resources", *args],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "MINT_MODEL_CONFIGS_DIR": str(CONFIGS)},
        )
        return run.stdout

    rows = json.loads(mint("kimi-k2", "glm-4.5-air", "--gpu-gib", "141", "--json"))
    assert [(row["base_model"], row["serve_gpus"], row["gpu_gib"]) for row in rows] == [
        ("kimi-k2", 16, 141.0),
        ("glm-4.5-air", 2, 141.0),
    ]
    names, table = sizing_table()
    assert mint(*names, "--markdown") == table

"""What both engines read of an adapter's config: JSON that Python's parser takes though it is no
JSON (NaN, Infinity) or that nests past its recursion is refused with a reason, and lora_alpha
is a number above 0 within the bound Mint trains with (NaN once passed `alpha <= 0`, and an
infinite alpha scales every output to NaN)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mint.errors import InvalidRequest
from mint.schemas import fine_tuning
from mint.serving.peft_format import MAX_LORA_ALPHA, lora_settings, read_config

pytestmark = pytest.mark.backend_free

CONFIG = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"peft_type": "LORA", "r": 8, "lora_alpha": Infinity}', "it holds Infinity, which is no JSON number"),
        ('{"peft_type": "LORA", "r": 8, "lora_alpha": NaN}', "it holds NaN, which is no JSON number"),
        ('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests arrays or objects too deeply"),
    ],
)
def test_configs_python_reads_but_json_does_not_have_are_refused(tmp_path: Path, text: str, said: str) -> None:
    config_file = tmp_path / "adapter_config.json"
    config_file.write_text(text, encoding="utf-8")
    with pytest.raises(InvalidRequest, match=said):
        read_config(config_file)


def test_a_config_as_peft_writes_it_reads_as_it_is(tmp_path: Path) -> None:
    config_file = tmp_path / "adapter_config.json"
    config_file.write_text(json.dumps(CONFIG, indent=2), encoding="utf-8")
    assert read_config(config_file) == CONFIG
    assert lora_settings(read_config(config_file), max_rank=64) == (8, 2.0)


@pytest.mark.parametrize(
    "alpha",
    [float("inf"), float("nan"), 1e300, pytest.param(10**400, id="10**400"), 0, -1, MAX_LORA_ALPHA + 1, "16", True],
)
def test_lora_alpha_is_a_number_above_zero_within_the_trained_bound(alpha: object) -> None:
    with pytest.raises(InvalidRequest, match=f"no valid lora_alpha .*at most {MAX_LORA_ALPHA:g}"):
        lora_settings({**CONFIG, "lora_alpha": alpha}, max_rank=64)
    assert lora_settings({**CONFIG, "lora_alpha": MAX_LORA_ALPHA}, max_rank=64) == (8, MAX_LORA_ALPHA / 8)


def test_the_served_alpha_bound_is_the_trained_one() -> None:
    """Repeated in peft_format (the vLLM venv imports it, not mint.schemas): kept equal here."""
    assert MAX_LORA_ALPHA == fine_tuning.MAX_LORA_ALPHA

"""The trainer's wire-free types validate once, with messages that say what to fix."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from mint.trainer.types import AdamParams, Datum, ForwardOutput, LoraOptions, SampledSequence, SamplingParams

pytestmark = pytest.mark.backend_free

pytestmark = [pytest.mark.backend_free]


def test_datum_inputs_are_per_position_and_known() -> None:
    datum = Datum(model_input=[1, 2, 3], loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [0, 1, 1]})
    assert datum.length == 3 and datum.target_tokens == [2, 3, 4]
    with pytest.raises(ValidationError, match="per position"):
        Datum(model_input=[1, 2, 3], loss_fn_inputs={"target_tokens": [2, 3]})
    with pytest.raises(ValidationError, match="unknown loss_fn_inputs key 'advantage'"):
        Datum(model_input=[1], loss_fn_inputs={"advantage": [1.0]})
    with pytest.raises(ValidationError, match="integer token ids"):
        Datum(model_input=[1], loss_fn_inputs={"target_tokens": [1.5]})
    with pytest.raises(ValidationError):
        Datum(model_input=[])


def test_lora_options_refuse_what_peft_cannot_do() -> None:
    assert LoraOptions().train_experts and LoraOptions().rank is None
    with pytest.raises(ValidationError, match="dropout must be 0"):
        LoraOptions(dropout=0.1, target_parameters=["mlp.experts.down_proj"])
    with pytest.raises(ValidationError, match="nothing to train"):
        LoraOptions(train_attn=False, train_mlp=False, train_unembed=False, train_experts=False)
    assert LoraOptions(
        train_attn=False, train_mlp=False, train_unembed=False, train_experts=False, target_modules=["q_proj"]
    )


def test_adam_and_sampling_defaults_are_tinkers() -> None:
    assert AdamParams() == AdamParams(
        learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-12, weight_decay=0.0, grad_clip_norm=0.0
    )
    params = SamplingParams(stop="\n\n")
    assert params.stop == ["\n\n"] and params.temperature == 1.0 and params.top_k == -1 and params.top_p == 1.0
    with pytest.raises(ValidationError, match="top_k"):
        SamplingParams(top_k=0)
    with pytest.raises(ValidationError):
        SamplingParams(max_tokens=0)


def test_outputs_check_their_shape() -> None:
    assert ForwardOutput(logprobs=[[-1.0]], metrics={"loss:sum": 1.0}).metrics == {"loss:sum": 1.0}
    for bad in ("loss", "loss:sum:x", ":sum"):
        with pytest.raises(ValidationError, match="exactly one ':'"):
            ForwardOutput(logprobs=[], metrics={bad: 1.0})
    with pytest.raises(ValidationError, match="same length"):
        SampledSequence(tokens=[1, 2], logprobs=[-1.0], stop_reason="length")


def test_types_import_no_torch() -> None:
    # A fresh interpreter: the API process may import these types without paying for torch.
    code = "import sys, mint.trainer.types; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)

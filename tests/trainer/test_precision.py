"""The dtype a base computes in (`MINT_COMPUTE_DTYPE`), and training and sampling on a bfloat16
base: LoRA weights and Adam moments stay float32, the sampler's logprobs equal `forward`'s for
the same tokens, and a few steps learn as they do in float32."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mint.schemas.base_models import BaseModelSpec
from mint.trainer import precision
from mint.trainer.session import ResidentBase
from mint.trainer.types import AdamParams, Datum, LoraOptions, SamplingParams

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

PROMPT = [17, 932, 4401, 88, 1203]
# The sampler's and forward's logprobs of the same tokens, on the same bfloat16 base: measured
# equal (0.0) on tiny-glm-moe; decoding one token at a time against a whole-sequence pass may
# round differently on other kernels, and one bfloat16 ulp of a logit near 10 is 0.06.
BF16_SAMPLER_TOLERANCE = 0.1


def test_auto_takes_bfloat16_only_where_the_hardware_multiplies_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert precision.compute_dtype(None, "float32", "cpu") == "float32"  # no setting: the base's own
    assert precision.compute_dtype("bfloat16", "float32", "cpu") == "bfloat16"
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_bf16": True, "avx512_bf16": True})
    assert precision.compute_dtype("auto", "float32", "cpu") == "bfloat16"
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx2": True})
    assert precision.compute_dtype("auto", "bfloat16", "cpu") == "float32"


def test_the_matmul_peak_and_model_flops() -> None:
    assert precision.matmul_peak_flops(torch.float32, size=256) > 1e8  # any CPU does 0.1 GFLOP/s
    assert precision.model_flops(1000, forward_tokens=3, trained_tokens=2) == 2 * 1000 * 3 + 6 * 1000 * 2


@pytest.fixture(scope="module")
def bf16_base(spec: BaseModelSpec, base_cache: Path) -> Iterator[ResidentBase]:
    yield ResidentBase(spec, base_cache, dtype="bfloat16")


def _train(base: ResidentBase, data: list[Datum]) -> tuple[list[float], object]:
    session = base.create_session(LoraOptions(seed=20))
    losses = []
    for _ in range(6):
        losses.append(session.forward_backward(data, "cross_entropy").metrics["loss:sum"])
        session.optim_step(AdamParams(learning_rate=1e-2))
    return losses, session


def test_a_bfloat16_base_trains_float32_adapters_and_samples_what_forward_scores(
    bf16_base: ResidentBase, resident: ResidentBase, toy_data: list[Datum]
) -> None:
    matmul_weights = {p.dtype for name, p in bf16_base.model.named_parameters() if name.endswith("proj.weight")}
    assert matmul_weights == {torch.bfloat16}
    losses, session = _train(bf16_base, toy_data)
    try:
        adapter = {name: p for name, p in bf16_base.model.named_parameters() if "lora_" in name}
        assert adapter and {p.dtype for p in adapter.values()} == {torch.float32}
        moments = session._live_optimizer().live_state()  # type: ignore[attr-defined]
        assert {state["exp_avg_sq"].dtype for state in moments.values()} == {torch.float32}
        reference, fp32_session = _train(resident, toy_data)
        resident.close(fp32_session.session_id)  # type: ignore[attr-defined]
        # The same steps learn the same way: losses fall, and stay within 2% of float32's.
        assert losses[-1] < 0.5 * losses[0]
        assert losses == pytest.approx(reference, rel=2e-2)

        samples = session.sample(PROMPT, SamplingParams(max_tokens=8, seed=7, stop=[]), 3)  # type: ignore[attr-defined]
        full = [PROMPT + sequence.tokens for sequence in samples]
        scored = session.forward(  # type: ignore[attr-defined]
            [Datum(model_input=tokens[:-1], loss_fn_inputs={"target_tokens": tokens[1:]}) for tokens in full]
        ).logprobs
        for sequence, row in zip(samples, scored, strict=True):
            assert sequence.logprobs == pytest.approx(row[len(PROMPT) - 1 :], abs=BF16_SAMPLER_TOLERANCE)
    finally:
        for open_session in bf16_base.sessions:
            bf16_base.close(open_session.session_id)

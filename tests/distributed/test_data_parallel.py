"""A 2-rank worker group splits each batch's rows over its ranks and still trains as one process.

The steps of `split_runs.py` are made here in one process and by `split_script.py` under
torchrun (gloo, FSDP2 over tiny-glm-moe), where each rank runs its share of every batch: SFT
(cross_entropy, two calls accumulated, the second of one row, so one rank runs none), PPO on a
batch whose first rows share a prompt, DPO on three pairs, and a mixed pass of two sessions (SFT
on 3 rows and PPO on 2: each rank runs one session's rows, none of the other's); then one
full-parameter SFT step.
The shares are uneven (5 rows: 3 and 2; 3 pairs: 2 and 1), and the ranks' passes have different
shapes alone (one rank's rows need two output-head chunks, or a prefix pass), which they agree
on (`data_parallel.agree`).

Tolerances, all float32 rounding (the group sums each gradient in two halves where one process
sums it whole, and runs other batch shapes through the same kernels):
- losses and metrics: relative 1e-5; logprobs: absolute 1e-5 (they differ by at most ~1e-6);
- LoRA gradients: each tensor within 1e-5 of one process's, relative to its norm (measured: at
  most 4e-6);
- the adapter after one AdamW step: within 1e-4 as a whole, relative to its norm. Adam's first
  step moves each element by about the learning rate whatever the size of its gradient, so an
  element whose gradient is near zero and rounds the other way moves the other way in full
  (measured: 4e-6 on DPO, 1e-8 elsewhere);
- full parameters: the loss before and after the step relative 1e-5, and the gradient norm
  (summed over the ranks, not averaged: an average would be half of it) relative 1e-4.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from mint.config import PROJECT_ROOT
from mint.schemas.base_models import get_base_model_spec
from mint.trainer.data_parallel import RowShare
from mint.trainer.full import FullParameterTrainer
from mint.trainer.losses import get_loss
from mint.trainer.scoring import ScoreRequest
from mint.trainer.session import ResidentBase
from mint.trainer.types import Datum
from tests.distributed.runs import BASE_NAME, one_thread_as_the_ranks_run, run_two_ranks
from tests.distributed.split_runs import CASES, run_full, run_lora

pytestmark = [pytest.mark.torch, pytest.mark.backend_free]


def request(rows: int, loss: str) -> ScoreRequest:
    data = [Datum(model_input=[1, 2], loss_fn_inputs={"target_tokens": [2, 3]}) for _ in range(rows)]
    return ScoreRequest(data, get_loss(loss), {})


def test_rows_are_cut_into_contiguous_near_equal_runs_never_inside_a_pair() -> None:
    sft = request(5, "cross_entropy")
    assert RowShare.of([sft], 2).bounds == (0, 3, 5)
    assert RowShare.of([sft], 4).bounds == (0, 2, 3, 4, 5)
    assert RowShare.of([request(1, "cross_entropy")], 2).bounds == (0, 1, 1)  # rank 1 runs the stand-in
    # Three DPO pairs on two ranks: two pairs and one, never a pair cut in half.
    assert RowShare.of([request(6, "dpo")], 2).bounds == (0, 4, 6)
    # Parts end to end: a session of 3 SFT rows, then one of 2 DPO pairs (7 rows: the cut at
    # row 4 would split a pair; 3 and 5 are as near, and the earlier rank takes more).
    parts = [request(3, "cross_entropy"), request(4, "dpo")]
    share = RowShare.of(parts, 2)
    assert share.bounds == (0, 5, 7)
    assert [len(data) for data in share.local(parts, 0)] == [3, 2]
    assert [len(data) for data in share.local(parts, 1)] == [0, 2]
    assert RowShare.of(parts, 3).bounds == (0, 3, 5, 7)


def close(ours: float, theirs: float) -> bool:
    return math.isclose(ours, theirs, rel_tol=1e-5, abs_tol=1e-7)


def assert_same_outputs(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert ours["metrics"].keys() == theirs["metrics"].keys()
    for key, value in theirs["metrics"].items():
        assert close(ours["metrics"][key], value), (key, ours["metrics"][key], value)
    assert [len(row) for row in ours["logprobs"]] == [len(row) for row in theirs["logprobs"]]
    for mine, one in zip(ours["logprobs"], theirs["logprobs"], strict=True):
        torch.testing.assert_close(torch.tensor(mine), torch.tensor(one), rtol=0, atol=1e-5)


def relative_distance(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> float:
    moved = sum(float((a - b).norm() ** 2) for a, b in zip(ours, theirs, strict=True)) ** 0.5
    return moved / sum(float(b.norm() ** 2) for b in theirs) ** 0.5


def test_a_two_rank_group_splitting_rows_trains_as_one_process(tmp_path: Path) -> None:
    spec = get_base_model_spec(BASE_NAME, PROJECT_ROOT / "configs" / "models")
    cache = tmp_path / "cache"
    with one_thread_as_the_ranks_run():
        single = run_lora(ResidentBase(spec, cache, mix_backward=True), tmp_path / "single-split.safetensors")
        single_full = run_full(FullParameterTrainer(spec, cache))

    out = tmp_path / "group.json"
    run_two_ranks("split_script.py", out, cache)
    group = json.loads(out.read_text())

    tensors = load_file(tmp_path / "group-split.safetensors")
    expected = load_file(tmp_path / "single-split.safetensors")
    assert tensors.keys() == expected.keys()
    for case in [case for case, _ in CASES] + ["mixed"]:
        ours, theirs = group["lora"][case], single[case]
        for mine, one in zip(ours["outputs"], theirs["outputs"], strict=True):
            assert_same_outputs(mine, one)
        for mine, one in zip(ours["grad_norms"], theirs["grad_norms"], strict=True):
            assert close(mine, one), (case, ours["grad_norms"], theirs["grad_norms"])
        grads = sorted(name for name in expected if name.startswith(f"{case}/grad/"))
        assert grads
        for name in grads:
            assert float(expected[name].norm()) > 0, name  # every gradient is really there
            assert relative_distance([tensors[name]], [expected[name]]) < 1e-5, name
        steps = sorted(name for name in expected if name.startswith(f"{case}/step/"))
        distance = relative_distance([tensors[name] for name in steps], [expected[name] for name in steps])
        assert distance < 1e-4, (case, distance)

    full, one = group["full"], single_full
    assert close(full["loss"], one["loss"]) and close(full["loss_after"], one["loss_after"]), (full, one)
    assert math.isclose(full["grad_norm"], one["grad_norm"], rel_tol=1e-4), (full["grad_norm"], one["grad_norm"])
    for mine, theirs in zip(full["logprobs"], one["logprobs"], strict=True):
        torch.testing.assert_close(torch.tensor(mine), torch.tensor(theirs), rtol=0, atol=1e-5)

"""A 2-rank worker group (gloo, FSDP2 over tiny-glm-moe) trains as one process does.

The same runs (`runs.py`) are made here in one process and by `group_script.py` under torchrun:
LoRA through a ResidentBase whose rank 0 drives and rank 1 follows (losses, sampled tokens,
logprobs and the adapter), and full-parameter training on sharded weights (losses), whose
DCP state loads into one process from two ranks and into two ranks from one process.

Tolerances: each rank runs one of the two rows (`mint.trainer.data_parallel`) through the very
kernels of one process on all-gathered weights, and the ranks' gradients are summed (LoRA's by
an all_reduce, full parameters' by FSDP2's reduce-scatter), so the group matches one process to
float32 round-off. Summing in another order can still flip a near-zero gradient's last bit, and
Adam turns that into a full-size update of the element, so full weights are compared as a whole,
and an adapter's tensors may have a few such elements (at most 1 in 10,000): the LoRA factors of
the output head have a row per token of the vocabulary, most with a near-zero gradient, and 16
of their 786k elements moved by such an update on an Intel Xeon. Samples are greedy, so that
round-off in the weights cannot move a random draw across a boundary of the sampling distribution.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mint.config import PROJECT_ROOT
from mint.schemas.base_models import get_base_model_spec
from mint.trainer.full import FullParameterTrainer
from mint.trainer.session import ResidentBase
from tests.distributed.runs import BASE_NAME, one_thread_as_the_ranks_run, probe, run_full, run_lora, run_two_ranks

pytestmark = [pytest.mark.torch, pytest.mark.backend_free]


def relative_distance(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    assert ours.keys() == theirs.keys()
    moved = sum(float((ours[k].float() - theirs[k].float()).norm() ** 2) for k in ours) ** 0.5
    return moved / sum(float(theirs[k].float().norm() ** 2) for k in ours) ** 0.5


def test_a_two_rank_group_trains_lora_and_full_parameters_as_one_process(tmp_path: Path) -> None:
    spec = get_base_model_spec(BASE_NAME, PROJECT_ROOT / "configs" / "models")
    cache = tmp_path / "cache"
    with one_thread_as_the_ranks_run():
        single = run_lora(ResidentBase(spec, cache), tmp_path / "single-adapter.safetensors")
        full = FullParameterTrainer(spec, cache)
        full_losses = run_full(full, tmp_path / "single-full-state")
        full_weights = {name: tensor.detach().clone() for name, tensor in full.model.state_dict().items()}
        single_trained_loss = full.forward(probe(), "cross_entropy").metrics["loss:sum"]

    out = tmp_path / "group.json"
    run_two_ranks("group_script.py", out, cache)
    group = json.loads(out.read_text())

    # LoRA: rank 0 drove, rank 1 followed; every number is one process's.
    lora = group["lora"]
    assert lora["closed_refused"] and single["closed_refused"]
    assert lora["samples"] == single["samples"]
    for ours, theirs in zip(lora["losses"], single["losses"], strict=True):
        assert math.isclose(ours, theirs, rel_tol=1e-6), (lora["losses"], single["losses"])
    for ours, theirs in zip(lora["logprobs"], single["logprobs"], strict=True):
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs))
    adapter = load_file(tmp_path / "group-adapter.safetensors")
    expected = load_file(tmp_path / "single-adapter.safetensors")
    assert adapter.keys() == expected.keys() and len(adapter) > 0
    for name in adapter:
        # Round-off through three Adam steps (up to 2e-5 measured), apart from the few flipped elements.
        outside_round_off = int((~torch.isclose(adapter[name], expected[name], rtol=1e-4, atol=1e-4)).sum())
        assert outside_round_off <= adapter[name].numel() // 10_000, (name, outside_round_off)

    # Full parameters: the same losses from sharded weights.
    for ours, theirs in zip(group["full_losses"], full_losses, strict=True):
        assert math.isclose(ours, theirs, rel_tol=1e-5), (group["full_losses"], full_losses)
    # Two ranks' state into one process: the weights one process trained.
    reloaded = FullParameterTrainer(spec, cache)
    reloaded.load_state(tmp_path / "group-full-state")
    assert reloaded.step == 3
    assert relative_distance(reloaded.model.state_dict(), full_weights) < 1e-4
    # One process's state into two ranks: the loss one process gets from it.
    assert math.isclose(group["reloaded_loss"], single_trained_loss, rel_tol=1e-5)

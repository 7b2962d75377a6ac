"""tinker-cookbook's on-policy distillation recipes, unmodified, against Mint, on data made here.

- On-policy distillation (`recipes/distillation/on_policy_distillation.py`): a LoRA student on the
  tiny base samples, the teacher (the base itself) scores the student's tokens
  (`compute_logprobs`), the negative per-token reverse KL becomes the advantage, and the student
  trains with an RL loss.
- SDFT (`recipes/sdft/train.py`): the teacher is the base conditioned on a golden demonstration;
  its top-k at every completion position (`topk_prompt_logprobs`) becomes (N, K) soft
  `cross_entropy` targets, or the weights of a reverse-KL custom loss.

Only where a recipe reads a hub dataset is a local one put in its place.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import tinker
import torch
from tinker import types

from tests.conftest import LiveServer, Tenant
from tests.tinker_compat.conftest import BASE, TinkerWorker
from tests.tinker_compat.test_cookbook import checkpoint_paths, metrics, workdir

# The cookbook's recipes are clients of the Tinker API: the embedded pass only;
# the routes and storage they use are tested on both backends by their own tests.
pytestmark = [pytest.mark.torch, pytest.mark.client_surface]

__all__ = ["workdir"]  # the fixture, imported so that pytest finds it here

PROMPTS = [f"What is {a} plus {b}?" for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]]


def finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def test_on_policy_distillation_recipe_with_the_base_as_teacher(
    workdir: Path, live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tinker_cookbook.distillation import datasets
    from tinker_cookbook.recipes.distillation import on_policy_distillation

    # The recipe's "deepmath" prompts come from the hub; these come from a file written here.
    prompts_file = workdir / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"question": p}) + "\n" for p in PROMPTS))

    def local_prompts(split: str = "train") -> list[str] | None:
        if split != "train":
            return None
        return [json.loads(line)["question"] for line in prompts_file.read_text().splitlines()]

    monkeypatch.setattr(datasets, "load_deepmath_prompts", local_prompts)
    log_path = workdir / "opd-log"
    config = on_policy_distillation.CLIConfig(
        model_name=BASE,
        teacher_model=BASE,
        dataset="deepmath",
        renderer_name="role_colon",
        lora_rank=4,
        group_size=2,
        groups_per_batch=2,
        learning_rate=1e-3,
        max_tokens=6,
        eval_every=0,
        save_every=1,
        log_path=str(log_path),
        base_url=live_server.url,
        behavior_if_log_dir_exists="delete",
        max_steps=2,
    )
    asyncio.run(on_policy_distillation.cli_main(config))

    rows = [row for row in metrics(log_path) if "teacher_kl" in row]
    assert [row["step"] for row in rows] == [0, 1]
    for row in rows:
        # The teacher scored the student's tokens: the mean reverse KL over them, and per dataset.
        assert finite(row["teacher_kl"]) and finite(row["teacher_kl/dataset_0"])
        assert row["env/all/ac_tokens_per_turn"] > 0
        assert finite(row["optim/kl_sample_train_v1"]) and finite(row["grad_norm:mean"])
    # Before the first update the student's LoRA is zero: the teacher (the base, scoring through
    # `compute_logprobs`) gives the student's sampled tokens the logprobs the trainer's forward
    # gives them, so the reverse KL to the teacher is the sampler-vs-trainer KL, and about 0.
    first = rows[0]
    assert first["teacher_kl"] == pytest.approx(first["optim/kl_sample_train_v1"], abs=1e-6)
    assert abs(first["teacher_kl"]) < 1e-3
    saved = checkpoint_paths(log_path)
    assert [c["name"] for c in saved] == ["000001", "000002", "final"]
    assert saved[-1]["state_path"].endswith("/weights/final")
    assert saved[-1]["sampler_path"].endswith("/sampler_weights/final")


@pytest.mark.parametrize(
    ("reverse", "steps"),
    [
        (False, 2),  # the default: top-k forward KL as (N, K) cross_entropy targets
        (True, 1),  # analytical reverse KL over the teacher's top-k, a custom loss
    ],
)
def test_sdft_recipe_on_local_demonstrations(workdir: Path, live_server: LiveServer, reverse: bool, steps: int) -> None:
    from datasets import Dataset
    from tinker_cookbook.recipes.sdft import train

    # The recipe's own local route: ToolAlpaca rows saved as an Arrow dataset on disk.
    rows = [{"prompt": p, "golden_response": ["Add them.", f"The answer is {i}."]} for i, p in enumerate(PROMPTS * 3)]
    data_path = workdir / "toolalpaca"
    Dataset.from_list(rows).save_to_disk(str(data_path))
    log_path = workdir / "sdft-log"
    config = train.CLIConfig(
        model_name=BASE,
        renderer_name="role_colon",
        dataset="toolalpaca",
        toolalpaca_data_path=str(data_path),
        lora_rank=4,
        group_size=1,
        groups_per_batch=2,
        learning_rate=1e-3,
        max_tokens=8,
        topk=4,
        reverse=reverse,
        eval_every=0,
        save_every=1,
        log_path=str(log_path),
        base_url=live_server.url,
        behavior_if_log_dir_exists="delete",
        max_steps=steps,
    )
    asyncio.run(train.cli_main(config))

    logged = [row for row in metrics(log_path) if "sdft/num_datums" in row]
    assert [row["step"] for row in logged] == list(range(steps))
    for row in logged:
        assert row["sdft/num_datums"] == 2 and row["sdft/topk"] == 4
        # The teacher's renormalized top-k at the completion positions: an entropy in [0, log K].
        assert 0.0 <= row["sdft/mean_teacher_entropy"] <= math.log(4) + 1e-4
        if reverse:
            # The custom loss ran on the student's logprobs of the teacher's top-k ((N, K) forward).
            assert row["sdft/reverse_kl_positions"] > 0
            assert finite(row["sdft/reverse_kl_mean"]) and row["sdft/reverse_kl_mean"] >= -1e-5
        else:
            assert row["sdft/total_completion_tokens"] > 0
        # The student's update on those targets has a gradient.
        assert finite(row["grad_norm:mean"]) and row["grad_norm:mean"] > 0
    saved = checkpoint_paths(log_path)
    assert saved[-1]["state_path"].endswith("/weights/final")
    assert saved[-1]["sampler_path"].endswith("/sampler_weights/final")


def test_mostly_zero_two_d_loss_inputs_arrive_as_sparse_csr_and_score_as_dense(
    connect: Callable[[Tenant], tinker.ServiceClient], alice: Tenant, tinker_worker: TinkerWorker
) -> None:
    """The SDK sends a 2-D torch `target_tokens` or `weights` that is mostly zeros as sparse CSR
    (as `forward_backward_custom` sends SDFT's reverse-KL gradient weights): the server reads
    it as the dense table it stands for."""
    training = connect(alice).create_lora_training_client(base_model=BASE, rank=4, seed=5).result()
    tokens = training.get_tokenizer().encode("Ping 3 -> OK 3. Ping 4 -> OK 4.")
    positions = len(tokens) - 1
    targets = torch.zeros(positions, 4, dtype=torch.long)
    weights = torch.zeros(positions, 4)
    targets[-2:] = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    weights[-2:] = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1]])
    model_input = types.ModelInput.from_ints(tokens[:-1])
    sparse = types.Datum(model_input=model_input, loss_fn_inputs={"target_tokens": targets, "weights": weights})
    assert sparse.loss_fn_inputs["weights"].sparse_crow_indices is not None
    assert sparse.loss_fn_inputs["target_tokens"].sparse_crow_indices is not None
    dense = types.Datum(
        model_input=model_input,
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_torch(targets),
            "weights": types.TensorData.from_torch(weights),
        },
    )
    results = [training.forward([datum], "cross_entropy").result() for datum in (sparse, dense)]
    tables = [result.loss_fn_outputs[0]["logprobs"].to_torch() for result in results]
    assert tables[0].shape == (positions, 4)
    assert torch.equal(tables[0], tables[1])
    expected = -(weights * tables[1]).sum().item()
    assert results[0].metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
    assert results[1].metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)

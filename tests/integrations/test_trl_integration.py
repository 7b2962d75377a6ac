"""`mint.integrations.trl`: TRL's trainers with their model on Mint, against a live API and a
training worker of the tiny base, through the official `tinker` SDK.

TRL's own reward functions (`trl.rewards.accuracy_reward`, the format reward of TRL's GRPO
docs) run unmodified in this process; the test recomputes every logged reward from the
completions the trainer kept. A TRL quickstart script with only its import line and model
name changed runs in a subprocess. Configs Mint can't honour are refused by name.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trl
from trl.rewards import accuracy_reward

from mint.config import Settings
from mint.integrations.trl import DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer
from tests.conftest import LiveServer, Tenant, make_tenant
from tests.tinker_compat.conftest import BASE, TinkerWorker

# TRL's trainers are clients of the Tinker API (through the tinker SDK): the embedded pass only;
# the routes and storage they use are tested on both backends by their own tests.
pytestmark = [pytest.mark.torch, pytest.mark.client_surface]

TINY = {"max_completion_length": 16, "per_device_train_batch_size": 4, "num_generations": 2, "max_steps": 2}


@pytest.fixture(scope="module")
def worker(prepared: Settings) -> Iterator[TinkerWorker]:
    running = TinkerWorker(prepared, name="trl")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def tenant(prepared: Settings) -> Tenant:
    return make_tenant(prepared, "trl-user")


@pytest.fixture
def on_mint(live_server: LiveServer, tenant: Tenant, worker: TinkerWorker, monkeypatch: pytest.MonkeyPatch) -> Tenant:
    """The environment a user's script runs in: the `tinker` SDK's variables point at Mint."""
    monkeypatch.setenv("TINKER_BASE_URL", live_server.url)
    monkeypatch.setenv("TINKER_API_KEY", tenant.keys["developer"])
    return tenant


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format (TRL's GRPO docs, verbatim)."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def tokens_and_columns(prompts, completions, completion_ids, trainer_state, solution, **kwargs):
    """A reward that reads what TRL passes besides the completions: token ids, the trainer's
    state and a dataset column."""
    assert trainer_state.global_step in (0, 1) and len(solution) == len(prompts)
    return [len(ids) + 0.5 * (s == "5") for ids, s in zip(completion_ids, solution, strict=True)]


MATH: list[dict[str, Any]] = [
    {"prompt": [{"role": "user", "content": "What is 2 + 3? Answer in \\boxed{}."}], "solution": "5"},
    {"prompt": [{"role": "user", "content": "What is 3 + 4? Answer in \\boxed{}."}], "solution": "7"},
]


def test_trls_reward_functions_train_two_steps_and_the_log_is_what_they_give(on_mint: Tenant) -> None:
    funcs: list[Any] = [accuracy_reward, format_reward_func, tokens_and_columns]
    trainer = GRPOTrainer(
        model=BASE,
        reward_funcs=funcs,
        args=GRPOConfig(output_dir="math-grpo", learning_rate=1e-3, logging_steps=1, **TINY),  # type: ignore[arg-type]
        train_dataset=MATH,
    )
    result = trainer.train()

    assert result.global_step == trainer.state.global_step == 2
    steps = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert [entry["step"] for entry in steps] == [1, 2]
    assert len(trainer.rollouts) == 2
    for entry, rollout in zip(steps, trainer.rollouts, strict=True):
        # TRL's layout: each prompt twice in a row, conversational completions.
        assert rollout.prompts[0] == rollout.prompts[1] and rollout.prompts[2] == rollout.prompts[3]
        assert {p[0]["content"] for p in rollout.prompts} == {row["prompt"][0]["content"] for row in MATH}
        assert all(c[0]["role"] == "assistant" for c in rollout.completions)
        assert all(1 <= len(ids) <= 16 for ids in rollout.completion_ids)
        for func in funcs:
            name = func.__name__
            again = func(
                prompts=rollout.prompts,
                completions=rollout.completions,
                completion_ids=rollout.completion_ids,
                trainer_state=trainer.state.__class__(global_step=rollout.step - 1),
                solution=rollout.columns["solution"],
            )
            assert rollout.rewards[name] == [float(r) for r in again]
            assert entry[f"rewards/{name}/mean"] == pytest.approx(sum(again) / len(again))
        totals = [sum(values) for values in zip(*rollout.rewards.values(), strict=True)]
        assert entry["reward"] == pytest.approx(sum(totals) / 4)
        mean = sum(totals) / 4
        assert entry["reward_std"] == pytest.approx(math.sqrt(sum((t - mean) ** 2 for t in totals) / 3))
        assert math.isfinite(entry["loss"]) and entry["learning_rate"] > 0
        # Group-relative advantages, scaled by each group's std (TRL's scale_rewards="group").
        for start in (0, 2):
            pair = totals[start : start + 2]
            std = abs(pair[0] - pair[1]) / math.sqrt(2)
            assert rollout.advantages[start] == pytest.approx((pair[0] - sum(pair) / 2) / (std + 1e-4))

    path = trainer.save_model()
    assert path.startswith("tinker://") and path.endswith("/sampler_weights/math-grpo")
    assert trainer.state_path is not None and trainer.state_path.endswith("/weights/math-grpo")


QUICKSTART = """
from datasets import Dataset
from {module} import GRPOConfig, GRPOTrainer

dataset = Dataset.from_dict({{"prompt": ["The capital of France is", "Two plus two is"]}})

# Define the reward function, which rewards completions that are close to 20 characters
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]

training_args = GRPOConfig(
    output_dir="Qwen2-0.5B-GRPO",
    per_device_train_batch_size=4,
    num_generations=2,
    max_completion_length=16,
    max_steps=1,
    logging_steps=1,
)
trainer = GRPOTrainer(
    model="{model}",
    reward_funcs=reward_len,
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
"""


def test_a_trl_quickstart_script_runs_with_its_import_and_model_changed(on_mint: Tenant, tmp_path: Path) -> None:
    """TRL's GRPO quickstart (its dataset made here: no hub), as TRL runs it..."""
    original = QUICKSTART.format(module="trl", model="Qwen/Qwen2-0.5B-Instruct")
    script = QUICKSTART.format(module="mint.integrations.trl", model=BASE)
    changed = [(a, b) for a, b in zip(original.splitlines(), script.splitlines(), strict=True) if a != b]
    assert [a for a, _ in changed] == [
        "from trl import GRPOConfig, GRPOTrainer",
        '    model="Qwen/Qwen2-0.5B-Instruct",',
    ]
    # ... and on Mint.
    (tmp_path / "train_grpo.py").write_text(textwrap.dedent(script))
    run = subprocess.run(
        [sys.executable, "train_grpo.py"], cwd=tmp_path, capture_output=True, text=True, check=False, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "'reward': " in run.stdout and "'rewards/reward_len/mean': " in run.stdout


def test_sft_on_conversations_and_dpo_on_pairs_train_a_step(on_mint: Tenant) -> None:
    chats = [
        {"messages": [{"role": "user", "content": f"Ping {i}"}, {"role": "assistant", "content": "Pong"}]}
        for i in range(2)
    ]
    sft = SFTTrainer(
        model=BASE,
        args=SFTConfig(per_device_train_batch_size=2, max_steps=1, learning_rate=1e-3, assistant_only_loss=True),
        train_dataset=chats,
    )
    assert sft.train().global_step == 1
    assert sft.state.log_history[0]["loss"] > 0 and sft.state.log_history[0]["num_tokens"] > 0

    pairs = [{"prompt": f"Say yes {i}:", "chosen": " yes", "rejected": " no"} for i in range(2)]
    dpo = DPOTrainer(
        model=BASE, args=trl.DPOConfig(per_device_train_batch_size=2, max_steps=1, use_cpu=True), train_dataset=pairs
    )
    assert dpo.train().global_step == 1
    first = dpo.state.log_history[0]
    # At the first step the policy is the reference: every margin is 0 and the loss log 2.
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-3)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: GRPOTrainer(BASE, [format_reward_func], GRPOConfig(beta=0.04), MATH), "beta"),
        (lambda: GRPOTrainer(BASE, [format_reward_func], trl.GRPOConfig(beta=0.04, use_cpu=True), MATH), "beta"),
        (lambda: GRPOConfig(loss_type="sapo"), "loss_type"),
        (lambda: GRPOConfig(num_iterations=2), "num_iterations"),
        (lambda: GRPOConfig(gradient_accumulation_steps=4), "gradient_accumulation_steps"),
        (lambda: GRPOTrainer(BASE, ["trl-lib/reward-model"], GRPOConfig(), MATH), "reward_funcs"),  # type: ignore[list-item]
        (lambda: GRPOTrainer(BASE, [format_reward_func], GRPOConfig(), MATH, eval_dataset=MATH), "eval_dataset"),
        (lambda: GRPOTrainer(BASE, [format_reward_func], GRPOConfig(num_generations=3), MATH), "num_generations"),
        (lambda: SFTConfig(packing=True), "packing"),
    ],
)
def test_what_mint_cannot_honour_is_refused_by_name(make: Callable[[], object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make()

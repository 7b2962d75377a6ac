"""A TRL GRPO script run on Mint through `mint.integrations.trl`: the built-in `triage` task
(support tickets answered as `{"team": ..., "priority": ...}`), with a reward function written
in TRL's signature, on SmolLM2-135M-Instruct, after a short SFT warm start on other tickets'
answers (`SFTTrainer`, then `GRPOTrainer` from its saved state, as a TRL pipeline does; a 135M
base writes no JSON before it). Prints the reward of every GRPO step and the mean reward of the
first and the last window of steps.

Needs a running Mint with a training worker of the base (`mint up`), found as the `tinker` SDK
and the Mint SDK find it (TINKER_BASE_URL / MINT_BASE_URL, TINKER_API_KEY / MINT_API_KEY):

    .venv/bin/python bench/trl_on_mint.py [--steps 20] [--sft-steps 2] [--prompts-per-step 8]

Apart from the import line and the model names, the part between the markers is a TRL script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def triage_reward(completions: list[Any], reference: list[dict[str, str]], **kwargs: Any) -> list[float]:
    """TRL's reward signature, with partial credit so that a small base earns some from the start:
    0.05 for each of `{`, `"team"` and `"priority"` written, 0.15 more for a JSON object, and
    0.35 for each of `team` and `priority` right (1.0 in all)."""
    rewards = []
    for completion, expected in zip(completions, reference, strict=True):
        text = completion[0]["content"].strip()
        reward = 0.05 * sum(mark in text for mark in ("{", '"team"', '"priority"'))
        try:
            answer = json.loads(text[text.index("{") : text.rindex("}") + 1])
        except ValueError:
            answer = None
        if isinstance(answer, dict):
            reward += 0.15 + sum(0.35 for key in ("team", "priority") if answer.get(key) == expected[key])
        rewards.append(round(reward, 4))
    return rewards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft-steps", type=int, default=2, help="Steps of the SFT warm start (0: none).")
    options = parser.parse_args()

    from mint.evals.builtin import load_builtin

    tasks = load_builtin("triage", "train", options.prompts + 16, seed=options.seed)
    rows = [{"prompt": task.messages, "reference": task.reference} for task in tasks[: options.prompts]]
    # The warm start's demonstrations: other tickets and their answers, as TRL prompt-completion rows.
    solutions = [{"prompt": task.messages, "completion": task.solution} for task in tasks[options.prompts :]]

    # ---- a TRL script -------------------------------------------------------------------------
    from datasets import Dataset  # type: ignore[import-untyped]

    from mint.integrations.trl import (  # was: from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer
        GRPOConfig,
        GRPOTrainer,
        SFTConfig,
        SFTTrainer,
    )

    model = options.base
    if options.sft_steps:
        sft = SFTTrainer(
            model=model,
            args=SFTConfig(
                output_dir="triage-sft",
                learning_rate=4e-4,
                per_device_train_batch_size=8,
                max_steps=options.sft_steps,
                lr_scheduler_type="constant",
                logging_steps=1,
                seed=options.seed,
            ),
            train_dataset=Dataset.from_list(solutions),
        )
        sft.train()
        sft.save_model()
        model = sft.state_path  # GRPO continues from the SFT weights
    training_args = GRPOConfig(
        output_dir="triage-grpo",
        learning_rate=options.lr,
        per_device_train_batch_size=options.prompts_per_step * options.generations,
        num_generations=options.generations,
        max_completion_length=32,
        max_steps=options.steps,
        lr_scheduler_type="constant",
        logging_steps=1,
        seed=options.seed,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=triage_reward, args=training_args, train_dataset=Dataset.from_list(rows)
    )
    trainer.train()
    # ---- end of the TRL script ----------------------------------------------------------------

    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    for step, reward in enumerate(rewards, start=1):
        print(f"step {step:3d}  reward {reward:.3f}")
    window = max(1, min(options.window, len(rewards) // 2 or 1))
    first, last = statistics.mean(rewards[:window]), statistics.mean(rewards[-window:])
    print(f"mean reward, first {window} steps: {first:.3f}; last {window} steps: {last:.3f} ({last - first:+.3f})")
    print(f"saved: {trainer.save_model()}")


if __name__ == "__main__":
    main()

"""A user's JSON task end to end, as a job runs it: SFT on a few solutions, then RL warm-started
from that version with a partial-credit `json_match` grader, held-out pass rate before and after.

Ticket triage (the built-in `triage` benchmark) on SmolLM2-135M-Instruct: the model answers
`{"team": ..., "priority": ...}`, graded `json_match` with partial credit.
Both training stages go through the method registry's plan runners (`METHODS.run` with an
`SftPlan`, then an `RlPlan`), exactly as a fine-tuning job's worker calls them, and the
held-out split is graded through the eval runner (`SamplerGenerate`, greedy). It prints the
reward of every RL step and the held-out pass rate and mean score of the SFT version and of
the RL version.

    .venv/bin/python bench/rl_json_task.py [--rl-steps 6] [--seed 0]

No wall-clock goal: this is the before/after record of single-turn RL grading the text without
the stop token (a perfect answer scored 0 while the graded text ended with `<|im_end|>`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def held_out_line(name: str, figures: dict[str, float]) -> str:
    return (
        f"{name}: held-out pass rate {figures['pass_rate']:.2f}, mean score {figures['mean_score']:.2f}, "
        f"answers in JSON {figures['json']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-rows", type=int, default=16)
    parser.add_argument("--sft-steps", type=int, default=8)
    parser.add_argument("--rl-steps", type=int, default=6)
    parser.add_argument("--rl-prompts", type=int, default=32)
    parser.add_argument("--rl-lr", type=float, default=5e-4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--heldout", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch

    from mint.config import PROJECT_ROOT
    from mint.evals.benchmark import BenchmarkTask
    from mint.evals.builtin import load_builtin
    from mint.evals.graders import GraderSpec
    from mint.evals.runner import SamplerGenerate, run_tasks
    from mint.schemas.base_models import get_base_model_spec
    from mint.schemas.plans import RlPlan, SftPlan
    from mint.trainer.methods import METHODS
    from mint.trainer.recipes.common import RecipeInputs, StepReport
    from mint.trainer.session import ResidentBase
    from mint.trainer.types import LoraOptions

    torch.manual_seed(args.seed)
    spec = get_base_model_spec("smollm2-135m-instruct", PROJECT_ROOT / "configs" / "models")
    base = ResidentBase(spec, Path(tempfile.gettempdir()) / "mint-bench-models")
    session = base.create_session(LoraOptions(seed=args.seed))
    grader = {"type": "json_match"}
    common = {"n_epochs": 1, "learning_rate_multiplier": 1.0, "checkpoint_interval": 1}

    def inputs(rows: list[dict[str, Any]], on_step: Any = None) -> RecipeInputs:
        return RecipeInputs(
            training=session,
            tokenizer=base.tokenizer,
            reference=base,
            rows=rows,
            seed=args.seed,
            on_step=on_step,
            grader_for=GraderSpec.model_validate,
        )

    heldout = [
        BenchmarkTask.from_builtin(task) for task in load_builtin("triage", "heldout", args.heldout, seed=args.seed)
    ]

    def evaluate() -> dict[str, float]:
        records = run_tasks(heldout, SamplerGenerate(base, adapter_name=session.session_id, max_tokens=32))
        return {
            "pass_rate": sum(record.passed for record in records) / len(records),
            "mean_score": statistics.fmean(record.score for record in records),
            "json": sum(record.output.strip().startswith("{") for record in records) / len(records),
        }

    train = load_builtin("triage", "train", args.sft_rows + args.rl_prompts, seed=args.seed)
    sft_rows = [{"messages": [*task.messages, *(task.solution or [])]} for task in train[: args.sft_rows]]
    rl_rows = [{"messages": task.messages, "reference": task.reference} for task in train[args.sft_rows :]]
    started = time.perf_counter()
    METHODS.run(SftPlan(steps=args.sft_steps, batch_size=8, learning_rate=4e-4, **common), inputs(sft_rows))
    after_sft = evaluate()
    print(held_out_line("SFT version", after_sft))

    rewards: list[float] = []

    def on_step(report: StepReport) -> None:
        rewards.append(report.metrics["reward"])
        samples = getattr(report, "samples", None) or [{}]  # what the step graded, where it says
        sample = samples[0]
        print(
            f"RL step {report.step}: reward {report.metrics['reward']:.3f}, "
            f"e.g. {sample.get('text')!r} -> {sample.get('reward')}"
        )

    plan = RlPlan(
        steps=args.rl_steps,
        batch_size=args.prompts_per_step,
        learning_rate=args.rl_lr,
        group_size=args.group_size,
        max_tokens=32,
        temperature=1.0,
        kl_beta=0.0,
        grader=grader,  # type: ignore[arg-type]
        max_steps_without_signal=args.rl_steps,
        **common,  # type: ignore[arg-type]
    )
    try:
        METHODS.run(plan, inputs(rl_rows, on_step))
        stopped = ""
    except Exception as exc:  # the no-signal stop is the figure itself
        stopped = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"
    after_rl = evaluate()
    print(held_out_line("RL version", after_rl))
    if stopped:
        print("RL stopped:", stopped[:400])
    print(
        json.dumps(
            {
                "rl_rewards": [round(reward, 3) for reward in rewards],
                "heldout_sft": after_sft,
                "heldout_rl": after_rl,
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()

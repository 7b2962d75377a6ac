"""RL on the built-in `tool_calling` benchmark: held-out pass rate of the base, of the warm start
(SFT on the train split's solutions) and after RL, with paired bootstrap intervals.

    python bench/rl_tool_calling.py [--heldout 32] [--sft-steps 6] [--rl-steps 8] [--temperature 1.0] [--start-dir DIR]

Everything runs in this process through Mint's own pieces, as a chained job would run them:

1. The held-out split (`load_builtin("tool_calling", "heldout", N)`) is run on the base by the
   evals runner (`run_tasks` over `SamplerGenerate`: the trainer's sampler, greedy, the tasks'
   scripted tool environments, several steps) and graded by the benchmark's `tool_call` grader:
   one pass/fail per task.
2. Warm start: SmolLM2 never writes a tool call in Mint's text form unprompted, so RL from the
   base has no reward to learn from. A short SFT (`run_sft`) on the chat rows that mining writes
   for train-split tasks (`mine_failures("chat", ...)`: the task followed by its solution) gives
   the starting point, evaluated on the held-out split again. `--sft-steps 0` skips it.
3. RL (`run_rl`) from the starting point on the prompt rows mining writes for other train-split
   tasks (`mine_failures("prompts", ...)`): each sample is a multi-turn episode in the row's
   scripted tools (`make_environment` -> `ScriptedToolEnv`), rewarded by the task's grader
   (`tool_call`, partial credit by tool name and arguments, unless `--reward strict`). Each
   step's reward, groups with signal, KL, entropy and clip fraction are printed.
4. The held-out split once more; `paired_bootstrap` (as `mint evals compare` computes it) of
   after vs start and after vs base, task by task.

Held-out tasks never reach training or the choice of settings: SFT rows and RL prompts are
drawn from the train split (disjoint by content hash), and `--validation N` evaluates N more
train-split tasks (used by neither) at each stage, for choosing settings. Seeds are fixed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mint.evals.benchmark import BenchmarkTask  # noqa: E402
from mint.evals.runner import TrajectoryRecord  # noqa: E402

BENCHMARK = "tool_calling"


@dataclass
class Failed:
    """A trajectory that mining reads as failed: mining writes rows from failures only."""

    task_id: str
    messages: list[Any]
    passed: bool = False


def split_tasks(args: argparse.Namespace) -> tuple[list[BenchmarkTask], ...]:
    """Held-out tasks, and three disjoint groups of train-split tasks: SFT, RL prompts, validation."""
    from mint.evals.builtin import load_builtin

    heldout = [BenchmarkTask.from_builtin(t) for t in load_builtin(BENCHMARK, "heldout", args.heldout, args.seed)]
    train_n = args.sft_rows + args.rl_prompts + args.validation
    train = [BenchmarkTask.from_builtin(t) for t in load_builtin(BENCHMARK, "train", train_n, args.seed)]
    sft = train[: args.sft_rows]
    rl = train[args.sft_rows : args.sft_rows + args.rl_prompts]
    validation = train[args.sft_rows + args.rl_prompts :]
    return heldout, sft, rl, validation


def mined_rows(kind: str, tasks: Sequence[BenchmarkTask]) -> list[dict[str, Any]]:
    """The rows `mint datasets from-failures` writes for these tasks (all taken as failed)."""
    from mint.evals.mining import mine_failures

    result = mine_failures(kind, tasks, [Failed(task.id, list(task.messages)) for task in tasks])  # type: ignore[arg-type]
    if result.skipped:
        raise SystemExit(f"mining skipped {len(result.skipped)} tasks: {result.skipped[:3]}")
    return result.rows


def evaluate(base: Any, adapter: str | None, tasks: Sequence[BenchmarkTask], args: argparse.Namespace) -> dict:
    """Greedy run of `tasks` through the evals runner; per-task pass/fail and the wall time."""
    from mint.evals.runner import SamplerGenerate, run_tasks, summarize

    if not tasks:
        return {"records": [], "summary": {"accuracy": float("nan"), "mean_score": float("nan")}, "seconds": 0.0}
    generate = SamplerGenerate(base, adapter_name=adapter, max_tokens=args.eval_max_tokens, temperature=0.0)
    started = time.perf_counter()
    records = run_tasks(tasks, generate, max_steps=args.eval_max_steps, seed=args.seed)
    return {"records": records, "summary": summarize(records), "seconds": time.perf_counter() - started}


def paired(a: Sequence[TrajectoryRecord], b: Sequence[TrajectoryRecord], seed: int) -> dict[str, Any]:
    """B - A on the same tasks: fixed, broken, and the paired bootstrap's 95% interval."""
    from mint.evals.compare import paired_bootstrap

    assert [r.task_id for r in a] == [r.task_id for r in b]
    fixed = sum(not x.passed and y.passed for x, y in zip(a, b, strict=True))
    broken = sum(x.passed and not y.passed for x, y in zip(a, b, strict=True))
    interval = paired_bootstrap(fixed, broken, len(a) - fixed - broken, seed=seed)
    return {
        "delta": (fixed - broken) / len(a),
        "fixed": fixed,
        "broken": broken,
        "low": interval.low,
        "high": interval.high,
        "significant": interval.excludes_zero,
    }


START_SETTINGS = ("base", "seed", "heldout", "validation", "eval_max_steps", "eval_max_tokens", "sft_rows")
START_SETTINGS += ("sft_steps", "sft_batch", "sft_lr")


def start_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What makes a warm start and its evaluations: a saved one is reused only under the same."""
    return {name: getattr(args, name) for name in START_SETTINGS}


def stored(stage: dict[str, Any]) -> dict[str, Any]:
    return {
        part: {**result, "records": [dataclasses.asdict(record) for record in result["records"]]}
        for part, result in stage.items()
    }


def restored(stage: dict[str, Any]) -> dict[str, Any]:
    return {
        part: {**result, "records": [TrajectoryRecord(**record) for record in result["records"]]}
        for part, result in stage.items()
    }


def reward_spec(kind: str) -> Any:
    from mint.evals.graders import GraderSpec

    if kind == "strict":
        return GraderSpec(type="tool_call", config={"partial_credit": False})
    return GraderSpec(type="tool_call")  # the benchmark's own grader: partial credit by name and arguments


def rl_prompts(base: Any, rows: Sequence[dict[str, Any]], grader: Any) -> list[Any]:
    """RL prompts from mined prompt rows: each sample an episode in the row's scripted tools."""
    from mint.chat.render import render_prompt
    from mint.evals.agent_environments import make_environment
    from mint.trainer.recipes.rl import RlPrompt

    prompts = []
    for row in rows:
        environment = make_environment(row, None)
        assert environment is not None, "tool_calling rows carry their scripted tools"
        tokens = render_prompt(base.tokenizer, row["messages"], row.get("tools"))
        prompts.append(RlPrompt(tokens, row["reference"], grader, environment))
    return prompts


def fmt_rate(summary: dict[str, Any]) -> str:
    return f"{summary['accuracy']:.3f} ({summary.get('passed', 0)}/{summary.get('tasks', 0)})"


def fmt_delta(result: dict[str, Any]) -> str:
    mark = "yes" if result["significant"] else "no"
    return (
        f"{result['delta']:+.3f}  [{result['low']:+.3f}, {result['high']:+.3f}]  "
        f"fixed {result['fixed']} broken {result['broken']}  significant: {mark}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all cores)")
    parser.add_argument("--heldout", type=int, default=32, help="held-out tasks evaluated (0: none)")
    parser.add_argument("--validation", type=int, default=0, help="train-split tasks evaluated for tuning")
    parser.add_argument("--eval-max-steps", type=int, default=3)
    parser.add_argument("--eval-max-tokens", type=int, default=48)
    parser.add_argument(
        "--start-dir",
        default=None,
        help="keep the warm start (adapter state and its evaluations) here, and reuse it when it is already there",
    )
    parser.add_argument("--sft-rows", type=int, default=32)
    parser.add_argument("--sft-steps", type=int, default=6, help="0: no warm start, RL from the base")
    parser.add_argument("--sft-batch", type=int, default=4)
    parser.add_argument("--sft-lr", type=float, default=4e-4)
    parser.add_argument("--rl-prompts", type=int, default=32)
    parser.add_argument("--rl-steps", type=int, default=8)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rl-lr", type=float, default=2e-4)
    parser.add_argument("--loss", default="importance_sampling")
    parser.add_argument("--kl-beta", type=float, default=0.0)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per RL turn")
    parser.add_argument("--reward", choices=["partial", "strict"], default="partial")
    args = parser.parse_args()

    import torch

    from mint.chat.render import render_chat
    from mint.config import get_settings
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.recipes.common import StepReport
    from mint.trainer.recipes.rl import RlConfig, run_rl
    from mint.trainer.recipes.sft import SftConfig, run_sft
    from mint.trainer.session import ResidentBase
    from mint.trainer.types import LoraOptions

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    torch.manual_seed(args.seed)
    settings = get_settings()
    started = time.perf_counter()
    base = ResidentBase(get_base_model_spec(args.base, settings.model_configs_dir), settings.models_cache_dir)
    session = base.create_session(LoraOptions(seed=args.seed))
    heldout, sft_tasks, rl_tasks, validation = split_tasks(args)
    walls: dict[str, float] = {"load": time.perf_counter() - started}
    print(f"loaded {args.base} in {walls['load']:.1f}s; torch threads {torch.get_num_threads()}", flush=True)

    def stage_eval(name: str, adapter: str | None) -> dict[str, Any]:
        held = evaluate(base, adapter, heldout, args)
        val = evaluate(base, adapter, validation, args)
        walls[f"eval {name}"] = held["seconds"] + val["seconds"]
        print(
            f"[{name}] held-out {fmt_rate(held['summary'])} mean score {held['summary']['mean_score']:.3f}"
            + (f"; validation {fmt_rate(val['summary'])}" if validation else "")
            + f"  ({walls[f'eval {name}']:.0f}s)",
            flush=True,
        )
        return {"held": held, "val": val}

    start_dir = Path(args.start_dir) if args.start_dir else None
    if start_dir is not None and (start_dir / "records.json").exists():
        # The same warm start as a previous run of these settings: its adapter state and its evaluations.
        session = base.create_session_from_state(start_dir / "state")
        saved = json.loads((start_dir / "records.json").read_text())
        if saved["settings"] != start_settings(args):
            raise SystemExit(f"{start_dir} holds a warm start made with other settings: {saved['settings']}")
        results = {name: restored(stage) for name, stage in saved["results"].items()}
        walls.update({f"{name} (saved)": seconds for name, seconds in saved["walls"].items()})
        for name, stage in results.items():
            print(f"[{name}] held-out {fmt_rate(stage['held']['summary'])} (saved in {start_dir})", flush=True)
    else:
        results = {"base": stage_eval("base", None)}
        if args.sft_steps:
            examples = [
                render_chat(base.tokenizer, row["messages"], row.get("tools")) for row in mined_rows("chat", sft_tasks)
            ]
            t0 = time.perf_counter()
            config = SftConfig(steps=args.sft_steps, batch_size=args.sft_batch, learning_rate=args.sft_lr)
            sft = run_sft(session, examples, config)
            walls["sft"] = time.perf_counter() - t0
            print(
                f"[sft] {args.sft_steps} steps, loss {sft[0].metrics['loss']:.3f} -> {sft[-1].metrics['loss']:.3f} "
                f"({walls['sft']:.0f}s)",
                flush=True,
            )
            results["start"] = stage_eval("start", session.session_id)
        else:
            results["start"] = results["base"]
        if start_dir is not None:
            session.save_state(start_dir / "state")
            saved = {
                "settings": start_settings(args),
                "results": {name: stored(stage) for name, stage in results.items()},
                "walls": {name: seconds for name, seconds in walls.items() if name != "load"},
            }
            (start_dir / "records.json").write_text(json.dumps(saved))

    grader = reward_spec(args.reward)
    prompts = rl_prompts(base, mined_rows("prompts", rl_tasks), grader)
    rl_config = RlConfig(
        steps=args.rl_steps,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        learning_rate=args.rl_lr,
        loss_fn=args.loss,
        kl_beta=args.kl_beta,
        seed=args.seed,
        max_turns=args.max_turns,
        max_steps_without_signal=max(args.rl_steps, 1),
    )
    print(
        f"{'step':>4} {'reward':>7} {'std':>6} {'signal':>7} {'kl':>7} {'entropy':>8} {'clip':>6} "
        f"{'turns':>6} {'tokens':>7} {'secs':>6}",
        flush=True,
    )
    last = [time.perf_counter()]

    def on_step(report: StepReport) -> None:
        m, now = report.metrics, time.perf_counter()
        print(
            f"{report.step:>4} {m['reward']:>7.3f} {m['reward_std']:>6.3f} {m['groups_with_signal']:>7.2f} "
            f"{m.get('kl', float('nan')):>7.4f} {m['entropy']:>8.3f} {m.get('clip_fraction', float('nan')):>6.3f} "
            f"{m['turns']:>6.2f} {m['tokens']:>7.0f} {now - last[0]:>6.1f}",
            flush=True,
        )
        last[0] = now

    t0 = time.perf_counter()
    reports = run_rl(
        session,
        prompts,
        rl_config,
        reference=base,
        on_step=on_step,
        tokenizer=base.tokenizer,
    )
    walls["rl"] = time.perf_counter() - t0
    results["after"] = stage_eval("after", session.session_id)
    walls["total"] = time.perf_counter() - started

    held = {name: stage["held"]["records"] for name, stage in results.items()}
    print(
        f"\nbase {args.base}, benchmark {BENCHMARK}: {len(heldout)} held-out tasks (seed {args.seed}), greedy, "
        f"max_steps {args.eval_max_steps}, max_tokens {args.eval_max_tokens}"
    )
    print(
        f"warm start: SFT {args.sft_steps} steps x {args.sft_batch} rows of {len(sft_tasks)} mined train tasks, "
        f"lr {args.sft_lr}"
    )
    print(
        f"RL: {args.rl_steps} steps x {args.prompts_per_step} prompts x {args.group_size} episodes of "
        f"{len(rl_tasks)} train tasks, reward tool_call ({args.reward}), loss {args.loss}, lr {args.rl_lr}, "
        f"temperature {args.temperature}, kl_beta {args.kl_beta}, max_turns {args.max_turns}, "
        f"max_tokens {args.max_tokens}"
    )
    rewards = [r.metrics["reward"] for r in reports]
    signal = [r.metrics["groups_with_signal"] for r in reports]
    print(
        f"RL reward first/last 3 steps {statistics.fmean(rewards[:3]):.3f} -> {statistics.fmean(rewards[-3:]):.3f}; "
        f"mean groups_with_signal {statistics.fmean(signal):.2f}"
    )
    print(
        f"\n{'stage':<8} {'held-out pass rate':>20} {'mean score':>11}" + (f" {'validation':>14}" if validation else "")
    )
    for name, stage in results.items():
        line = f"{name:<8} {fmt_rate(stage['held']['summary']):>20} {stage['held']['summary']['mean_score']:>11.3f}"
        if validation:
            line += f" {fmt_rate(stage['val']['summary']):>14}"
        print(line)
    if heldout:
        print(f"\nafter - start: {fmt_delta(paired(held['start'], held['after'], args.seed))}")
        print(f"after - base:  {fmt_delta(paired(held['base'], held['after'], args.seed))}")
        if args.sft_steps:
            print(f"start - base:  {fmt_delta(paired(held['base'], held['start'], args.seed))}")
    if validation:
        val = {name: stage["val"]["records"] for name, stage in results.items()}
        print(f"validation after - start: {fmt_delta(paired(val['start'], val['after'], args.seed))}")
    print("\nwall times (s): " + ", ".join(f"{name} {seconds:.0f}" for name, seconds in walls.items()))


if __name__ == "__main__":
    main()

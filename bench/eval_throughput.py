"""Eval throughput: the runner with every task's turn in one batched generate call per step,
against the same tasks run one at a time, on the same model and sampling settings.

    python bench/eval_throughput.py [--base tiny-glm-moe] [--tasks 24] [--max-tokens 16] [--threads 2]

Two `Generate` backends behind the runner's one protocol:

- `trainer`: the resident base's sampler (`ResidentBase.sample_batch` through `SamplerGenerate`),
  which is what eval workers use: every live task's turn decodes in one batch, one forward per
  token for all of them.
- `engine`: the serving engine (`mint.serving.torch_engine.TorchEngine`), which decodes a batch
  of prompts in one forward per token. Skipped when the serving package is not installed.

Tasks are the built-in benchmarks' held-out tasks (arithmetic, format, tool calling) in
equal parts, decoded greedily, so both orders must produce the same trajectories: the script
checks it. Figures are tasks per second over the whole benchmark; compare them by ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mint.evals.benchmark import BenchmarkTask  # noqa: E402
from mint.evals.runner import Generate, GenerateRequest, Generation, TrajectoryRecord, run_tasks  # noqa: E402

MAX_STEPS = 4


def bench_tasks(count: int) -> list[BenchmarkTask]:
    from mint.evals.builtin import load_builtin

    names = ("arithmetic", "format", "tool_calling")
    per_name = [count // 3 + (1 if index < count % 3 else 0) for index in range(3)]
    return [
        BenchmarkTask.from_builtin(task)
        for name, n in zip(names, per_name, strict=True)
        for task in load_builtin(name, "heldout", n, seed=0)
    ]


class EngineGenerate:
    """`Generate` over a serving engine: each step's turns go to the engine as one batch."""

    def __init__(self, engine: Any, tokenizer: Any, *, max_tokens: int) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens

    def __call__(self, requests: Sequence[GenerateRequest]) -> list[Generation]:
        from mint.chat.render import render_prompt
        from mint.serving.engine import GenerateRequest as EngineRequest

        batch = [
            EngineRequest(
                prompt_tokens=render_prompt(self.tokenizer, request.messages, request.tools),
                max_tokens=self.max_tokens,
                temperature=0.0,
                seed=request.seed,
            )
            for request in requests
        ]
        started = time.perf_counter()
        results = self.engine.generate(batch)
        elapsed_ms = (time.perf_counter() - started) * 1000
        return [
            Generation(
                text=result.text.strip(),
                tokens_in=result.usage.prompt_tokens,
                tokens_out=result.usage.completion_tokens,
                latency_ms=elapsed_ms,  # every request of the batch waited for the whole batch
            )
            for result in results
        ]


def measure(
    tasks: list[BenchmarkTask], generate: Generate, batch_size: int | None
) -> tuple[float, list[TrajectoryRecord]]:
    started = time.perf_counter()
    records = run_tasks(tasks, generate, max_steps=MAX_STEPS, batch_size=batch_size)
    return time.perf_counter() - started, records


def compare(label: str, tasks: list[BenchmarkTask], generate: Generate) -> dict[str, Any]:
    run_tasks(tasks[:2], generate, max_steps=1)  # warm-up: first-call allocations, lazy imports
    batched_s, batched = measure(tasks, generate, None)
    single_s, single = measure(tasks, generate, 1)
    tokens = sum(record.tokens_out for record in batched)
    return {
        "backend": label,
        "batched": len(tasks) / batched_s,
        "single": len(tasks) / single_s,
        "ratio": single_s / batched_s,
        "tokens_out": tokens,
        "steps": sum(record.steps for record in batched),
        "same": [r.messages for r in batched] == [r.messages for r in single],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="tiny-glm-moe")
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--backends", default="trainer,engine")
    args = parser.parse_args()

    import torch

    from mint.config import get_settings
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.session import ResidentBase

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = get_settings()
    spec = get_base_model_spec(args.base, settings.model_configs_dir)
    tasks = bench_tasks(args.tasks)
    rows = []
    backends = args.backends.split(",")
    if "trainer" in backends:
        from mint.evals.runner import SamplerGenerate

        resident = ResidentBase(spec, settings.models_cache_dir)
        rows.append(compare("trainer sampler", tasks, SamplerGenerate(resident, max_tokens=args.max_tokens)))
        del resident
    if "engine" in backends:
        try:
            from mint.serving.torch_engine import TorchEngine
        except ImportError as exc:
            print(f"engine: skipped ({exc})")
        else:
            engine = TorchEngine.from_spec(spec, settings.models_cache_dir, max_batch_size=max(len(tasks), 1))
            rows.append(
                compare("torch engine", tasks, EngineGenerate(engine, engine.tokenizer, max_tokens=args.max_tokens))
            )

    print(
        f"\nbase {args.base}, {len(tasks)} tasks (arithmetic, format, tool_calling held-out), "
        f"greedy, max_tokens {args.max_tokens}, max_steps {MAX_STEPS}, torch threads {torch.get_num_threads()}"
    )
    print(
        f"{'backend':<16} {'batched tasks/s':>16} {'one-at-a-time tasks/s':>22} {'ratio':>7} {'turns':>6} {'same':>5}"
    )
    for row in rows:
        print(
            f"{row['backend']:<16} {row['batched']:>16.2f} {row['single']:>22.2f} {row['ratio']:>6.2f}x "
            f"{row['steps']:>6} {'yes' if row['same'] else 'NO':>5}"
        )


if __name__ == "__main__":
    main()

"""Mint's SFT against TRL's SFTTrainer (with peft) on the same model, data, LoRA config and steps.

    python bench/train_throughput.py [--base smollm2-135m-instruct] [--steps 6] [--batch 4]
                                     [--dtype auto|float32|bfloat16]

Each contestant runs in a fresh process (so peak memory is its own): Mint's SFT recipe
(packed, loss on the assistant tokens), TRL with padding, TRL with packing. The table
gives real (non-padding) tokens per second over the training steps, peak resident memory,
the model FLOP utilisation (6N FLOPs per real token trained, N the base's parameters, over the
matmul peak each contestant's process measures at its start in the same dtype), and the ratios
against TRL measured in the same run. Both sides train LoRA r16 on every linear layer of the
transformer blocks, with the base loaded in `--dtype` (`auto`, the default: bfloat16 where the
CPU multiplies it natively; LoRA weights and Adam state stay float32), at the same learning
rate, with loss on the completion only, on the same rows in the same order.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    DTYPE_CHOICES,
    LORA_MODULES,
    base_parameter_count,
    bench_dtype,
    peak_rss_mb,
    pulled_folder,
    run_contestant,
    table_row,
)

LEARNING_RATE = 2e-4
SEQUENCE_TOKENS = 256
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a careful assistant for a support team. Answer exactly in the format the user asks for, "
    "with no extra words, no explanations and no apologies.",
    "You are an assistant that follows output formats strictly. Read the request, decide the answer, and reply "
    "with the answer only. Never add a preamble. Never add a closing remark. If the request asks for JSON, reply "
    "with JSON only; if it asks for a number, reply with the number only.",
]


def bench_rows(count: int) -> list[dict[str, Any]]:
    """Single-turn chats of varied length from the built-in benchmarks (same rows for both sides)."""
    from mint.evals.builtin import load_builtin

    tasks = load_builtin("format", "train", count // 2, seed=1) + load_builtin(
        "arithmetic", "train", count - count // 2, seed=1
    )
    rows = []
    for index, task in enumerate(tasks):
        system = {"role": "system", "content": SYSTEM_PROMPTS[index % len(SYSTEM_PROMPTS)]}
        assert task.solution is not None
        rows.append({"prompt": [system, *task.messages], "completion": task.solution[:1]})
    return rows


def run_trl(base: str, rows: list[dict[str, Any]], steps: int, batch: int, packing: bool, dtype: str) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    folder = pulled_folder(base)
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    counted = {"tokens": 0}

    class CountingTrainer(SFTTrainer):  # counts the real tokens of every batch it trains on
        def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            if "attention_mask" in inputs and not packing:
                counted["tokens"] += int(inputs["attention_mask"].sum())
            else:  # packed rows (padding-free): every position is a real token
                counted["tokens"] += int(inputs["input_ids"].numel())
            return super().training_step(model, inputs, *args, **kwargs)

    with tempfile.TemporaryDirectory() as output:
        config = SFTConfig(
            output_dir=output,
            max_steps=steps,
            per_device_train_batch_size=batch,
            learning_rate=LEARNING_RATE,
            lr_scheduler_type="constant",
            warmup_steps=0,
            max_length=SEQUENCE_TOKENS,
            packing=packing,
            shuffle_dataset=False,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            use_cpu=True,
            bf16=False,
            dataloader_num_workers=0,
            seed=0,
        )
        trainer = CountingTrainer(
            model=model,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_MODULES),
        )
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {"tokens": counted["tokens"], "seconds": seconds, "first_loss": losses[0], "last_loss": losses[-1]}


def run_mint(base: str, rows: list[dict[str, Any]], steps: int, batch: int, dtype: str) -> dict[str, Any]:
    from mint.chat.render import render_chat
    from mint.config import get_settings
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.recipes.sft import SftConfig, run_sft
    from mint.trainer.session import ResidentBase
    from mint.trainer.types import LoraOptions

    settings = get_settings()
    spec = get_base_model_spec(base, settings.model_configs_dir)
    resident = ResidentBase(spec, settings.models_cache_dir, dtype=dtype)
    examples = [render_chat(resident.tokenizer, [*row["prompt"], *row["completion"]]) for row in rows]
    # The same adapter as TRL's: r16 on the attention and MLP linears, no lm_head.
    session = resident.create_session(
        LoraOptions(rank=16, alpha=32, dropout=0.0, train_attn=True, train_mlp=True, train_unembed=False, seed=0)
    )
    plan_rows = batch * steps  # TRL without shuffling takes the first rows in order; so do we
    config = SftConfig(steps=steps, batch_size=batch, learning_rate=LEARNING_RATE, grad_clip_norm=1.0)
    started = time.perf_counter()
    reports = run_sft(session, examples[:plan_rows], config)
    seconds = time.perf_counter() - started
    tokens = sum(int(report.metrics["tokens"]) for report in reports)
    return {
        "tokens": tokens,
        "seconds": seconds,
        "first_loss": reports[0].metrics["loss"],
        "last_loss": reports[-1].metrics["loss"],
    }


CONTESTANTS = ("mint", "trl-padded", "trl-packed")


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from mint.trainer.precision import matmul_peak_flops, model_flops

    dtype = bench_dtype(args.dtype)
    peak = matmul_peak_flops(getattr(torch, dtype))  # measured before the model loads
    rows = bench_rows(args.steps * args.batch * 2)
    if name == "mint":
        result = run_mint(args.base, rows, args.steps, args.batch, dtype)
    else:
        result = run_trl(args.base, rows, args.steps, args.batch, packing=name == "trl-packed", dtype=dtype)
    tokens_per_second = result["tokens"] / result["seconds"]
    return {
        **result,
        "name": name,
        "peak_rss_mb": peak_rss_mb(),
        "tokens_per_second": tokens_per_second,
        "mfu": model_flops(base_parameter_count(args.base), 0, tokens_per_second) / peak,
        "peak_gflops": peak / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="dtype both sides load the base in")
    parser.add_argument("--only", choices=CONTESTANTS, help=argparse.SUPPRESS)  # one contestant, in a child process
    args = parser.parse_args()
    if args.only:
        print(json.dumps(run_one(args.only, args)))
        return
    pulled_folder(args.base)  # dequantize once, outside the timings
    results = {}
    for name in CONTESTANTS:
        argv = ["--base", args.base, "--steps", str(args.steps), "--batch", str(args.batch), "--dtype", args.dtype]
        results[name] = run_contestant(__file__, name, argv)
    dtype = bench_dtype(args.dtype)
    print(f"\n{args.base}, LoRA r16 on attention + MLP linears, {dtype}, {args.steps} steps x {args.batch} rows\n")
    print(
        table_row(
            ("trainer", "real tok/s", "peak RSS MB", "loss first->last", "Mint speed-up", "memory ratio", "MFU"),
            COLUMN_WIDTHS,
        )
    )
    mint = results["mint"]
    for name in CONTESTANTS:
        r = results[name]
        print(
            table_row(
                (
                    name,
                    f"{r['tokens_per_second']:.1f}",
                    f"{r['peak_rss_mb']:.0f}",
                    f"{r['first_loss']:.2f}->{r['last_loss']:.2f}",
                    f"{mint['tokens_per_second'] / r['tokens_per_second']:.2f}x",
                    f"{mint['peak_rss_mb'] / r['peak_rss_mb']:.2f}x",
                    f"{r['mfu']:.2%}",
                ),
                COLUMN_WIDTHS,
            )
        )

    peaks = ", ".join(f"{name} {results[name]['peak_gflops']:.0f}" for name in CONTESTANTS)
    print(f"\nmatmul peak each measured at its start, {dtype}, GFLOP/s: {peaks}")


COLUMN_WIDTHS = (12, 11, 12, 18, 14, 13, 7)


if __name__ == "__main__":
    main()

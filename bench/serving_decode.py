"""Mixed-adapter decoding: Mint's torch engine against peft on the same base, adapters and prompts.

    python bench/serving_decode.py [--base smollm2-135m-instruct] [--adapters 8 32] [--new-tokens 32]

For each adapter count N, N requests, one per distinct adapter, each decoding `--new-tokens`
tokens greedily (end-of-sequence ignored, so every contestant writes the same number):

1. peft, switching adapters: `set_adapter` then `generate` per request (anchor 1; goal: Mint >= 3x);
2. peft's mixed-batch inference: one `generate(..., adapter_names=[...])` for all N (anchor 2; goal >= 1.5x);
3. Mint's torch engine: one `generate` for all N (one batched forward per step, base once).

Then the time to make an adapter servable: Mint's `add_adapter` from tensors already in CPU
RAM (the adapter cache's CPU tier) against peft's `load_adapter` from its folder (goal >= 10x).

The adapters are random LoRA r16 on the base's default targets (`configs/models/<base>.yaml`),
written in the PEFT format. Figures are printed whether or not the goals are met; the machine
is shared and noisy, so compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402  (after the offline switch and the path)

from mint.config import get_settings  # noqa: E402
from mint.schemas.base_models import BaseModelSpec, get_base_model_spec  # noqa: E402
from mint.serving.engine import AdapterTensors, GenerateRequest  # noqa: E402
from mint.serving.torch_engine import TorchEngine, read_adapter_folder  # noqa: E402
from mint.trainer.models import load_base_model  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three prime numbers.",
    "How do I boil an egg? Answer briefly.",
    "Translate 'good morning' into Spanish.",
    "Name a colour of the rainbow and explain why the sky is blue in one sentence.",
    "What is 12 times 7?",
    "Give me a short tip for writing clean Python code.",
]


def chat_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """`count` chat prompts of varied length, rendered with the base's own template."""
    prompts = []
    for index in range(count):
        messages = [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


def write_random_adapters(spec: BaseModelSpec, model: Any, folder: Path, count: int) -> list[Path]:
    """`count` PEFT adapters with random A and B on the base's default LoRA targets."""
    from peft import LoraConfig, get_peft_model
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    config = LoraConfig(
        r=spec.lora.rank,
        lora_alpha=spec.lora.alpha,
        lora_dropout=0.0,
        target_modules=list(spec.lora.target_modules),
        target_parameters=list(spec.lora.target_parameters),
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    shapes = {key: tensor.shape for key, tensor in get_peft_model_state_dict(peft_model).items()}
    peft_model.save_pretrained(folder / "template")
    config_text = (folder / "template" / "adapter_config.json").read_text()
    peft_model.unload()  # the base model is handed back unwrapped
    generator = torch.Generator().manual_seed(0)
    folders = []
    for index in range(count):
        tensors = {
            key: (torch.rand(shape, generator=generator) - 0.5) * 0.2
            if "lora_A" in key
            else torch.randn(shape, generator=generator) * 0.02
            for key, shape in shapes.items()
        }
        target = folder / f"adapter-{index:03d}"
        target.mkdir()
        save_file(tensors, target / "adapter_model.safetensors")
        (target / "adapter_config.json").write_text(config_text)
        folders.append(target)
    return folders


# peft 0.21 raises on `adapter_names` when an adapter has parameter LoRA (ParamWrapper), e.g. on fused experts.
PEFT_NO_MIXED_BATCH = "peft has no mixed-batch inference for parameter LoRA (target_parameters, the fused experts)"


def timed(run: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = run()
    return result, time.perf_counter() - started


def no_eos(new_tokens: int, pad_id: int) -> dict[str, Any]:
    """`generate` arguments for exactly `new_tokens` greedy tokens. The model's own generation
    config must have no end-of-sequence token (see `main`): `min_new_tokens` would instead mask
    it out of the logits and change the tokens chosen."""
    return {"max_new_tokens": new_tokens, "do_sample": False, "pad_token_id": pad_id}


def peft_switching(
    peft_model: Any, prompts: list[list[int]], names: list[str], new_tokens: int, pad_id: int
) -> list[list[int]]:
    """Anchor 1: one request at a time, activating its adapter first."""
    outputs = []
    for prompt, name in zip(prompts, names, strict=True):
        peft_model.set_adapter(name)
        ids = torch.tensor([prompt])
        out = peft_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **no_eos(new_tokens, pad_id))
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


def peft_mixed(
    peft_model: Any, prompts: list[list[int]], names: list[str], new_tokens: int, pad_id: int
) -> list[list[int]]:
    """Anchor 2: one left-padded batch, each row on its own adapter (peft's `adapter_names`)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = peft_model.generate(input_ids=ids, attention_mask=mask, adapter_names=names, **no_eos(new_tokens, pad_id))
    return [row[width:].tolist() for row in out]


def mint_batch(engine: TorchEngine, prompts: list[list[int]], names: list[str], new_tokens: int) -> list[list[int]]:
    requests = [
        GenerateRequest(adapter_id=name, prompt_tokens=p, max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        for p, name in zip(prompts, names, strict=True)
    ]
    return [result.tokens for result in engine.generate(requests)]


def agreement(a: list[list[int]], b: list[list[int]]) -> str:
    """How many requests got the same greedy tokens from both (float rounding may flip near-ties)."""
    return f"{sum(x == y for x, y in zip(a, b, strict=True))}/{len(a)}"


def time_loads(
    engine: TorchEngine, peft_base: Any, names: list[str], serving: list[Path], spare: list[Path]
) -> tuple[Any, dict[str, list[float]]]:
    """Load the serving adapters into peft (timing `load_adapter`) and into the engine, then time
    Mint's `add_adapter` of spare adapters into the engine's one free slot, as a serving node
    does in steady state.

    Returns the peft model holding every serving adapter and the timings in seconds.
    """
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(peft_base, serving[0], names[0])
    times: dict[str, list[float]] = {"peft_disk": [], "mint_ram": [], "mint_disk": []}
    for name, folder in zip(names[1:], serving[1:], strict=True):
        started = time.perf_counter()
        peft_model.load_adapter(folder, adapter_name=name)
        times["peft_disk"].append(time.perf_counter() - started)
    peft_model.eval()
    for name, folder in zip(names, serving, strict=True):
        engine.add_adapter(name, read_adapter_folder(folder))
    for index, folder in enumerate(spare):
        tensors: AdapterTensors = read_adapter_folder(folder)  # what the CPU tier of the cache holds
        for kind, source in (("mint_ram", tensors), ("mint_disk", folder)):
            started = time.perf_counter()
            engine.add_adapter(f"spare-{index}", source)
            times[kind].append(time.perf_counter() - started)
            engine.remove_adapter(f"spare-{index}")
    return peft_model, times


def decode_row(
    count: int, engine: TorchEngine, peft_model: Any, prompts: list[list[int]], names: list[str], args: Any
) -> dict[str, Any]:
    """Tokens per second of the three contestants for `count` requests on `count` distinct adapters."""
    prompts, names = prompts[:count], names[:count]
    total = count * args.new_tokens
    switched, switch_s = timed(lambda: peft_switching(peft_model, prompts, names, args.new_tokens, args.pad_id))
    mixed, mixed_s, mixed_error = [], 0.0, PEFT_NO_MIXED_BATCH
    if not args.parameter_lora:
        mixed, mixed_s = timed(lambda: peft_mixed(peft_model, prompts, names, args.new_tokens, args.pad_id))
        mixed_error = ""
    mint, mint_s = timed(lambda: mint_batch(engine, prompts, names, args.new_tokens))
    return {
        "adapters": count,
        "tokens": total,
        "switch_tps": total / switch_s,
        "mixed_tps": total / mixed_s if mixed else None,
        "mint_tps": total / mint_s,
        "agree_switch": agreement(mint, switched),
        "agree_mixed": agreement(mint, mixed) if mixed else "-",
        "mixed_error": mixed_error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m-instruct", choices=["smollm2-135m-instruct", "tiny-glm-moe"])
    parser.add_argument("--adapters", type=int, nargs="+", default=[8, 32], help="distinct adapters per batch")
    parser.add_argument("--new-tokens", type=int, default=32)
    # One thread by default: on a shared 2-core machine a second intra-op thread makes timings
    # erratic (measured: 2-5x slower and 3x noisier when another process holds a core).
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--load-samples", type=int, default=5, help="adapters timed for making servable")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = get_settings()
    spec = get_base_model_spec(args.base, settings.model_configs_dir)
    most = max(args.adapters)

    peft_base, tokenizer = load_base_model(spec, settings.models_cache_dir)
    # End-of-sequence neither stops peft's generate nor is suppressed: every contestant writes
    # the same number of tokens, chosen from the same logits.
    peft_base.generation_config.eos_token_id = None
    # One slot more than the serving adapters: the spare slot that adapters are timed into.
    engine = TorchEngine.from_spec(
        spec, settings.models_cache_dir, max_adapters=most + 1, max_rank=spec.lora.rank, max_batch_size=most
    )
    args.parameter_lora = bool(spec.lora.target_parameters)
    args.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    names = [f"a{index:03d}" for index in range(most)]
    prompts = chat_prompts(tokenizer, most)
    with tempfile.TemporaryDirectory(prefix="mint-bench-serving-") as scratch:
        folders = write_random_adapters(spec, peft_base, Path(scratch), most + args.load_samples)
        peft_model, load_times = time_loads(engine, peft_base, names, folders[:most], folders[most:])
    with torch.no_grad():
        # Warm-up: first calls pay one-off costs (allocations, kernels) on every side.
        peft_switching(peft_model, prompts[:1], names[:1], 2, args.pad_id)
        if not args.parameter_lora:
            peft_mixed(peft_model, prompts[:2], names[:2], 2, args.pad_id)
        mint_batch(engine, prompts[:2], names[:2], 2)
        rows = [decode_row(count, engine, peft_model, prompts, names, args) for count in args.adapters]
    report(args, spec, rows, load_times)


def report(
    args: argparse.Namespace, spec: BaseModelSpec, rows: list[dict[str, Any]], load_times: dict[str, list[float]]
) -> None:
    targets = ", ".join(spec.lora.target_modules + spec.lora.target_parameters)
    print(
        f"\n{spec.name}, LoRA r{spec.lora.rank} on {targets}, {spec.dtype}, greedy, "
        f"{args.new_tokens} new tokens per request, {args.threads} threads\n"
    )
    print(table_row(("distinct adapters", "anchor", "anchor tok/s", "Mint tok/s", "ratio", "goal", "same tokens")))
    for row in rows:
        for anchor, key, goal, agree in (
            ("peft set_adapter per request", "switch_tps", 3.0, row["agree_switch"]),
            ("peft mixed batch", "mixed_tps", 1.5, row["agree_mixed"]),
        ):
            if key == "mixed_tps" and row["mixed_error"]:
                print(table_row((str(row["adapters"]), anchor, "n/a", f"{row['mint_tps']:.1f}", "-", "-", "-")))
                print(f"  ({row['mixed_error']})")
                continue
            ratio = row["mint_tps"] / row[key]
            print(
                table_row(
                    (
                        str(row["adapters"]),
                        anchor,
                        f"{row[key]:.1f}",
                        f"{row['mint_tps']:.1f}",
                        f"{ratio:.2f}x",
                        f">={goal:g}x {'met' if ratio >= goal else 'NOT met'}",
                        agree,
                    )
                )
            )
    peft_s, mint_s, mint_disk_s = (statistics.median(load_times[k]) for k in ("peft_disk", "mint_ram", "mint_disk"))
    ratio = peft_s / mint_s
    print(
        f"\nmaking one adapter servable (median of {len(load_times['mint_ram'])}; "
        f"peft: of {len(load_times['peft_disk'])})\n"
    )
    print(table_row(("anchor", "anchor ms", "Mint", "Mint ms", "ratio", "goal", ""), widths=LOAD_WIDTHS))
    print(
        table_row(
            (
                "peft load_adapter (disk)",
                f"{peft_s * 1000:.1f}",
                "add_adapter (CPU RAM)",
                f"{mint_s * 1000:.1f}",
                f"{ratio:.1f}x",
                f">=10x {'met' if ratio >= 10 else 'NOT met'}",
                "",
            ),
            widths=LOAD_WIDTHS,
        )
    )
    print(
        table_row(
            (
                "peft load_adapter (disk)",
                f"{peft_s * 1000:.1f}",
                "add_adapter (disk)",
                f"{mint_disk_s * 1000:.1f}",
                f"{peft_s / mint_disk_s:.1f}x",
                "(for reference)",
                "",
            ),
            widths=LOAD_WIDTHS,
        )
    )
    print("\n" + json.dumps({"decode": rows, "load_ms": {"peft": peft_s * 1e3, "mint_ram": mint_s * 1e3}}))


COLUMN_WIDTHS = (17, 28, 12, 10, 7, 15, 11)
LOAD_WIDTHS = (24, 9, 21, 8, 7, 15, 1)


def table_row(cells: tuple[str, ...], widths: tuple[int, ...] = COLUMN_WIDTHS) -> str:
    """The first cells left-aligned, the numbers right-aligned."""
    (first, first_width), *rest = zip(cells, widths, strict=True)
    return " ".join([f"{first:<{first_width}}", *(f"{cell:>{width}}" for cell, width in rest)])


if __name__ == "__main__":
    main()

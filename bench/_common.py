"""What the Mint-versus-TRL benchmarks share: the LoRA targets both sides train, the pulled
base's folder and its parameter count, the dtype both sides load it in, the peak memory of a
process, running one contestant in a child process (so its peak memory is its own) and the
table's rows."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Every linear layer of a Llama decoder block (attention and MLP), no lm_head: Mint's default
# adapter for SmolLM2 and the one TRL gets through peft.
LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def pulled_folder(base: str) -> Path:
    """The base's cached transformers folder, dequantized from its package on first use."""
    from mint.config import get_settings
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.models import pull_base_model

    settings = get_settings()
    return pull_base_model(get_base_model_spec(base, settings.model_configs_dir), settings.models_cache_dir)


DTYPE_CHOICES = ("auto", "float32", "bfloat16")


def bench_dtype(choice: str) -> str:
    """The dtype both contestants load the base in: `choice`, with `auto` resolved for this CPU
    (bfloat16 where it multiplies it natively, `mint.trainer.precision`)."""
    from mint.trainer.precision import compute_dtype

    return compute_dtype(choice, "float32", "cpu")  # type: ignore[arg-type]


def base_parameter_count(base: str) -> int:
    """The base's parameters (the N of an MFU figure), from its config, no weights loaded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(pulled_folder(base))
    with torch.device("meta"):
        return sum(parameter.numel() for parameter in AutoModelForCausalLM.from_config(config).parameters())


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_contestant(script: str, name: str, argv: Sequence[str], *, threads: int | None = None) -> dict[str, Any]:
    """Run `script --only NAME ARGV...` in a fresh interpreter and return the JSON object it prints
    last. With `threads`, the child's BLAS/OpenMP pools are capped before torch loads."""
    env = dict(os.environ)
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    command = [sys.executable, script, "--only", name, *argv]
    finished = subprocess.run(command, capture_output=True, text=True, env=env)
    if finished.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {finished.returncode}):\n{finished.stderr[-4000:]}")
    return json.loads(finished.stdout.strip().splitlines()[-1])


def table_row(cells: Sequence[str], widths: Sequence[int]) -> str:
    """The first cell left-aligned, the numbers right-aligned."""
    first, *rest = zip(cells, widths, strict=True)
    return " ".join([f"{first[0]:<{first[1]}}", *(f"{cell:>{width}}" for cell, width in rest)])

"""The vLLM engine's entry in the engine contract suite (`ENGINE_FACTORIES` in conftest.py).

vLLM pins an older transformers than Mint's trainer, which makes the suite's adapters and
their peft reference outputs, so the suite runs here, in Mint's venv, and the engine runs in
the vLLM venv (`make vllm-venv`) as a `VllmEngineProcess`. Its base is the dense SmolLM2:
vLLM on CPU serves no LoRA on MoE experts. The venv is `.venv-vllm` at the project root, or
the interpreter named by MINT_VLLM_PYTHON; without one, the vLLM entry is skipped, saying why.
MINT_VLLM_TEST_BASE names another base for it (a MoE base needs a GPU).
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest

from mint.config import PROJECT_ROOT
from mint.schemas.base_models import BaseModelSpec
from mint.serving.engine import Engine

# The dense SmolLM2 on CPU; on a GPU, where vLLM serves LoRA on experts, MINT_VLLM_TEST_BASE may
# name a MoE base instead (bench/gpu_check.sh runs the contract on tiny-glm-moe).
VLLM_BASE = os.environ.get("MINT_VLLM_TEST_BASE") or "smollm2-135m-instruct"
# Enough KV cache for one sequence of the base's whole context (8192 tokens, fp32), and no more:
# vLLM on CPU would otherwise size it from the machine's memory.
KV_CACHE_BYTES = 512 * 2**20


def vllm_python() -> Path:
    return Path(os.environ.get("MINT_VLLM_PYTHON") or PROJECT_ROOT / ".venv-vllm" / "bin" / "python")


@functools.cache
def vllm_missing() -> str | None:
    """Why the vLLM engine cannot run here, or None when its venv has vLLM and Mint."""
    python = vllm_python()
    if not python.exists():
        return f"no vLLM interpreter at {python} (make vllm-venv, or set MINT_VLLM_PYTHON)"
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm') and u.find_spec('mint') else 1)"
    if subprocess.run([str(python), "-c", probe], capture_output=True, timeout=60).returncode != 0:
        return f"{python} cannot import vllm and mint (make vllm-venv)"
    return None


needs_vllm = pytest.mark.skipif(vllm_missing() is not None, reason=vllm_missing() or "")


def make_vllm_engine(spec: BaseModelSpec, cache_dir: Path, max_adapters: int, max_batch_size: int) -> Engine:
    from mint.serving.vllm_engine import VllmEngineProcess

    missing = vllm_missing()
    if missing is not None:
        pytest.skip(missing)
    return VllmEngineProcess.from_spec(
        spec,
        cache_dir,
        python=vllm_python(),
        dtype=spec.dtype,  # float32: the peft references are computed in float32
        max_adapters=max_adapters,
        max_batch_size=max_batch_size,
        kv_cache_bytes=KV_CACHE_BYTES,
        env={"VLLM_LOGGING_LEVEL": "WARNING"},
    )

"""Which engine a serving node runs: Mint's torch engine, or vLLM where vLLM serves best.

`mint serve --engine auto` (the default, `MINT_SERVING_ENGINE`) picks vLLM on a machine with a
CUDA GPU where vLLM can run, in this process or in the venv named by `MINT_VLLM_PYTHON`, for a
base whose serving profile (`serving.engine` in its YAML) names vLLM, and Mint's torch engine
everywhere else. Both keep the `mint.serving.engine.Engine` contract, so
the node, its adapter cache and the API do not change with the choice. vLLM on CPU serves
dense bases only (it has no LoRA kernels for MoE experts there), so asking for it on an MoE
base without a GPU is refused when the node starts, saying so.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mint.config import EngineKind
from mint.errors import ConfigurationError
from mint.schemas.base_models import BaseModelSpec, ServingProfile
from mint.serving.engine import Engine

if TYPE_CHECKING:
    from mint.trainer.compute_lane import ComputeLane


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def choose_engine(spec: BaseModelSpec, kind: EngineKind, *, vllm_python: Path | None) -> Literal["torch", "vllm"]:
    """The engine to run for `spec`: `kind` itself, or for "auto" vLLM when the base's serving
    profile names it and it can run on a GPU."""
    vllm_runs_here = vllm_python is not None or importlib.util.find_spec("vllm") is not None
    if kind == "auto":
        return "vllm" if spec.serving.engine == "vllm" and vllm_runs_here and _has_cuda() else "torch"
    if kind == "vllm":
        if not vllm_runs_here:
            raise ConfigurationError(
                "the vLLM engine was asked for, but vllm is not installed here: install it, or set "
                "MINT_VLLM_PYTHON to the python of a venv that has vLLM and Mint (make vllm-venv)"
            )
        if spec.moe and not _has_cuda():
            raise ConfigurationError(
                f"{spec.name} is a mixture-of-experts base, and vLLM serves LoRA on experts only on a GPU: "
                "run this node with --engine torch (or auto)"
            )
    return kind


def vllm_parallel_options(profile: ServingProfile) -> dict[str, Any]:
    """vLLM engine arguments for the profile's parallel sizes; none on one GPU (vLLM's defaults)."""
    options: dict[str, Any] = {}
    if profile.tensor_parallel_size > 1:
        options["tensor_parallel_size"] = profile.tensor_parallel_size
    if profile.expert_parallel_size > 1:
        # vLLM spreads the experts over its tensor x data-parallel ranks.
        options["enable_expert_parallel"] = True
    if profile.data_parallel_size > 1:
        options["data_parallel_size"] = profile.data_parallel_size
    return options


def open_engine(
    spec: BaseModelSpec,
    cache_dir: Path,
    *,
    kind: EngineKind = "auto",
    vllm_python: Path | None = None,
    max_adapters: int,
    max_batch_size: int,
    compute_dtype: str | None = None,
    lane: ComputeLane | None = None,
) -> Engine:
    """Start the engine `choose_engine` picks, with the base pulled into `cache_dir` if needed;
    the torch engine computes in the dtype `compute_dtype` (`MINT_COMPUTE_DTYPE`) resolves to
    (`mint.trainer.precision`; default: the base's), vLLM in the base's dtype.

    The torch engine loads its base and computes on `lane`'s thread; by default on a thread of
    its own, the one in the process that runs torch's parallel kernels (`mint.trainer.compute_lane`),
    which the engine's `close` ends."""
    chosen = choose_engine(spec, kind, vllm_python=vllm_python)
    if chosen == "torch":
        from mint.serving.torch_engine import TorchEngine
        from mint.trainer.precision import compute_dtype as resolve

        dtype = resolve(compute_dtype, spec.dtype, "cpu")  # type: ignore[arg-type]
        return TorchEngine.from_spec(
            spec,
            cache_dir,
            dtype=dtype,
            max_adapters=max_adapters,
            max_batch_size=max_batch_size,
            lane=lane,
            own_thread=lane is None,
        )
    options = {"max_adapters": max_adapters, "max_batch_size": max_batch_size, **vllm_parallel_options(spec.serving)}
    if vllm_python is None:
        from mint.serving.vllm_process import VllmEngine

        return VllmEngine.from_spec(spec, cache_dir, **options)
    from mint.serving.vllm_engine import VllmEngineProcess

    return VllmEngineProcess.from_spec(spec, cache_dir, python=vllm_python, **options)

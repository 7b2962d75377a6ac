"""What a base needs in GPUs to train with LoRA, to train every parameter, and to serve.

Arithmetic on a spec's parameter counts and dtype, no torch: the CLI prints it (`mint models
resources`), the README's table is its output (a test keeps them equal), and the serving
profiles in `configs/models/` are sized by it (a test checks that each profile holds its base).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from mint.schemas.base_models import BaseModelSpec

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# An H100 or A100 80 GB (80 GiB of it usable, near enough, once the CUDA context is counted in the margins).
DEFAULT_GPU_GIB = 80.0
# Full-parameter training with AdamW in mixed precision: bf16 weights and gradients (2 + 2 bytes),
# fp32 master weights and two fp32 Adam moments (4 + 4 + 4). In fp32 the same 16: weights,
# gradients and two moments.
FULL_BYTES_PER_PARAMETER = 16
# What LoRA and full training hold beside the weights, as a fraction of the weights: activations
# (checkpointed per layer) of a packed batch, and with LoRA the adapter and its Adam moments
# (rank 16 on every target is well under 1% of the base).
TRAINING_MARGIN = 0.20
# What serving holds beside the weights: the KV cache of the running batch, CUDA graphs and the
# engine's buffers.
SERVING_MARGIN = 0.15


class BaseResources(BaseModel):
    """One base's memory, in GiB, and the GPUs of `gpu_gib` each that hold it, per use."""

    base_model: str
    total_billions: float
    active_billions: float
    dtype: str
    gpu_gib: float = Field(description="Memory of one GPU, in GiB.")
    weights_gib: float = Field(description="The weights alone, in the spec's dtype.")
    lora_gib: float = Field(description="LoRA training: frozen base, adapter with its optimizer, activations.")
    lora_gpus: int
    full_gib: float = Field(description="Full-parameter training, sharded by FSDP2 over full_gpus.")
    full_gpus: int
    serve_gib: float = Field(description="Serving: weights and a KV-cache margin.")
    serve_gpus: int = Field(description="A power of two, so that tensor- and expert-parallel sizes divide the model.")


def gpus_for(memory_gib: float, gpu_gib: float) -> int:
    """The fewest GPUs of `gpu_gib` whose memory adds up to `memory_gib` (at least one)."""
    # Rounded to a millionth first, so that 2 x 80.0 GiB is 2 GPUs and not 3 by a float's last bit.
    return max(1, math.ceil(round(memory_gib / gpu_gib, 6)))


def power_of_two_at_least(count: int) -> int:
    return 1 << (count - 1).bit_length()


def base_resources(spec: BaseModelSpec, gpu_gib: float = DEFAULT_GPU_GIB) -> BaseResources:
    """What `spec` needs on GPUs of `gpu_gib` GiB each.

    With N the total parameters and b the bytes per parameter of the spec's dtype (2 for bf16),
    the weights are W = N * b, and

        LoRA  = W * (1 + 0.20)             frozen base; adapter, its Adam moments and activations
        full  = N * 16 + W * 0.20          weights, gradients, fp32 master weights and Adam moments,
                                           sharded by FSDP2 (ZeRO-3); activations as for LoRA
        serve = W * (1 + 0.15)             weights and a KV-cache margin

    GPUs = ceil(memory / gpu_gib); for serving, rounded up to a power of two, since vLLM's
    tensor-parallel size must divide the attention heads and its expert-parallel size the
    routed experts. Training counts are the fewest that hold the state: more GPUs train faster.
    """
    total = spec.parameters.total_billions * 1e9
    weights_gib = total * DTYPE_BYTES[spec.dtype] / GIB
    lora_gib = weights_gib * (1 + TRAINING_MARGIN)
    full_gib = total * FULL_BYTES_PER_PARAMETER / GIB + weights_gib * TRAINING_MARGIN
    serve_gib = weights_gib * (1 + SERVING_MARGIN)
    return BaseResources(
        base_model=spec.name,
        total_billions=spec.parameters.total_billions,
        active_billions=spec.parameters.active_billions,
        dtype=spec.dtype,
        gpu_gib=gpu_gib,
        weights_gib=round(weights_gib, 1),
        lora_gib=round(lora_gib, 1),
        lora_gpus=gpus_for(lora_gib, gpu_gib),
        full_gib=round(full_gib, 1),
        full_gpus=gpus_for(full_gib, gpu_gib),
        serve_gib=round(serve_gib, 1),
        serve_gpus=power_of_two_at_least(gpus_for(serve_gib, gpu_gib)),
    )


MARKDOWN_HEADER = (
    "| base | parameters (total / active) | weights | LoRA training | full training (FSDP2) | serving |",
    "| --- | --- | --- | --- | --- | --- |",
)


def billions(count: float) -> str:
    """1040 -> "1.04T", 30.5 -> "30.5B", 0.0136 -> "13.6M"."""
    if count >= 1000:
        return f"{count / 1000:g}T"
    if count >= 1:
        return f"{count:g}B"
    return f"{count * 1000:g}M"


def memory_cell(memory_gib: float, gpus: int) -> str:
    """2324.6, 30 -> "2,324.6 GiB: 30 GPUs"."""
    return f"{memory_gib:,.1f} GiB: {gpus} GPU{'s' if gpus > 1 else ''}"


def markdown_table(rows: list[BaseResources]) -> str:
    """The rows as the README's table: memory in GiB and the GPUs of each row's `gpu_gib` that hold it."""

    lines = list(MARKDOWN_HEADER)
    for row in rows:
        lines.append(
            f"| {row.base_model} | {billions(row.total_billions)} / {billions(row.active_billions)} "
            f"| {row.weights_gib:,.1f} GiB ({row.dtype}) | {memory_cell(row.lora_gib, row.lora_gpus)} "
            f"| {memory_cell(row.full_gib, row.full_gpus)} | {memory_cell(row.serve_gib, row.serve_gpus)} |"
        )
    return "\n".join(lines) + "\n"

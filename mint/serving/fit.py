"""Whether this machine can hold a base for serving: checked before a node loads anything.

A node that would run out of memory halfway through loading a 1T-parameter base, or that would
start vLLM with a tensor-parallel size larger than the GPUs it has, refuses to start instead,
saying what the base's serving profile needs and what the machine has. `refuse_unless_fits`
takes the machine's resources as an argument, so it is tested with stated machines;
`machine_resources` reads this one (torch.cuda for GPUs, the kernel for host RAM).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from mint.errors import ConfigurationError
from mint.schemas.base_models import ServingProfile
from mint.schemas.sizing import GIB


@dataclass(frozen=True)
class MachineResources:
    """What a machine offers a serving node: each GPU's memory and the host's RAM, in GiB."""

    gpu_memory_gib: tuple[float, ...]
    host_memory_gib: float

    def describe(self) -> str:
        if not self.gpu_memory_gib:
            gpus = "no GPU"
        else:
            sizes = ", ".join(f"{size:,.1f}" for size in self.gpu_memory_gib)
            count = len(self.gpu_memory_gib)
            gpus = f"{count} GPU{'s' if count > 1 else ''} ({sizes} GiB)"
        return f"{gpus} and {self.host_memory_gib:,.1f} GiB of RAM"


def machine_resources() -> MachineResources:
    """This machine: the CUDA GPUs torch sees (none without CUDA) and the host's physical RAM."""
    import torch

    gpus: tuple[float, ...] = ()
    if torch.cuda.is_available():
        gpus = tuple(
            torch.cuda.get_device_properties(index).total_memory / GIB for index in range(torch.cuda.device_count())
        )
    # Physical RAM, not what is free now: the check is about what the machine is, and free
    # memory moves with whatever else runs.
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return MachineResources(gpu_memory_gib=gpus, host_memory_gib=host)


def refuse_unless_fits(
    base_model: str, profile: ServingProfile, engine: Literal["torch", "vllm"], machine: MachineResources
) -> None:
    """Raise ConfigurationError unless `machine` can hold `base_model` as `profile` says on `engine`.

    vLLM spans `profile.gpus` GPUs (tensor x expert parallel) and needs `profile.memory_gib`
    between them; Mint's torch engine runs on the host and needs it in RAM.
    """
    fix = (
        f"run the node on a machine that has it, or change the `serving:` profile in {base_model}'s registry "
        "file (configs/models, or MINT_MODEL_CONFIGS_DIR)"
    )
    if engine == "torch":
        if machine.host_memory_gib < profile.memory_gib:
            raise ConfigurationError(
                f"{base_model} does not fit this machine: on the torch engine it needs "
                f"{profile.memory_gib:,.1f} GiB of RAM, and this machine has {machine.describe()}; {fix}",
                param="serving.memory_gib",
            )
        return
    needed = profile.gpus
    gpus = sorted(machine.gpu_memory_gib, reverse=True)[:needed]
    if len(gpus) < needed or sum(gpus) < profile.memory_gib:
        parallel = (
            f"tensor_parallel_size {profile.tensor_parallel_size} x data parallel {profile.data_parallel_size}, "
            f"experts over {profile.expert_parallel_size}"
        )
        raise ConfigurationError(
            f"{base_model} does not fit this machine: on vLLM it needs {needed} GPU{'s' if needed > 1 else ''} "
            f"({parallel}) with {profile.memory_gib:,.1f} GiB between them, and this machine has "
            f"{machine.describe()}; {fix}",
            param="serving",
        )

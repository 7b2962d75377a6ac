"""One rank of an FSDP2 group on NCCL: the smallest check that torch.distributed works on a GPU.

    torchrun --standalone --nproc_per_node 1 bench/gpu_fsdp_one_rank.py

A small transformer-shaped stack is sharded with `torch.distributed.fsdp.fully_shard` (each
block, then the root, as FSDP2 recommends), trained for a few AdamW steps in bf16 mixed
precision, and must lower its loss on a fixed batch. Prints the rank, world size, backend,
loss before and after, and the time of a step. With more ranks (`--nproc_per_node N`) the same
script shards over N GPUs.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

WIDTH = 1024
BLOCKS = 4
STEPS = 8


def block(width: int) -> Any:
    from torch import nn

    return nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not torch.cuda.is_available():
        raise SystemExit("gpu_fsdp_one_rank: torch.cuda is not available; this check needs a CUDA GPU and NCCL")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    torch.manual_seed(0)
    model = nn.Sequential(*(block(WIDTH) for _ in range(BLOCKS)), nn.Linear(WIDTH, 1)).cuda()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model[:BLOCKS]:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs_B_D = torch.randn(64, WIDTH, device="cuda")
    targets_B = inputs_B_D.sum(dim=1, keepdim=True) / WIDTH**0.5
    losses = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(STEPS):
        loss = nn.functional.mse_loss(model(inputs_B_D).float(), targets_B)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - start) / STEPS
    sharded = sum(1 for parameter in model.parameters() if type(parameter).__name__ == "DTensor")
    result = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "dtensor_parameters": sharded,
        "first_loss": round(losses[0], 4),
        "last_loss": round(losses[-1], 4),
        "step_s": round(step_s, 4),
    }
    dist.destroy_process_group()
    if losses[-1] >= losses[0]:
        raise SystemExit(f"gpu_fsdp_one_rank: the loss did not fall: {json.dumps(result)}")
    if rank == 0:
        print(f"FSDP2 on {result['backend']}, {result['world_size']} rank(s): loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        print(json.dumps(result))


if __name__ == "__main__":
    main()

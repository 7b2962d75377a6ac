"""What one rank of a 2-rank group does in `test_group_training.py` (run under torchrun).

LoRA: rank 0 drives a ResidentBase joined to the group (create a session, train, sample,
forward, save the adapter) while rank 1 follows its commands, as in a worker. Full parameters:
both ranks run the same calls on their shards (SPMD), save the state with DCP, and load a
state that one process saved. Rank 0 writes what it saw as JSON to argv[1]; the files go in
the folder of that path.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from mint.config import PROJECT_ROOT
from mint.schemas.base_models import get_base_model_spec
from mint.trainer.full import FullParameterTrainer
from mint.trainer.group import Group
from mint.trainer.session import ResidentBase
from tests.distributed.runs import BASE_NAME, probe, run_full, run_lora


def main(out: Path, cache: Path) -> None:
    torch.set_num_threads(1)
    spec = get_base_model_spec(BASE_NAME, PROJECT_ROOT / "configs" / "models")
    group = Group.join()
    base = ResidentBase(spec, cache, group=group)  # each rank reads only its shards
    if not group.leading:
        base.follow()
    else:
        lora = run_lora(base, out.parent / "group-adapter.safetensors")
        group.stop()
    full = FullParameterTrainer(spec, cache, group=group)
    full_losses = run_full(full, out.parent / "group-full-state")
    full.load_state(out.parent / "single-full-state")  # saved by one process
    reloaded = full.forward(probe(), "cross_entropy").metrics["loss:sum"]
    if group.leading:
        out.write_text(json.dumps({"lora": lora, "full_losses": full_losses, "reloaded_loss": reloaded}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

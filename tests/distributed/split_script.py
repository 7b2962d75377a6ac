"""What one rank of a 2-rank group does in `test_data_parallel.py` (run under torchrun).

LoRA: rank 0 drives a ResidentBase joined to the group through `split_runs.run_lora` while
rank 1 follows; each runs its share of every batch's rows. Full parameters: both ranks run
`split_runs.run_full` on their shards (SPMD), again each on its share of the rows. Rank 0
writes what it saw as JSON to argv[1], and the LoRA gradients and adapters beside it.
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
from tests.distributed.runs import BASE_NAME
from tests.distributed.split_runs import run_full, run_lora


def main(out: Path, cache: Path) -> None:
    torch.set_num_threads(1)
    spec = get_base_model_spec(BASE_NAME, PROJECT_ROOT / "configs" / "models")
    group = Group.join()
    base = ResidentBase(spec, cache, mix_backward=True, group=group)  # each rank reads only its shards
    if not group.leading:
        base.follow()
    else:
        lora = run_lora(base, out.parent / "group-split.safetensors")
        group.stop()
    full = run_full(FullParameterTrainer(spec, cache, group=group))
    if group.leading:
        out.write_text(json.dumps({"lora": lora, "full": full}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

"""What one rank of a 2-rank group does in `test_sharded_loading.py` (run under torchrun).

Each rank loads two bases sharded (`load_sharded_base`): first a wide MoE base, measuring its
host memory while it loads (the peak over the resident memory just before, imports done), then
a small one whose head is tied to its embeddings. Both run a probe; rank 0 writes the logits
(safetensors) and every rank's figures (JSON) beside argv[1], the JSON to argv[1] itself. The
bases' specs come as JSON files (argv[3], argv[4]) and are already pulled into argv[2].
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from mint.schemas.base_models import BaseModelSpec
from mint.trainer.group import Group
from mint.trainer.host_memory import reset_resident_peak, resident_bytes, resident_peak_bytes
from mint.trainer.models import base_model_class
from mint.trainer.sharded_loading import load_sharded_base
from tests.distributed.loads import probe_logits


def main(out: Path, cache: Path, wide_file: Path, tied_file: Path) -> None:
    torch.set_num_threads(1)
    wide, tied = (BaseModelSpec.model_validate_json(file.read_text()) for file in (wide_file, tied_file))
    group = Group.join()
    base_model_class(wide)  # the architecture's module imported before the measure
    reset = reset_resident_peak()
    before = resident_bytes()
    model, _ = load_sharded_base(wide, cache, group)
    figures = {"load_peak_bytes": resident_peak_bytes() - before, "peak_was_reset": reset}
    logits = {"wide": probe_logits(model)}
    del model
    model, _ = load_sharded_base(tied, cache, group)
    head, embeddings = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    figures["tied_head_equals_embeddings"] = bool(torch.equal(head.full_tensor(), embeddings.full_tensor()))
    logits["tied"] = probe_logits(model)
    every: list[dict[str, object]] = [{}] * group.world_size
    dist.all_gather_object(every, figures)
    if group.leading:
        save_file(logits, out.with_suffix(".safetensors"))
        out.write_text(json.dumps(every))


if __name__ == "__main__":
    main(*(Path(arg) for arg in sys.argv[1:5]))

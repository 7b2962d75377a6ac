"""A 2-rank worker group (gloo) loads a base shard by shard: each rank's host memory while it
loads stays well below a whole copy of the base, and the sharded model computes the logits of
the base loaded whole in one process.

The bases are seeded GLM-class MoE bases generated here, pulled (built once, as safetensors)
by this process before the ranks start: a wide one (64 routed experts per layer, 395 MiB of
float32 weights, so that the fixed costs of a load do not hide its weights), whose files keep
each expert apart and whose model fuses them, and a small one whose head is tied to its
embeddings. Bound: a rank's peak resident memory while loading, over what it held just before,
is below 0.75 x the base's weight bytes. Its share of the weights is 0.5 (read straight into
its shards); the tokenizer adds a fixed ~60 MB at its peak (0.15 here); reading the whole base
first, as a single worker does, would cost at least 1.0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mint.config import PROJECT_ROOT
from mint.schemas.base_models import get_base_model_spec
from mint.trainer.models import load_base_model, pull_base_model
from mint.trainer.sharded_loading import CheckpointFiles
from tests.distributed.loads import probe_logits, variant
from tests.distributed.runs import one_thread_as_the_ranks_run, run_two_ranks

pytestmark = [pytest.mark.torch, pytest.mark.backend_free]

LOAD_BOUND = 0.75  # x the base's weight bytes, per rank of 2


def weight_bytes(folder: Path) -> int:
    """Bytes of the tensors in a pulled base's safetensors files."""
    tensors = CheckpointFiles(folder).tensors.values()
    return sum(math.prod(stored.shape) * stored.dtype.itemsize for stored in tensors)


def test_a_two_rank_group_loads_only_its_shards_and_computes_the_whole_models_logits(tmp_path: Path) -> None:
    spec = get_base_model_spec("tiny-glm-moe", PROJECT_ROOT / "configs" / "models")
    wide = variant(
        spec,
        "sharded-load-wide-moe",
        seed=7,
        hidden_size=256,
        head_dim=64,
        intermediate_size=1024,
        moe_intermediate_size=512,
        n_routed_experts=64,
    )
    tied = variant(spec, "sharded-load-tied-moe", seed=8, tie_word_embeddings=True)
    cache = tmp_path / "cache"
    expected = {}
    with one_thread_as_the_ranks_run():
        for key, base in (("wide", wide), ("tied", tied)):
            pull_base_model(base, cache)
            model, _ = load_base_model(base, cache)
            expected[key] = probe_logits(model)
            del model
    spec_files = []
    for base in (wide, tied):
        spec_files.append(tmp_path / f"{base.name}.json")
        spec_files[-1].write_text(base.model_dump_json())

    out = tmp_path / "loaded.json"
    run_two_ranks("load_script.py", out, cache, *map(str, spec_files))
    ranks = json.loads(out.read_text())
    logits = load_file(out.with_suffix(".safetensors"))

    for key in ("wide", "tied"):
        torch.testing.assert_close(logits[key], expected[key], rtol=1e-5, atol=1e-5)
    assert all(rank["tied_head_equals_embeddings"] for rank in ranks)
    whole = weight_bytes(cache / wide.name)
    assert whole > 384 * 2**20  # large enough that what loading adds is the weights, not overheads
    for rank, figures in enumerate(ranks):
        assert 0 < figures["load_peak_bytes"] < LOAD_BOUND * whole, (rank, figures["load_peak_bytes"] / whole)

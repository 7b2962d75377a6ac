"""One process against worker groups of 2, 4, ... ranks (FSDP2 over gloo) on the same training steps.

    python bench/worker_group.py [--base tiny-glm-moe] [--steps 8] [--rows 8] [--nproc 2]

Groups of 2, 4, 8 ... ranks up to `--nproc` (and of `--nproc` itself) are measured, each rank
one intra-op thread, as is the single process. On a CUDA machine the ranks use NCCL, one GPU
each, and the single process runs on the first GPU (`bench/gpu_check.sh` runs it with
`--nproc 1`: Mint's own group code on NCCL).

Every side trains a LoRA session (rank 0 drives a ResidentBase joined to the group, the other
ranks follow, as in `mint worker --nproc`) and then every weight (full-parameter, SPMD) on the
same batch of `--rows` rows of 128 tokens. On a group each rank runs its share of the rows
(`mint.trainer.data_parallel`), printed as rows per rank. Printed: seconds per step and tokens
per second, the base's weights and the full-parameter state each rank holds, the peak resident
memory of loading the base (over what the process held before: a group's ranks read only their
shards, `mint.trainer.sharded_loading`), and each rank's peak resident memory, with each group's
ratio to one process. On one CPU machine, every layer is
all-gathered over loopback at each pass and the ranks share the machine's cores: what a group
buys there is the weights per rank; the split of the rows is what makes ranks on separate
devices faster than one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import peak_rss_mb  # noqa: E402


def batch(rows: int, length: int = 128) -> list[Any]:
    from mint.trainer.types import Datum

    data = []
    for row in range(rows):
        tokens = [(100 + 37 * row + i) % 40000 for i in range(length + 1)]
        data.append(
            Datum(model_input=tokens[:-1], loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * length})
        )
    return data


def _local_weight_bytes(model: Any) -> int:
    """Bytes of the base's weights held by this process (its shards on a group)."""
    total = 0
    for parameter in model.parameters():
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        total += local.numel() * local.element_size()
    return total


def _timed(steps: int, step: Any) -> float:
    import torch

    def synchronize() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    step()  # warm-up: first passes allocate
    synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize()
    return (time.perf_counter() - started) / steps


def rows_per_rank(rows: int, ranks: int) -> list[int]:
    """How many of the batch's rows each rank runs (`data_parallel.RowShare`)."""
    from mint.trainer.data_parallel import RowShare
    from mint.trainer.losses import get_loss
    from mint.trainer.scoring import ScoreRequest

    share = RowShare.of([ScoreRequest(batch(rows), get_loss("cross_entropy"), {})], ranks)
    return [len(share.rows(rank)) for rank in range(ranks)]


def measure(base_name: str, steps: int, rows: int, grouped: bool) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist

    from mint.config import get_settings
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.full import FullParameterTrainer
    from mint.trainer.group import Group
    from mint.trainer.host_memory import reset_resident_peak, resident_bytes, resident_peak_bytes
    from mint.trainer.models import base_model_class
    from mint.trainer.session import ResidentBase
    from mint.trainer.types import AdamParams, LoraOptions

    torch.set_num_threads(1)
    settings = get_settings()
    spec = get_base_model_spec(base_name, settings.model_configs_dir)
    group = Group.join() if grouped else None
    device = "cuda" if torch.cuda.is_available() and group is None else "cpu"  # a group shards to its device
    data = batch(rows)
    base_model_class(spec)  # the architecture's module imported before loading is measured
    reset_resident_peak()
    before = resident_bytes()
    base = ResidentBase(spec, settings.models_cache_dir, device=device, group=group)
    result: dict[str, Any] = {"load_peak_mb": (resident_peak_bytes() - before) / 2**20}
    if group is None or group.leading:
        session = base.create_session(LoraOptions(seed=1))

        def lora_step() -> None:
            session.forward_backward(data, "cross_entropy")
            session.optim_step(AdamParams(learning_rate=1e-3))

        result["lora_s_per_step"] = _timed(steps, lora_step)
        result["base_weights_mb"] = _local_weight_bytes(base.model) / 2**20
        base.close(session.session_id)
        if group is not None:
            group.stop()
    else:
        base.follow()
    del base
    full = FullParameterTrainer(spec, settings.models_cache_dir, device=device, group=group)

    def full_step() -> None:
        full.forward_backward(data, "cross_entropy")
        full.optim_step(AdamParams(learning_rate=1e-4))

    result["full_s_per_step"] = _timed(steps, full_step)
    result["full_state_mb"] = (
        _local_weight_bytes(full.model)
        + sum(
            t.to_local().numel() * 4 if hasattr(t, "to_local") else t.numel() * 4
            for state in full.optimizer.live_state().values()
            for t in state.values()
        )
    ) / 2**20
    result["peak_rss_mb"] = peak_rss_mb()
    if group is None:
        return result
    result["backend"] = dist.get_backend()
    every: list[Any] = [None] * group.world_size
    dist.all_gather_object(every, result)
    return {**every[0], "peak_rss_mb_per_rank": [r["peak_rss_mb"] for r in every]} if group.leading else None


def run_group(ranks: int, me: list[str], env: dict[str, str]) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *me]
        + ["--only", "group"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    if run.returncode != 0:
        sys.exit(f"the {ranks}-rank group failed:\n{run.stderr[-3000:]}")
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="tiny-glm-moe")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rows", type=int, default=8, help="rows of 128 tokens in each step's batch")
    parser.add_argument("--nproc", type=int, default=2, help="the largest group measured")
    parser.add_argument("--only", choices=["single", "group"])
    args = parser.parse_args()
    if args.only:
        result = measure(args.base, args.steps, args.rows, grouped=args.only == "group")
        if result is not None:
            print(json.dumps(result), flush=True)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    me = [str(Path(__file__).resolve()), "--base", args.base, "--steps", str(args.steps), "--rows", str(args.rows)]
    single = subprocess.run([sys.executable, *me, "--only", "single"], env=env, capture_output=True, text=True)
    if single.returncode != 0:
        sys.exit(f"the single process failed:\n{single.stderr[-3000:]}")
    one = json.loads(single.stdout.strip().splitlines()[-1])
    sizes = sorted({size for size in (2, 4, 8, 16) if size <= args.nproc} | {args.nproc})
    groups = {size: run_group(size, me, env) for size in sizes}
    tokens = args.rows * 128
    for side in (one, *groups.values()):
        side["lora_tokens_per_s"] = tokens / side["lora_s_per_step"]
        side["full_tokens_per_s"] = tokens / side["full_s_per_step"]
    print(f"{args.base}, {args.steps} steps of {args.rows} x 128 tokens, one intra-op thread per process")
    print(f"group backend: {next(iter(groups.values()))['backend']}")
    header = f"{'':28}{'1 process':>12}" + "".join(f"{f'{size} ranks':>12}{'ratio':>8}" for size in sizes)
    print(header)
    for key, label in (
        ("lora_s_per_step", "LoRA s/step"),
        ("lora_tokens_per_s", "LoRA tokens/s"),
        ("full_s_per_step", "full-parameter s/step"),
        ("full_tokens_per_s", "full-parameter tokens/s"),
        ("base_weights_mb", "base weights/rank MiB"),
        ("full_state_mb", "full state/rank MiB"),
        ("load_peak_mb", "loading's peak MiB (rank 0)"),
        ("peak_rss_mb", "peak RSS MiB (rank 0)"),
    ):
        cells = "".join(f"{groups[size][key]:12.3f}{groups[size][key] / one[key]:8.2f}" for size in sizes)
        print(f"{label:28}{one[key]:12.3f}{cells}")
    for size in sizes:
        peaks = ", ".join(f"{value:.0f}" for value in groups[size]["peak_rss_mb_per_rank"])
        shares = ", ".join(str(count) for count in rows_per_rank(args.rows, size))
        print(f"{size} ranks: rows per rank {shares}; peak RSS per rank MiB {peaks}")


if __name__ == "__main__":
    main()

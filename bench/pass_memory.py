"""Host memory of one large forward_backward: Mint's defaults against the plain pass, in one run.

    python bench/pass_memory.py [--base smollm2-135m-instruct] [--data 4] [--tokens 800]

Each contestant runs in a fresh process (so its peak is its own) and scores the same data with
cross-entropy on a new LoRA session (r16, every linear layer):
- `ordinary`: the pass as Mint runs one below `packing.LARGE_PASS_ACTIVATION_BYTES`: every
  activation kept, glibc's dynamic mmap threshold;
- `large`: the pass as Mint runs one above it: decoder layers checkpointed and large freed
  blocks returned to the system (`host_memory.returning_large_blocks`).
The table gives the peak resident memory above the loaded model, the seconds of the pass, the
loss (equal across contestants) and the ratios against `ordinary`, and says which of the two
Mint picks for this size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import peak_rss_mb, run_contestant, table_row  # noqa: E402

CONTESTANTS = ("ordinary", "large")


def run_one(name: str, base: str, data_count: int, tokens: int) -> dict[str, Any]:
    from mint.config import get_settings
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer import packing, session
    from mint.trainer.types import Datum, LoraOptions

    limit = packing.LARGE_PASS_ACTIVATION_BYTES

    packing.LARGE_PASS_ACTIVATION_BYTES = sys.maxsize if name == "ordinary" else 0
    settings = get_settings()
    spec = get_base_model_spec(base, settings.model_configs_dir)
    resident = session.ResidentBase(spec, Path(tempfile.mkdtemp()))
    trained = resident.create_session(LoraOptions())
    vocab = resident.limits.vocab_in
    data = [
        Datum(
            model_input=[(7 * i + 13 * j) % (vocab - 10) + 5 for j in range(tokens)],
            loss_fn_inputs={"target_tokens": [(7 * i + 13 * j + 1) % (vocab - 10) + 5 for j in range(tokens)]},
        )
        for i in range(data_count)
    ]
    loaded = peak_rss_mb()
    start = time.perf_counter()
    output = trained.forward_backward(data, "cross_entropy")
    seconds = time.perf_counter() - start
    picks = "large" if packing.activation_bytes(resident.model.config, data_count * tokens) > limit else "ordinary"
    return {
        "peak_over_load_mb": peak_rss_mb() - loaded,
        "seconds": seconds,
        "loss": output.metrics["loss:sum"],
        "mint_picks": picks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--data", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=800)
    parser.add_argument("--only", choices=CONTESTANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:
        print(json.dumps(run_one(args.only, args.base, args.data, args.tokens)))
        return
    argv = ["--base", args.base, "--data", str(args.data), "--tokens", str(args.tokens)]
    results = {name: run_contestant(__file__, name, argv) for name in CONTESTANTS}
    plain = results["ordinary"]
    print(
        f"{args.base}: forward_backward of {args.data} data x {args.tokens} tokens (cross-entropy, LoRA r16); "
        f"Mint runs it as a {plain['mint_picks']} pass"
    )
    widths = (8, 16, 10, 14, 12, 12)
    print(table_row(("", "peak over load", "seconds", "loss", "memory x", "time x"), widths))
    for name, result in results.items():
        cells = (
            name,
            f"{result['peak_over_load_mb']:.0f} MB",
            f"{result['seconds']:.1f}",
            f"{result['loss']:.2f}",
            f"{result['peak_over_load_mb'] / max(plain['peak_over_load_mb'], 1.0):.2f}",
            f"{result['seconds'] / plain['seconds']:.2f}",
        )
        print(table_row(cells, widths))


if __name__ == "__main__":
    main()

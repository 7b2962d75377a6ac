"""One rank of a worker group: `mint worker --base B --nproc N` runs this module under torchrun.

Every rank joins the torch.distributed group, loads the base and shards it (FSDP2). Rank 0
then runs an ordinary Mint worker on the queues it was given plus its own process queue;
the other ranks follow its commands (`mint.trainer.group`) until it stops.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from mint.trainer.group import Group
from mint.worker.main import run_worker
from mint.worker.queues import process_queue
from mint.worker.resident import load_group_base


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mint.worker.group", description=__doc__)
    parser.add_argument("--base", required=True, help="the base model the group holds")
    parser.add_argument("--queues", required=True, help="comma-separated queues rank 0 consumes")
    parser.add_argument("--name", required=True, help="rank 0's Celery node name")
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.loglevel)
    group = Group.join()
    base = load_group_base(args.base, group)
    if not group.leading:
        base.follow()
        return
    try:
        run_worker([*args.queues.split(","), process_queue()], args.name, args.loglevel)
    finally:
        group.stop()


if __name__ == "__main__":
    main()

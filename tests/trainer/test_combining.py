"""Loops that drifted out of step fall back in step and share every pass after that.

Two loops call two combiners ("train", made first, then "sample") in turn; one loop starts with
an extra "train" call, so at first one waits to sample while the other waits to train. The
group runs the first combiner's pass, whose loop then joins the other at "sample": from then on
every pass holds both loops. No timing is involved: the gathering waits are bounded by a long
`gather_s` that a correct run never reaches.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from mint.trainer.combining import Combiner, Loops

STEPS = 5


def test_loops_out_of_step_fall_back_in_step_and_share_every_pass() -> None:
    loops = Loops()
    passes: list[tuple[str, list[str]]] = []

    def runner(name: str) -> Combiner[str, str]:
        def run_many(requests: Sequence[str]) -> list[str]:
            passes.append((name, sorted(requests)))
            return list(requests)

        return Combiner(run_many, max_batch=8, loops=loops, gather_s=60.0)

    train, sample = runner("train"), runner("sample")
    both_looping = threading.Barrier(2)

    def loop(who: str, extra_train: bool) -> None:
        with loops.looping():
            both_looping.wait()
            if extra_train:
                train.submit(who)
            for _ in range(STEPS):
                sample.submit(who)
                train.submit(who)

    threads = [threading.Thread(target=loop, args=("a", False)), threading.Thread(target=loop, args=("b", True))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert passes[0] == ("train", ["b"])
    assert passes[1:] == [("sample", ["a", "b"]), ("train", ["a", "b"])] * STEPS

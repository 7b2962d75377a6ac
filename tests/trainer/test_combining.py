"""Loops that drifted out of step fall back in step and share every pass after that.

Two loops call two combiners ("train", made first, then "sample") in turn; one loop starts with
an extra "train" call, so at first one waits to sample while the other waits to train. The
group runs the first combiner's pass, whose loop then joins the other at "sample": from then on
every pass holds both loops. No timing is involved: the gathering waits are bounded by a long
`gather_s` that a correct run never reaches.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

import pytest

from mint.trainer.combining import Combiner, Loops
from mint.trainer.compute_lane import ComputeLane

pytestmark = pytest.mark.backend_free

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


def test_a_served_lane_runs_every_pass_on_its_thread_and_hands_errors_back() -> None:
    """Loops at once hand their passes to the thread serving the lane, which runs them until every
    loop has ended; a pass's error reaches the loop whose call caused it. Unserved, a lane runs
    a pass on the leader's own thread."""
    lane, loops = ComputeLane(), Loops()
    ran_on: list[tuple[str, list[str]]] = []

    def run_many(requests: Sequence[str]) -> list[str]:
        ran_on.append((threading.current_thread().name, sorted(requests)))
        if "bad" in requests:
            raise ValueError("a bad request")
        return [request.upper() for request in requests]

    combiner = Combiner(run_many, max_batch=8, loops=loops, gather_s=60.0, lane=lane)
    assert combiner.submit("alone") == "ALONE" and ran_on.pop() == ("MainThread", ["alone"])

    results: dict[str, object] = {}
    both_looping = threading.Barrier(2)

    def loop(who: str) -> str:
        try:
            with loops.looping():
                both_looping.wait()
                results[who] = [combiner.submit(who) for _ in range(STEPS)]
                results[who + " bad"] = combiner.submit("bad")
        except ValueError as error:
            results[who + " bad"] = str(error)
        return threading.current_thread().name

    assert lane.run_loops([functools.partial(loop, "a"), functools.partial(loop, "b")]) == ["loop-0", "loop-1"]
    assert results == {"a": ["A"] * STEPS, "b": ["B"] * STEPS, "a bad": "a bad request", "b bad": "a bad request"}
    assert {thread for thread, _ in ran_on} == {"MainThread"}
    assert ran_on[:STEPS] == [("MainThread", ["a", "b"])] * STEPS


def test_a_lane_with_its_own_thread_runs_what_any_thread_hands_it_until_stopped() -> None:
    """`start` gives the lane a daemon thread that runs every call from any other thread (errors
    handed back to the caller); after `stop` the lane runs calls inline again."""
    lane = ComputeLane()
    lane.start("own-lane")
    try:

        def where(tag: str) -> tuple[str, str]:
            if tag == "bad":
                raise ValueError("a bad call")
            return tag, threading.current_thread().name

        seen: list[tuple[str, str]] = []
        callers = [threading.Thread(target=lambda t=tag: seen.append(lane.run(where, t))) for tag in ("x", "y")]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        assert sorted(seen) == [("x", "own-lane"), ("y", "own-lane")]
        assert lane.run(where, "main") == ("main", "own-lane")
        with pytest.raises(ValueError, match="a bad call"):
            lane.run(where, "bad")
    finally:
        lane.stop()
    assert lane.run(where, "after") == ("after", "MainThread")

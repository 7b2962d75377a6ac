"""Calls from concurrent threads run together: while one batch runs, the calls that arrive wait,
and the next caller to find the engine free runs all of them at once (flat combining).

A call that finds nothing running runs at once: calls batch when they overlap, e.g. Tinker
models on one worker whose requests arrive while another's pass runs. Loops that call again and
again (RL jobs on one base, each a thread) declare themselves with `Loops.looping()`, shared by
the combiners they call (sampling, forward_backward): while two or more loops run, a leader
waits, before it starts, until every loop waits in a combiner of the group and its own is the
first of them (in the order the combiners were made) that any loop waits in. Loops that
drifted apart, some waiting to sample while others wait to train, thus fall back in step: the
first combiner's pass runs, its loops move on to the other combiner and join the loops waiting
there, whose pass then holds them all. A leader waits at most `gather_s` while no pass of the
group runs, so a loop that is slow to come back costs the others no more than that. With a
`ComputeLane`, a leader's pass runs on the thread that serves the lane, if one does.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from mint.trainer.compute_lane import ComputeLane

RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")


@dataclass(eq=False)  # compared by identity: two calls may carry equal requests
class _Call(Generic[RequestT]):
    request: RequestT
    thread: int = field(default_factory=threading.get_ident)
    done: bool = False
    result: Any = None
    error: BaseException | None = None


class Loops:
    """The looping threads of a group of combiners, and which of them wait in one now."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self._members: set[int] = set()
        self._parked: dict[int, int] = {}  # thread -> the rank of the combiner it waits in
        self._ranks = itertools.count()
        self.passes_running = 0

    def new_rank(self) -> int:
        """The next combiner's place in the group's order."""
        return next(self._ranks)

    @contextmanager
    def looping(self) -> Iterator[None]:
        """While open, the calling thread is a loop that will call the group's combiners again soon."""
        me = threading.get_ident()
        with self.cond:
            self._members.add(me)
        try:
            yield
        finally:
            with self.cond:
                self._members.discard(me)
                self.cond.notify_all()

    @contextmanager
    def parked(self, rank: int) -> Iterator[None]:
        """The calling thread waits in the combiner of `rank` (called with `cond` held)."""
        me = threading.get_ident()
        self._parked[me] = rank
        self.cond.notify_all()
        try:
            yield
        finally:
            self._parked.pop(me, None)

    def leave(self, thread: int) -> None:
        """`thread`'s call was served: it waits in no combiner (called with `cond` held)."""
        self._parked.pop(thread, None)

    def should_gather(self) -> bool:
        return len(self._members) > 1

    def may_start(self, rank: int) -> bool:
        """Whether the combiner of `rank` may start its pass: every loop waits in a combiner of
        the group, and this is the first combiner (by rank) that any loop waits in."""
        if not self._members <= self._parked.keys():
            return False
        return rank == min(self._parked[member] for member in self._members)


class Combiner(Generic[RequestT, ResultT]):
    """Runs `run_many` over the requests that are waiting, at most `max_batch` at a time.

    `run_many` returns one result per request, in order, or raises; when a batch of several
    raises, each request is run again alone, so an error reaches only the call that caused it.
    """

    def __init__(
        self,
        run_many: Callable[[Sequence[RequestT]], list[ResultT]],
        max_batch: int = 8,
        loops: Loops | None = None,
        gather_s: float = 1.0,
        lane: ComputeLane | None = None,
    ) -> None:
        self._run_many = run_many
        self._lane = lane
        self._max_batch = max_batch
        self._loops = loops or Loops()
        self._gather_s = gather_s
        self._waiting: list[_Call[RequestT]] = []
        self._running = False
        self._cond = self._loops.cond
        self._rank = self._loops.new_rank()
        self.batches_run = 0
        self.largest_batch = 0

    def waiting(self, count: int, timeout_s: float) -> bool:
        """Block until at least `count` calls wait for a batch (or `timeout_s` passes); whether they do."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._waiting) >= count, timeout=timeout_s)

    def submit(self, request: RequestT) -> ResultT:
        """Run `request`, batched with whatever other threads submit meanwhile; its result or error."""
        call: _Call[RequestT] = _Call(request)
        with self._cond:
            self._waiting.append(call)
            with self._loops.parked(self._rank):
                while self._running and not call.done:
                    self._cond.wait()
                leader = not call.done
                if leader:
                    self._running = True
                    if self._loops.should_gather():  # the other loops' calls may be on their way
                        self._gather()
            if leader:
                batch = [call] + [other for other in self._waiting if other is not call][: self._max_batch - 1]
                self._waiting = [other for other in self._waiting if other not in batch]
                self._loops.passes_running += 1
        if leader:
            try:
                self._run(batch)
            finally:
                with self._cond:
                    self._running = False
                    self._loops.passes_running -= 1
                    for done in batch:  # served: no longer waiting, even before their threads wake
                        self._loops.leave(done.thread)
                    self._cond.notify_all()
        if call.error is not None:
            raise call.error
        return call.result

    def _gather(self) -> None:
        """Wait (with `cond` held) until this combiner may start (`Loops.may_start`), or until
        `gather_s` has passed with no pass of the group running."""
        deadline = time.monotonic() + self._gather_s
        while not self._loops.may_start(self._rank):
            if self._loops.passes_running:  # the loops away are in a pass: they will come
                deadline = time.monotonic() + self._gather_s
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._cond.wait(remaining)

    def _run(self, batch: list[_Call[RequestT]]) -> None:
        self.batches_run += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        try:
            requests = [call.request for call in batch]
            results: list[Any] = self._lane.run(self._run_many, requests) if self._lane else self._run_many(requests)
        except BaseException as exc:
            if len(batch) > 1:
                for call in batch:
                    self._run([call])
                return
            results, batch[0].error = [None], exc
        for call, result in zip(batch, results, strict=True):
            call.result, call.done = result, True

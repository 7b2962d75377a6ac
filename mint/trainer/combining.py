"""Calls from concurrent threads run together: while one batch runs, the calls that arrive wait,
and the next caller to find the engine free runs all of them at once (flat combining).

No timer and no batching window: a call that finds nothing running runs at once, alone. Calls
batch exactly when they overlap, which is when batching pays: several RL jobs or Tinker models
on one resident base whose steps arrive while another's pass is running.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")


@dataclass(eq=False)  # compared by identity: two calls may carry equal requests
class _Call(Generic[RequestT]):
    request: RequestT
    done: bool = False
    result: Any = None
    error: BaseException | None = None


class Combiner(Generic[RequestT, ResultT]):
    """Runs `run_many` over the requests that are waiting, at most `max_batch` at a time.

    `run_many` returns one result per request, in order, or raises; when a batch of several
    raises, each request is run again alone, so an error reaches only the call that caused it.
    """

    def __init__(self, run_many: Callable[[Sequence[RequestT]], list[ResultT]], max_batch: int = 8) -> None:
        self._run_many = run_many
        self._max_batch = max_batch
        self._waiting: list[_Call[RequestT]] = []
        self._running = False
        self._cond = threading.Condition()
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
            self._cond.notify_all()  # for whoever watches the queue (`waiting`)
            while self._running and not call.done:
                self._cond.wait()
            leader = not call.done
            if leader:
                self._running = True
                batch = [call] + [other for other in self._waiting if other is not call][: self._max_batch - 1]
                self._waiting = [other for other in self._waiting if other not in batch]
        if leader:
            try:
                self._run(batch)
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()
        if call.error is not None:
            raise call.error
        return call.result

    def _run(self, batch: list[_Call[RequestT]]) -> None:
        self.batches_run += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        try:
            results: list[Any] = self._run_many([call.request for call in batch])
        except BaseException as exc:
            if len(batch) > 1:
                for call in batch:
                    self._run([call])
                return
            results, batch[0].error = [None], exc
        for call, result in zip(batch, results, strict=True):
            call.result, call.done = result, True

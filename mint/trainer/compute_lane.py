"""The compute lane: one thread that runs every pass of a resident base while loops run at once.

Training loops of several sessions (RL runs) on threads of one process share their sampling
and forward_backward passes (`mint.trainer.combining`). Which thread runs a pass matters on a
CPU: torch's kernels run on OpenMP (libgomp), each thread that opens a parallel region keeps a
pool of worker threads, and once the process holds more pool threads than cores, libgomp no
longer spin-waits for work and wakes its workers through the kernel at every region. On 2
cores, an element-wise op of 37k floats took 56 us from a second thread instead of 5 us, and
the mixed decoding pass of four RL loops 11.4 s from a loop's thread instead of 7.6 s from
the thread that loaded the base (one pool in the process).

So while loops run at once (`ResidentBase.run_at_once`), every pass runs on the thread that
serves the lane, the only one whose torch ops use every core, and each loop runs its own small
torch ops (the optimizer step, advantages) on one core, without a pool. Without a thread
serving it, the lane runs a pass on the caller's thread, as before.

A lane can also be served by a daemon thread of its own (`start`): the serving engine's
(`mint.serving.torch_engine`), where the model is loaded and every step, slot fill and removal
runs, whichever HTTP, batcher or cache thread asks for it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

ResultT = TypeVar("ResultT")

# Put on the work queue by `stop`: the lane's own thread leaves.
_STOP: Any = object()


class _Job:
    """A pass handed to the lane, and its outcome once run."""

    def __init__(self, run: Callable[[], Any]) -> None:
        self.run = run
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def __call__(self) -> None:
        try:
            self.result = self.run()
        except BaseException as error:  # noqa: BLE001 - handed to the thread that waits for the pass
            self.error = error
        finally:
            self.done.set()


class ComputeLane:
    """Runs functions on the one thread that serves it (`run_loops`, or its own after `start`),
    or inline when none does."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # orders a hand-over against the server's leaving
        self._work: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()  # None: a loop ended
        self._server: int | None = None
        self._own_thread: threading.Thread | None = None

    def run(self, function: Callable[..., ResultT], *arguments: Any) -> ResultT:
        """`function(*arguments)` on the serving thread, waiting for it; on this thread when no
        thread serves the lane, or when this is the serving thread."""
        job = _Job(lambda: function(*arguments))
        with self._lock:
            handed = self._server is not None and self._server != threading.get_ident()
            if handed:
                self._work.put(job)
        if not handed:
            return function(*arguments)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def run_loops(
        self, loops: Sequence[Callable[[], ResultT]], *, on_loop_thread: Callable[[], None] = lambda: None
    ) -> list[ResultT]:
        """Run `loops` at once, each on a thread of its own (which first calls `on_loop_thread`),
        while this thread serves the lane: it is this thread's before the first loop starts, so
        no pass runs elsewhere. Returns the loops' results in order once all have ended; raises
        the first failed one's error, once all have ended."""
        jobs = [_Job(loop) for loop in loops]

        def on_thread(job: _Job) -> None:
            on_loop_thread()
            job()
            self._work.put(None)  # this loop has ended

        threads = [
            threading.Thread(target=on_thread, args=(job,), name=f"loop-{index}") for index, job in enumerate(jobs)
        ]
        self._serve(threads)
        for thread in threads:
            thread.join()
        failed = next((job.error for job in jobs if job.error is not None), None)
        if failed is not None:
            raise failed
        return [job.result for job in jobs]

    def start(self, name: str) -> None:
        """Serve the lane from a daemon thread named `name` until `stop`: everything `run` is given
        from now on runs there (the thread holds the lane before this returns)."""
        claimed = threading.Event()

        def serve() -> None:
            self._claim()
            claimed.set()
            try:
                while (job := self._work.get()) is not _STOP:
                    if job is not None:
                        job()
            finally:
                self._leave()

        thread = threading.Thread(target=serve, name=name, daemon=True)
        thread.start()
        claimed.wait()
        self._own_thread = thread

    def stop(self) -> None:
        """Let the lane's own thread (`start`) leave once what it was handed has run; the lane then
        runs work inline again. A lane without its own thread has nothing to stop."""
        thread, self._own_thread = self._own_thread, None
        if thread is not None:
            self._work.put(_STOP)
            thread.join()

    def _claim(self) -> None:
        with self._lock:
            if self._server is not None:
                raise RuntimeError("the compute lane is served by another thread already")
            self._server = threading.get_ident()

    def _leave(self) -> None:
        with self._lock:
            self._server = None
        while True:  # handed over before the server left: run here, nobody else will
            try:
                job = self._work.get_nowait()
            except queue.Empty:
                break
            if job is not None and job is not _STOP:
                job()

    def _serve(self, threads: Sequence[threading.Thread]) -> None:
        """Claim the lane for this thread, start `threads`, and run what they hand over until each
        has ended."""
        self._claim()
        try:
            for thread in threads:
                thread.start()
            loops = len(threads)
            while loops:
                job = self._work.get()
                if job is None:
                    loops -= 1
                else:
                    job()
        finally:
            self._leave()

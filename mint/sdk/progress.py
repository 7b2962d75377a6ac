"""The progress bar of `wait()`: what a job or eval run is doing, how far it is, and when it ends;
and how a `wait()` paces its polls.

One line on stderr (so that a script's stdout stays clean): the resource and its status, a
bar of steps (or tasks) done out of the total, the latest loss (or the pass rate so far),
elapsed time and rich's estimate of the time left. With `enabled=False` nothing is drawn
and nothing of rich is imported.

A `wait()` polls every `poll_interval_s`, never faster than MIN_POLL_INTERVAL_S: work that
takes minutes gains nothing from faster polls, which only spend the key's rate limit. A
request of a poll refused with a 429 that it did not wait out itself (the server asked for a
longer pause than `max_rate_limit_wait_s`) is waited out here (`patiently`), as the server
asked, within the wait's own `timeout_s`, and sent again alone: the requests of the poll that
were answered are not sent again, so a poll of several requests always gets through, however
few the rate limit allows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from mint.sdk.errors import RateLimitError, WaitTimeoutError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID


class WaitProgress:
    """A one-task rich progress bar that `wait()` updates after every poll."""

    def __init__(self, label: str, *, enabled: bool = True, console: Console | None = None) -> None:
        self.label = label
        self.enabled = enabled
        self._console = console
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> WaitProgress:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            TextColumn("{task.fields[unit]}"),
            MofNCompleteColumn(),
            TextColumn("{task.fields[metric]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self._console or Console(stderr=True),
        )
        self._progress.start()
        self._task = self._progress.add_task(self.label, total=None, unit="", metric="")
        return self

    def update(self, *, status: str, completed: int, total: int | None, unit: str, metric: str = "") -> None:
        """Show the latest poll: `status`, `completed` of `total` `unit`s, and a metric such as the loss."""
        if self._progress is None or self._task is None:
            return
        fields: dict[str, Any] = {"unit": unit, "metric": metric}
        self._progress.update(
            self._task,
            description=f"{self.label} {status}",
            completed=completed,
            total=total or None,
            **fields,
        )

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()


log = logging.getLogger("mint.sdk")
T = TypeVar("T")

# The shortest pause between two polls of a `wait()`.
MIN_POLL_INTERVAL_S = 0.5


def poll_pause(poll_interval_s: float) -> float:
    """The pause between two polls: as asked, but never under MIN_POLL_INTERVAL_S."""
    return max(MIN_POLL_INTERVAL_S, poll_interval_s)


class Deadline:
    """The optional time limit of a `wait()`: None waits as long as the work takes."""

    def __init__(self, timeout_s: float | None) -> None:
        self._end = None if timeout_s is None else time.monotonic() + timeout_s
        self.timeout_s = timeout_s

    def check(self, what: str) -> None:
        """Raise WaitTimeoutError if the limit has passed."""
        if self._end is not None and time.monotonic() >= self._end:
            raise WaitTimeoutError(
                f"{what} did not finish within {self.timeout_s:g} s; it goes on running on the server"
            )

    def rate_limited(self, refused: RateLimitError, what: str) -> float:
        """How long to pause before polling again after `refused`: as long as the server asked,
        but not past the limit (WaitTimeoutError if it has passed)."""
        self.check(what)
        pause = max(MIN_POLL_INTERVAL_S, float(refused.retry_after_s))
        if self._end is not None:
            pause = min(pause, max(0.0, self._end - time.monotonic()))
        log.info("%s: HTTP 429 on a poll; waiting %.2fs as asked, then polling again", what, pause)
        return pause


def patiently(fetch: Callable[[], T], deadline: Deadline, what: str) -> T:
    """`fetch()`, sent again after each 429 it raises, once the pause the server asked for has
    passed (within `deadline`)."""
    while True:
        try:
            return fetch()
        except RateLimitError as refused:
            time.sleep(deadline.rate_limited(refused, what))


async def apatiently(fetch: Callable[[], Awaitable[T]], deadline: Deadline, what: str) -> T:
    """The asyncio twin of `patiently`."""
    while True:
        try:
            return await fetch()
        except RateLimitError as refused:
            await asyncio.sleep(deadline.rate_limited(refused, what))

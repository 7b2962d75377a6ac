"""The child processes of `mint up`, kept running: a child that dies is started again.

A dead child is restarted after a backoff that doubles with each restart in a row (capped),
and starts again from the first step once the child has stayed up a while. A child that
keeps dying (more than `max_restarts` restarts within `window_s`) is a fault no restart
will fix, so the supervisor gives up: `ChildKeepsDying` says which child and how it ended,
and the caller stops everything.

The clock and the way a child is started are parameters, so the policy is tested on real
short-lived processes without waiting for production backoffs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChildSpec:
    """One child: a name for the log (`worker`, `serve tiny-glm-moe #2`), its command line, and
    environment variables it gets on top of the supervisor's own (the API's MINT_READY_BASES)."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class RestartPolicy:
    """How dead children are restarted, and when the supervisor gives up."""

    backoff_s: float = 2.0
    max_backoff_s: float = 60.0
    # A child that stayed up this long before dying is restarted after the first backoff again.
    stable_after_s: float = 120.0
    # More than `max_restarts` restarts of one child within `window_s`: stop everything.
    max_restarts: int = 5
    window_s: float = 300.0

    def delay_s(self, restart: int) -> float:
        """The wait before the `restart`-th restart in a row (1-based): doubling, capped."""
        return float(min(self.backoff_s * 2 ** (restart - 1), self.max_backoff_s))


class ChildKeepsDying(Exception):
    """A child died more often than the restart policy allows."""

    def __init__(self, name: str, returncode: int, restarts: int, window_s: float) -> None:
        super().__init__(
            f"{name} exited with {returncode} after {restarts} restarts within {window_s:.0f} s; "
            f"giving up. Its log above says why it fails."
        )
        self.name = name
        self.returncode = returncode


@dataclass
class _Child:
    spec: ChildSpec
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    in_a_row: int = 0
    restarts: deque[float] = field(default_factory=deque)


def _spawn(spec: ChildSpec) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(spec.argv), env={**os.environ, **spec.env})


class Supervisor:
    """Starts `specs`, restarts those that die (`poll`), and stops them all (`stop`)."""

    def __init__(
        self,
        specs: Sequence[ChildSpec],
        *,
        policy: RestartPolicy | None = None,
        spawn: Callable[[ChildSpec], subprocess.Popen[bytes]] = _spawn,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] = print,
        stop_timeout_s: float = 20.0,
    ) -> None:
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"children need names of their own, for the log and `processes()`: {names}")
        self.policy = policy or RestartPolicy()
        self._children = [_Child(spec) for spec in specs]
        self._spawn = spawn
        self._clock = clock
        self._log = log
        self._stop_timeout_s = stop_timeout_s

    def start(self) -> None:
        for child in self._children:
            self._start(child)

    def processes(self) -> dict[str, subprocess.Popen[bytes] | None]:
        """Each child's current process (None while it waits to be restarted)."""
        return {child.spec.name: child.process for child in self._children}

    def poll(self) -> None:
        """One round: notice children that died and restart those whose backoff is over.

        Raises ChildKeepsDying when a child died more often than the policy allows.
        """
        now = self._clock()
        for child in self._children:
            if child.process is not None and child.process.poll() is not None:
                self._died(child, child.process.returncode, now)
            if child.restart_at is not None and now >= child.restart_at:
                child.restart_at = None
                child.restarts.append(now)
                self._start(child)

    def _died(self, child: _Child, returncode: int, now: float) -> None:
        child.process = None
        policy = self.policy
        if now - child.started_at >= policy.stable_after_s:
            child.in_a_row = 0
        while child.restarts and now - child.restarts[0] > policy.window_s:
            child.restarts.popleft()
        if len(child.restarts) >= policy.max_restarts:
            raise ChildKeepsDying(child.spec.name, returncode, len(child.restarts), policy.window_s)
        child.in_a_row += 1
        delay_s = policy.delay_s(child.in_a_row)
        child.restart_at = now + delay_s
        self._log(f"{child.spec.name} exited with {returncode}; restarting in {delay_s:g} s (restart {child.in_a_row})")

    def _start(self, child: _Child) -> None:
        child.process = self._spawn(child.spec)
        child.started_at = self._clock()

    def stop(self) -> None:
        """SIGTERM every running child, and SIGKILL those still running after the timeout."""
        running = [child.process for child in self._children if child.process is not None]
        for process in running:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self._stop_timeout_s
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for child in self._children:
            child.process = None
            child.restart_at = None

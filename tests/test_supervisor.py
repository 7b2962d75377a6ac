"""`mint up`'s supervisor on real short-lived processes: a dead child is restarted with a
doubling backoff (reset once it has stayed up), and a child that keeps dying makes it give up.
And the children `mint up` asks it to run: several serving nodes of one base, each a child of
its own, and the API told which bases its readiness waits for.

The clock is a counter the test moves, so backoffs are exact and nothing waits for them.
"""

from __future__ import annotations

import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import typer

from mint.cli.processes import serving_children, serving_plan
from mint.cli.supervisor import ChildKeepsDying, ChildSpec, RestartPolicy, Supervisor
from tests.conftest import wait_for

pytestmark = pytest.mark.backend_free

FAILS = ChildSpec("failer", (sys.executable, "-c", "import sys; sys.exit(3)"))
SLEEPS = ChildSpec("sleeper", (sys.executable, "-c", "import time; time.sleep(600)"))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def logged() -> list[str]:
    return []


@pytest.fixture
def supervise(clock: Clock, logged: list[str]) -> Iterator[Callable[..., Supervisor]]:
    """Start a supervisor of `specs` under a policy of its keyword arguments; stopped after the test."""
    started: list[Supervisor] = []

    def supervise_(specs: list[ChildSpec], **policy: float) -> Supervisor:
        supervisor = Supervisor(
            specs, policy=RestartPolicy(**policy), clock=clock, log=logged.append, stop_timeout_s=10
        )
        started.append(supervisor)
        supervisor.start()
        return supervisor

    yield supervise_
    for supervisor in started:
        supervisor.stop()


def test_a_killed_child_is_restarted_after_a_doubling_backoff_that_resets_once_it_stayed_up(
    clock: Clock, logged: list[str], supervise: Callable[..., Supervisor]
) -> None:
    supervisor = supervise([SLEEPS], backoff_s=2, max_backoff_s=5, stable_after_s=100)
    pids = []
    for restart, delay_s in enumerate([2, 4, 5], start=1):  # doubling, capped at 5
        process = supervisor.processes()["sleeper"]
        assert process is not None
        pids.append(process.pid)
        process.send_signal(signal.SIGKILL)
        process.wait()
        supervisor.poll()
        assert logged[-1] == f"sleeper exited with -9; restarting in {delay_s} s (restart {restart})"
        clock.now += delay_s - 0.5
        supervisor.poll()
        assert supervisor.processes()["sleeper"] is None  # still backing off
        clock.now += 0.5
        supervisor.poll()
    restarted = supervisor.processes()["sleeper"]
    assert restarted is not None and restarted.poll() is None and restarted.pid not in pids

    clock.now += 100  # up long enough: the next death starts the backoff over
    restarted.send_signal(signal.SIGKILL)
    restarted.wait()
    supervisor.poll()
    assert logged[-1] == "sleeper exited with -9; restarting in 2 s (restart 1)"


def test_a_child_that_keeps_dying_makes_the_supervisor_give_up_and_stop_the_others(
    clock: Clock, logged: list[str], supervise: Callable[..., Supervisor]
) -> None:
    supervisor = supervise([SLEEPS, FAILS], backoff_s=0.01, max_restarts=3, window_s=60)

    def gave_up() -> ChildKeepsDying | None:
        try:
            supervisor.poll()
        except ChildKeepsDying as error:
            return error
        clock.now += 0.01
        return None

    error = wait_for(gave_up, "the supervisor to give up on the failing child", timeout=60)
    assert error.name == "failer" and error.returncode == 3
    assert "failer exited with 3 after 3 restarts within 60 s" in str(error)
    assert [line.split(";")[0] for line in logged] == ["failer exited with 3"] * 3
    sleeper = supervisor.processes()["sleeper"]
    assert sleeper is not None and sleeper.poll() is None  # only the failing child was restarted
    supervisor.stop()
    assert sleeper.returncode == -signal.SIGTERM


def test_restarts_spread_wider_than_the_window_never_give_up(
    clock: Clock, logged: list[str], supervise: Callable[..., Supervisor]
) -> None:
    supervisor = supervise([FAILS], backoff_s=1, max_backoff_s=1, max_restarts=2, window_s=10)
    for _ in range(6):
        process = supervisor.processes()["failer"]
        assert process is not None
        process.wait()
        supervisor.poll()  # noticed: restart due in 1 s
        clock.now += 11  # restarts 11 s apart: never two within 10 s
        supervisor.poll()
    assert len(logged) == 6


def test_a_child_gets_its_own_environment_on_top_of_the_supervisors(
    supervise: Callable[..., Supervisor], tmp_path: Path
) -> None:
    written = tmp_path / "env.txt"
    code = f"import os; open({str(written)!r}, 'w').write(os.environ['MINT_READY_BASES'] + '|' + os.environ['PATH'])"
    supervisor = supervise([ChildSpec("api", (sys.executable, "-c", code), env={"MINT_READY_BASES": "a,b"})])
    process = supervisor.processes()["api"]
    assert process is not None and process.wait() == 0
    ready_bases, path = written.read_text().split("|")
    assert ready_bases == "a,b" and path  # the supervisor's own environment is kept


def test_children_with_the_same_name_are_refused() -> None:
    with pytest.raises(ValueError, match="names of their own"):
        Supervisor([SLEEPS, SLEEPS])


ENABLED = ["smollm2-135m-instruct", "tiny-glm-moe", "tiny-qwen3-moe"]


def test_up_runs_as_many_nodes_of_a_base_as_it_is_named_times_nodes_per_base() -> None:
    assert serving_plan(None, 1, ENABLED) == Counter(dict.fromkeys(ENABLED, 1))
    assert serving_plan(["tiny-glm-moe", "tiny-glm-moe"], 1, ENABLED) == Counter({"tiny-glm-moe": 2})
    both = Counter({"tiny-glm-moe": 3, "tiny-qwen3-moe": 3})
    assert serving_plan(["tiny-glm-moe,tiny-qwen3-moe"], 3, ENABLED) == both
    with pytest.raises(typer.BadParameter, match="unknown or disabled base 'nope'"):
        serving_plan(["tiny-glm-moe,nope"], 1, ENABLED)

    children = serving_children(Counter({"tiny-glm-moe": 2, "tiny-qwen3-moe": 1}), api_port=8000)
    names = ["serve tiny-glm-moe #1", "serve tiny-glm-moe #2", "serve tiny-qwen3-moe"]
    assert [child.name for child in children] == names
    assert [child.argv[-4:] for child in children] == [
        ("--base", "tiny-glm-moe", "--port", "8100"),
        ("--base", "tiny-glm-moe", "--port", "8101"),
        ("--base", "tiny-qwen3-moe", "--port", "8102"),
    ]

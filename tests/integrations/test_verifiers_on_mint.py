"""A `verifiers` environment, unmodified, as the environment of an eval run and of an RL job on
Mint, on the path a team takes:

1. write the environment as verifiers documents it (a Taskset, its Task with an `@vf.reward`
   rubric), in a module file of the team's own;
2. register an endpoint over REST (Mint answers its signing secret, once) and serve the
   environment behind it with `mint env-server` (its own process, and its episodes in a process
   of the verifiers virtualenv, `.venv-verifiers`, since verifiers' pins and Mint's differ);
3. a benchmark whose tasks name the server's tasks (`{"name": "remote", ...}`, graded by the
   `environment` grader) is evaluated over REST by a real worker; an RL job over REST trains on
   prompt rows naming them.

Every trajectory and every RL sample carries the reward the environment's own rubric gave the
episode, which the test recomputes from the recorded answer with the rubric's rule.
The protocol itself is checked against the running server: signatures, a retried step answered
once, an unknown episode, a malformed request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from mint.config import PROJECT_ROOT
from mint.services.webhooks.delivery import signed_headers
from tests.conftest import Tenant, Workers, wait_for
from tests.integrations.test_reward_server import free_port, until_listening
from tests.integrations.test_verl_reward_on_mint import finished
from tests.jobs.conftest import jsonl

pytestmark = [pytest.mark.slow, pytest.mark.client_surface]

BASE = "smollm2-135m-instruct"
SECRET = "whsec_" + "dmVyaWZpZXJzLW9uLW1pbnQtdGVzdC1zZWNyZXQ="

# A single-turn environment as verifiers 0.4.0 writes one: the rubric pays 1 when the last reply
# holds the sum.
ARITHMETIC_ENVIRONMENT = """
import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if self.data.answer in trace.last_reply else 0.0


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 4


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> list[SumTask]:
        prompt = "What is {0} + {0}? Answer with the number only."
        return [
            SumTask(SumData(prompt=prompt.format(i), answer=str(2 * i)), self.config.task)
            for i in range(1, self.config.num_tasks + 1)
        ]


__all__ = ["SumTaskset"]
"""


# A tool environment: the task's toolset is a verifiers MCP tool server (run by verifiers as
# `python -m <module>`, hence the module's `__main__`), the rubric pays 1 for the stock's count.
TOOL_ENVIRONMENT = '''
import verifiers.v1 as vf


class LookupToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "inventory"

    @vf.tool
    def stock(self, item: str) -> str:
        """How many of an item are in stock."""
        return {"apple": "12", "pear": "3"}.get(item, "0")


class LookupData(vf.TaskData):
    answer: str


class LookupConfigT(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class LookupTask(vf.Task[LookupData, vf.State, LookupConfigT]):
    @classmethod
    def toolsets(cls, config):
        return [LookupToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if self.data.answer in trace.last_reply else 0.0


class LookupConfig(vf.TasksetConfig):
    task: LookupConfigT = LookupConfigT()


class LookupTaskset(vf.Taskset[LookupTask, LookupConfig]):
    def load(self):
        prompt = "How many apples are in stock? Use the tool."
        return [LookupTask(LookupData(prompt=prompt, answer="12"), self.config.task)]


__all__ = ["LookupTaskset"]


if __name__ == "__main__":
    LookupToolset.run()
'''

# A multi-turn environment: the environment answers each guess as the user would ("Higher.",
# "Lower."), and pays 1 when the secret is among the first four guesses.
GUESSING_ENVIRONMENT = '''
import re

import verifiers.v1 as vf


def guess_of(reply: str) -> int | None:
    numbers = re.findall(r"-?\d+", reply)
    return int(numbers[-1]) if numbers else None


class GuessData(vf.TaskData):
    secret: int
    max_guesses: int = 4


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        guesses = [guess_of(m.content or "") for m in trace.assistant_messages]
        return 1.0 if self.data.secret in guesses[: self.data.max_guesses] else 0.0

    @vf.metric
    async def guesses(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class GuessConfig(vf.TasksetConfig):
    secrets: list[int] = [37, 5]


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self):
        prompt = "I picked a number from 1 to 100. Guess it; I will say higher or lower."
        return [GuessTask(GuessData(prompt=prompt, secret=s), self.config.task) for s in self.config.secrets]


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    """The environment answers each guess as the user: higher, lower, or correct."""

    async def run(self, task, agents):
        async with agents.player.interaction(task) as game:
            segment = await game.turn()
            for _ in range(task.data.max_guesses - 1):
                guess = guess_of(segment.last_reply)
                if segment.terminated or guess == task.data.secret:
                    break
                hint = "Not a number." if guess is None else "Higher." if guess < task.data.secret else "Lower."
                segment = await game.turn(hint)


__all__ = ["GuessTaskset", "GuessEnv"]
'''


def answer_of(index: int) -> str:
    """The rubric's answer of task `index` (task i asks for (i+1) + (i+1))."""
    return str(2 * (index + 1))


def rubric(index: int, reply: str) -> float:
    """What the environment's `correct` reward gives task `index` for `reply`."""
    return 1.0 if answer_of(index) in reply else 0.0


def verifiers_python() -> str:
    python = os.environ.get("MINT_VERIFIERS_PYTHON") or str(PROJECT_ROOT / ".venv-verifiers" / "bin" / "python")
    assert Path(python).exists(), f"{python} is missing: run `make verifiers-venv`"
    return python


@dataclass
class EnvironmentServer:
    """A running `mint env-server` and everything it has printed."""

    url: str
    process: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)

    def call(self, body: dict[str, Any], *, call_id: str | None = None, secret: str = SECRET) -> httpx.Response:
        text = json.dumps(body)
        headers = signed_headers(secret, call_id or f"msg_{uuid.uuid4().hex}", text)
        return httpx.post(self.url, content=text.encode(), headers=headers, timeout=120)


@pytest.fixture
def start_environment_server(tmp_path: Path) -> Iterator[Callable[..., EnvironmentServer]]:
    servers: list[EnvironmentServer] = []

    def start(
        source: str, *, secret: str = SECRET, port: int | None = None, module: str = "sum_environment"
    ) -> EnvironmentServer:
        environment = tmp_path / f"{module}.py"
        environment.write_text(source)
        port = port or free_port()
        command = [sys.executable, "-m", "mint", "env-server", str(environment), "--port", str(port)]
        process, output = until_listening([*command, "--secret", secret, "--python", verifiers_python()])
        server = EnvironmentServer(f"http://127.0.0.1:{port}/", process, output)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.process.terminate()
        server.process.wait()


def test_the_protocol_plays_an_episode_once_per_turn_and_refuses_what_is_wrong(
    start_environment_server: Callable[..., EnvironmentServer],
) -> None:
    server = start_environment_server(ARITHMETIC_ENVIRONMENT)
    tasks = server.call({"type": "environment.tasks"})
    assert tasks.status_code == 200, tasks.text
    assert [task["index"] for task in tasks.json()["tasks"]] == [0, 1, 2, 3]
    assert tasks.json()["tasks"][1]["prompt"] == "What is 2 + 2? Answer with the number only."

    started = server.call({"type": "environment.start", "task": 1})
    assert started.status_code == 200, started.text
    first = started.json()
    assert first["done"] is False and first["messages"] == [
        {"role": "user", "content": "What is 2 + 2? Answer with the number only."}
    ]
    step = {"type": "environment.step", "episode": first["episode"], "message": {"role": "assistant", "content": "4"}}
    ended = server.call(step, call_id="msg_step-once")
    assert ended.status_code == 200, ended.text
    assert ended.json() | {"episode": None} == {
        "episode": None,
        "messages": [],
        "done": True,
        "reward": 1.0,
        "rewards": {"correct": 1.0},
        "metrics": {},
        "errors": [],
    }
    # Mint retries a call under the same id: the first answer again, never a second turn.
    assert server.call(step, call_id="msg_step-once").json() == ended.json()
    # The episode is over: a new call for it is a 404 naming it.
    over = server.call(step)
    assert over.status_code == 404 and first["episode"] in over.json()["error"]["message"]

    wrong = server.call({"type": "environment.start", "task": 1}, secret="whsec_" + "b3RoZXItc2VjcmV0LWJ5dGVz")
    assert wrong.status_code == 401 and "signature does not verify" in wrong.json()["error"]["message"]
    unknown = server.call({"type": "environment.play"})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "type"
    missing = server.call({"type": "environment.start"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "task"
    out_of_range = server.call({"type": "environment.start", "task": 9})
    assert out_of_range.status_code == 400 and "from 0 to 3" in out_of_range.json()["error"]["message"]


@pytest.mark.torch
def test_a_verifiers_environment_is_the_environment_of_an_eval_run_and_an_rl_job(
    client: TestClient,
    tenant: Tenant,
    workers: Workers,
    start_environment_server: Callable[..., EnvironmentServer],
) -> None:
    port = free_port()
    registered = client.post(
        "/v1/reward_endpoints",
        headers=tenant.headers("developer"),
        json={"name": "sums", "url": f"http://127.0.0.1:{port}/", "description": "a verifiers environment"},
    )
    assert registered.status_code == 201, registered.text
    start_environment_server(ARITHMETIC_ENVIRONMENT, secret=registered.json()["secret"], port=port)
    workers.start("verifiers-env", base=BASE)
    dev = tenant.headers("developer")

    # The eval run: each task is the server's task, graded by its rubric.
    remote = [{"name": "remote", "config": {"endpoint": "sums", "task": index}} for index in range(4)]
    tasks = [
        {"id": f"sum-{index}", "messages": [{"role": "user", "content": "(played by the environment)"}]}
        | {"environment": environment}
        for index, environment in enumerate(remote)
    ]
    benchmark = client.post(
        "/v1/benchmarks",
        headers=dev,
        json={"name": "sums", "format": "jsonl", "content": jsonl(tasks).decode(), "grader": {"type": "environment"}},
    )
    assert benchmark.status_code == 201, benchmark.text
    run = client.post("/v1/evals", headers=dev, json={"benchmark_id": benchmark.json()["id"], "model": BASE})
    assert run.status_code in (200, 201), run.text
    url = f"/v1/evals/{run.json()['id']}"
    done = wait_for(
        lambda: (row := client.get(url, headers=dev).json())["status"] in ("succeeded", "failed") and row,
        f"{url} to finish",
        timeout=900,
    )
    assert done["status"] == "succeeded", done
    trajectories = client.get(f"{url}/trajectories?limit=100", headers=dev).json()["data"]
    assert sorted(row["task_id"] for row in trajectories) == [f"sum-{index}" for index in range(4)]
    for row in trajectories:
        index = int(row["task_id"].split("-")[1])
        assert row["error"] is None, row
        # The conversation is the environment's: its prompt, then the model's answer.
        assert row["messages"][0]["content"] == f"What is {index + 1} + {index + 1}? Answer with the number only."
        assert row["score"] == rubric(index, row["output"]), row
        assert f"environment server 'sums': reward {row['score']:g}; correct {row['score']:g}" in row["grade"]["detail"]

    # The RL job: prompt rows naming the server's tasks, no grader: the rubric is the reward.
    rows = [
        {"messages": [{"role": "user", "content": "(played by the environment)"}], "environment": spec}
        | {"reference": answer_of(index)}  # shown beside each sample: the answer the rubric looks for
        for index, spec in enumerate(remote)
    ]
    uploaded = client.post(
        "/v1/datasets", headers=dev, files={"file": ("sums.jsonl", jsonl(rows), "application/jsonl")}
    )
    assert uploaded.status_code == 201, uploaded.text
    reinforcement = {
        "type": "reinforcement",
        "reinforcement": {
            # The server plays every episode; each row names its task.
            "environment": {"name": "remote", "config": {"endpoint": "sums"}},
            "hyperparameters": {"batch_size": 2, "group_size": 2, "max_tokens": 8},
        },
    }
    job = finished(
        client,
        tenant,
        {"model": BASE, "training_file": uploaded.json()["id"], "suffix": "sums", "steps": 2, "method": reinforcement},
    )
    assert job["status"] == "succeeded", job
    events = client.get(f"/v1/fine_tuning/jobs/{job['id']}/events?limit=100", headers=dev).json()["data"]
    steps = [event["data"] for event in events if event["type"] == "metrics"]
    samples = [sample for step in steps for sample in step["samples"]]
    assert len(steps) == 2 and samples, events
    for sample in samples:
        assert sample["reward"] == (1.0 if sample["reference"] in sample["text"] else 0.0), sample


def play(server: EnvironmentServer, task: int, turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start task `task` and send `turns`; every observation, the first included."""
    started = server.call({"type": "environment.start", "task": task})
    assert started.status_code == 200, started.text
    observations = [started.json()]
    for turn in turns:
        step = {"type": "environment.step", "episode": observations[0]["episode"], "message": turn}
        answer = server.call(step)
        assert answer.status_code == 200, answer.text
        observations.append(answer.json())
    return observations


def test_a_tool_environments_tools_answer_the_models_calls_and_its_rubric_rewards_the_end(
    start_environment_server: Callable[..., EnvironmentServer],
) -> None:
    server = start_environment_server(TOOL_ENVIRONMENT, module="inventory_environment")
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "inventory_stock", "arguments": '{"item": "apple"}'},
    }
    first, looked_up, ended = play(
        server, 0, [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "assistant", "content": "12."}]
    )
    assert [tool["function"]["name"] for tool in first["tools"]] == ["inventory_stock"]
    assert looked_up["done"] is False
    assert [(m["role"], m["content"], m.get("tool_call_id")) for m in looked_up["messages"]] == [
        ("tool", "12", "call_1")
    ]
    assert ended["done"] is True and ended["reward"] == 1.0 and ended["rewards"] == {"correct": 1.0}


def test_a_multi_turn_environment_answers_each_turn_as_the_user_until_it_ends(
    start_environment_server: Callable[..., EnvironmentServer],
) -> None:
    server = start_environment_server(GUESSING_ENVIRONMENT, module="guessing_environment")
    guesses = [{"role": "assistant", "content": f"My guess: {guess}"} for guess in (50, 25, 37)]
    observations = play(server, 0, guesses)  # the secret of task 0 is 37
    assert [m["content"] for o in observations[1:-1] for m in o["messages"]] == ["Lower.", "Higher."]
    assert observations[-1] | {"episode": None} == {
        "episode": None,
        "messages": [],
        "done": True,
        "reward": 1.0,
        "rewards": {"solved": 1.0},
        "metrics": {"guesses": 3.0},
        "errors": [],
    }
    # Four guesses without the secret (5): the rubric pays nothing.
    missed = play(server, 1, [{"role": "assistant", "content": f"{guess}"} for guess in (50, 25, 12, 6)])
    assert missed[-1]["done"] is True and missed[-1]["rewards"] == {"solved": 0.0}

"""Remote environments: what Mint does with an environment server's answers, and with its
failures, on the eval runner's path (the episodes of `tests/integrations/test_verifiers_on_mint.py`
come from a real `mint env-server`; here a small signed server on 127.0.0.1 answers as each
path says, so that every failure can be made on purpose).

An episode is played turn by turn (the model's turns, with tool calls sent in OpenAI's form);
the environment's reward is the `environment` grader's score, with each named reward in the
detail; a server that times out, answers 5xx, answers what is not an observation, or answers
too much is an error on that task's trajectory, and the other tasks are graded as usual; an
episode the runner stops before the server ends it is closed; an unknown server is a 400 when
a run or a job names it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mint.config import Settings
from mint.evals.benchmark import BenchmarkTask
from mint.evals.runner import GenerateRequest, Generation, run_batch
from mint.schemas.remote_environments import MAX_OBSERVATION_BYTES
from mint.services.evals.remote_environments import acting_for
from tests.conftest import Tenant
from tests.evals.test_evals_api import create_benchmark, jsonl
from tests.test_remote_grader import RewardServer, signed_server


def _observation(mode: str, body: dict[str, Any]) -> tuple[int, bytes]:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    if body["type"] == "environment.start":
        if mode == "broken":
            return 500, b"the environment raised"
        first = {"episode": f"ep-{mode}", "messages": [{"role": "user", "content": "Look up item 7."}], "tools": tools}
        return 200, json.dumps(first).encode()
    if body["type"] == "environment.close":
        return 200, b'{"closed": true}'
    answers: dict[str, tuple[int, bytes]] = {
        "garbage": (200, b"<html>not an observation</html>"),
        "huge": (
            200,
            b'{"episode": "x", "messages": [{"role": "tool", "content": "' + b"x" * MAX_OBSERVATION_BYTES + b'"}]}',
        ),
        "endless": (
            200,
            json.dumps({"episode": "ep-endless", "messages": [{"role": "user", "content": "More."}]}).encode(),
        ),
    }
    if mode in answers:
        return answers[mode]
    if body["message"].get("tool_calls"):  # "ok": the tool's result, then the end
        return 200, json.dumps({"episode": "ep-ok", "messages": [{"role": "tool", "content": "7 in stock"}]}).encode()
    ended = {"episode": "ep-ok", "done": True, "reward": 0.75, "rewards": {"found": 0.5, "brief": 0.25}}
    return 200, json.dumps(ended).encode()


@pytest.fixture
def server() -> Iterator[RewardServer]:
    """An environment server on 127.0.0.1 whose path picks how it answers; every request is kept."""
    with signed_server(lambda mode, body, attempt: _observation(mode, body)) as started:
        yield started


def register(client: TestClient, tenant: Tenant, server: RewardServer, modes: Sequence[str]) -> None:
    """One endpoint per mode, named as the mode; the server checks each one's signatures."""
    for mode in modes:
        body = {"name": mode, "url": f"{server.base}/{mode}"}
        created = client.post("/v1/reward_endpoints", headers=tenant.headers("developer"), json=body)
        assert created.status_code == 201, created.text
        server.secrets_by_mode[mode] = created.json()["secret"]


def task(mode: str, **config: Any) -> BenchmarkTask:
    return BenchmarkTask.model_validate(
        {
            "id": mode,
            "messages": [{"role": "user", "content": "(played by the environment)"}],
            "environment": {"name": "remote", "config": {"endpoint": mode, "task": 0, **config}},
            "grader": {"type": "environment", "config": {"pass_threshold": 0.5}},
        }
    )


def calling_model(requests: Sequence[GenerateRequest]) -> list[Generation]:
    """The model under test: calls `lookup` while it is offered and no result came back, then answers."""
    out = []
    for request in requests:
        answered = any(message["role"] == "tool" for message in request.messages)
        text = "It has 7." if answered or not request.tools else '{"name": "lookup", "arguments": {"item": 7}}'
        out.append(Generation(text=text, tokens_in=10, tokens_out=5, latency_ms=1.0))
    return out


def test_an_episode_is_played_turn_by_turn_and_failures_stay_on_their_trajectories(
    client: TestClient, prepared: Settings, tenant: Tenant, server: RewardServer
) -> None:
    modes = ["ok", "broken", "garbage", "huge", "endless"]
    register(client, tenant, server, modes)
    tasks = [task(mode, retries=0, timeout_s=10) for mode in modes]
    records = {
        record.task_id: record
        for record in run_batch(tasks, calling_model, max_steps=3, act_in=acting_for(prepared, tenant.organization_id))
    }

    ok = records["ok"]
    assert ok.error is None and ok.score == 0.75 and ok.passed and ok.steps == 2
    assert ok.grade is not None and ok.grade["detail"] == "environment server 'ok': reward 0.75; brief 0.25, found 0.5"
    # The environment's conversation, the model's turns and the tool's result in order.
    assert [m["role"] for m in ok.messages] == ["user", "assistant", "tool", "assistant"] and ok.prompt_length == 1
    start, call, answer = server.of("ok")
    assert start == {"type": "environment.start", "task": 0}
    # A call the model wrote as text reaches the environment as OpenAI's structured tool call.
    assert call["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"item": 7}'}}
    ]
    assert answer["message"] == {"role": "assistant", "content": "It has 7."}

    broken = records["broken"]
    assert broken.score == 0.0 and broken.error is not None
    assert broken.error.startswith("the environment could not start: environment server 'broken': the endpoint")
    assert "HTTP 500: 'the environment raised'" in broken.error
    assert records["garbage"].error == (
        "the environment failed: environment server 'garbage': malformed answer: body: Invalid JSON: expected value "
        "at line 1 column 1: '<html>not an observation</html>'"
    )
    assert records["huge"].error is not None and "oversized answer" in records["huge"].error
    # An episode the model ran out of steps in is closed on the server, and says so.
    endless = records["endless"]
    assert endless.error == "stopped after 3 steps before the environment ended the episode"
    assert server.of("endless")[-1] == {"type": "environment.close", "episode": "ep-endless"}


def test_runs_and_jobs_naming_an_unknown_environment_server_are_refused(
    client: TestClient, tenant: Tenant, server: RewardServer
) -> None:
    dev = tenant.headers("developer")
    tasks = [{"id": "t", "messages": [{"role": "user", "content": "x"}], "environment": task("nowhere").environment}]
    content = jsonl([{**row, "environment": row["environment"].model_dump()} for row in tasks])
    benchmark = create_benchmark(client, tenant, format="jsonl", content=content, grader={"type": "environment"})
    assert benchmark.status_code == 201, benchmark.text
    run = client.post(
        "/v1/evals", headers=dev, json={"benchmark_id": benchmark.json()["id"], "model": "tiny-qwen3-moe"}
    )
    assert run.status_code == 400 and run.json()["error"]["param"] == "benchmark_id", run.text
    assert "a task's remote environment names endpoint 'nowhere'" in run.json()["error"]["message"]

    rows = [
        {
            "messages": [{"role": "user", "content": "x"}],
            "environment": {"name": "remote", "config": {"endpoint": "nowhere", "task": 0}},
        }
    ]
    uploaded = client.post(
        "/v1/datasets", headers=dev, files={"file": ("rows.jsonl", jsonl(rows), "application/jsonl")}
    )
    assert uploaded.status_code == 201, uploaded.text
    method = {
        "type": "reinforcement",
        "reinforcement": {"environment": {"name": "remote", "config": {"endpoint": "nowhere"}}},
    }
    job = client.post(
        "/v1/fine_tuning/jobs",
        headers=dev,
        json={"model": "tiny-qwen3-moe", "training_file": uploaded.json()["id"], "method": method},
    )
    assert job.status_code == 400 and job.json()["error"]["param"] == "method.reinforcement.environment", job.text

    # A benchmark task names the server's task.
    untasked = {**tasks[0], "environment": {"name": "remote", "config": {"endpoint": "nowhere"}}}
    refused = create_benchmark(
        client, tenant, format="jsonl", content=jsonl([untasked]), grader={"type": "environment"}
    )
    assert refused.status_code == 400 and "environment.config.task: required" in refused.text, refused.text

    # A remote environment's config is checked where it is written.
    bad = client.post(
        "/v1/datasets",
        headers=dev,
        files={
            "file": (
                "bad.jsonl",
                jsonl([{**rows[0], "environment": {"name": "remote", "config": {"task": -1}}}]),
                "application/jsonl",
            )
        },
    )
    assert bad.status_code == 400 and "environment.config.endpoint" in bad.json()["error"]["message"], bad.text

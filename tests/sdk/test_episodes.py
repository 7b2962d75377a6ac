"""Episodes and online RL through the SDK and the CLI, against the API on a real socket: a
deployment's capture turned to record tokens, its episodes listed (filtered, paged), read turn by
turn, rewarded (a viewer's key too, per-turn scores checked against the turns), and an online
RL job started on it and cancelled.

No serving node runs here: each turn is written as the API writes it, an `EpisodeTurnRecord`
through the capture writer (`tests.conftest.record_episode_turn`); tests/serving/test_episodes.py
records real traffic and trains on it. The jobs are on `tiny-qwen3-moe`, a base no worker of this
package serves, and are cancelled while queued.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from mint.config import Settings
from mint.schemas.fine_tuning import OnlineRlHyperparameters
from mint.sdk import AsyncMint, BadRequestError, ConflictError, Mint, NotFoundError
from tests.conftest import LiveServer, Tenant, record_episode_turn, register_versions

pytestmark = [pytest.mark.integration, pytest.mark.client_surface]

BASE = "tiny-qwen3-moe"  # no worker of this package serves it: a job created here stays queued
ASK = {"role": "user", "content": "Where is my order A1?"}
LOOKUP = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'}
ANSWER = "Order A1 is shipped."

Cli = Callable[..., subprocess.CompletedProcess[str]]


def deployed(sdk: Mint, settings: Settings, tenant: Tenant, name: str, *, tokens: bool) -> tuple[str, str]:
    """A deployment `name` of a registered version (of BASE), capturing with or without tokens;
    its id and the version it serves."""
    (ref,) = register_versions(settings, tenant, f"{name}-bot", 1, base=BASE)
    created = sdk.deployments.create(name, model=ref)
    assert created.capture is not None and created.capture.tokens is False
    sdk.deployments.set_capture(name, rate=1.0, tokens=tokens)
    return created.id, ref


def order_episodes(tenant: Tenant, deployment_id: str, ref: str, prefix: str) -> list[str]:
    """Three episodes, oldest first: a two-turn one (a tool call, then the answer) and a one-turn
    one of task `order`, and a one-turn one of task `other` whose key has a colon."""
    keys = [f"{prefix}-1", f"{prefix}-2", f"{prefix}:3"]
    record_episode_turn(
        tenant, deployment_id, episode=keys[0], task="order", messages=[ASK], answer=LOOKUP, model_ref=ref
    )
    record_episode_turn(
        tenant,
        deployment_id,
        episode=keys[0],
        task="order",
        messages=[ASK, LOOKUP, RESULT],
        answer=ANSWER,
        model_ref=ref,
        token_ids=[21, 22],
        logprobs=[-0.25, -1.5],
    )
    record_episode_turn(tenant, deployment_id, episode=keys[1], task="order", messages=[ASK], answer="Shipped.")
    record_episode_turn(tenant, deployment_id, episode=keys[2], task="other", messages=[ASK], answer="No idea.")
    return keys


def test_episodes_are_listed_read_turn_by_turn_and_rewarded_through_the_sdk(
    live_server: LiveServer, prepared: Settings, tenant: Tenant
) -> None:
    with Mint(live_server.url, tenant.keys["developer"]) as sdk:
        deployment_id, ref = deployed(sdk, prepared, tenant, "agent-prod", tokens=True)
        capture = sdk.deployments.get("agent-prod").capture
        assert capture is not None and (capture.rate, capture.tokens) == (1.0, True)
        # An option left out is unchanged: turning tokens off keeps the rate, and back on.
        off = sdk.deployments.set_capture(deployment_id, tokens=False).capture
        assert off is not None and (off.rate, off.tokens) == (1.0, False)
        back = sdk.deployments.set_capture("agent-prod", tokens=True).capture
        assert back is not None and (back.rate, back.tokens) == (1.0, True)

        first, second, third = order_episodes(tenant, deployment_id, ref, "ep")
        assert [e.id for e in sdk.episodes.list("agent-prod")] == [third, second, first]  # newest first
        assert [e.id for e in sdk.episodes.list(deployment_id, limit=1)] == [third, second, first]  # paged
        assert [e.id for e in sdk.episodes.list("agent-prod", task="order")] == [second, first]
        listed = sdk.episodes.list("agent-prod", task="order").first_page().data[-1]
        assert listed.turns is None and listed.steps == 2 and listed.status == "open"

        read = sdk.episodes.get(first)
        assert (read.task, read.steps, read.models, read.deployment_id) == ("order", 2, [ref], deployment_id)
        assert read.tokens_out == 3 + 2 and read.reward is None
        assert read.turns is not None
        one, two = read.turns
        assert one.added_messages == [ASK] and one.message == LOOKUP and one.finish_reason == "tool_calls"
        assert two.added_messages == [RESULT] and two.message == {"role": "assistant", "content": ANSWER}
        assert (two.token_ids, two.logprobs, two.model) == ([21, 22], [-0.25, -1.5], ref)
        assert read.messages == [ASK, LOOKUP, RESULT, {"role": "assistant", "content": ANSWER}]
        assert sdk.episodes.get(third).task == "other"  # a key with a colon

        with pytest.raises(NotFoundError, match="tokens"):
            sdk.episodes.get("never-recorded")
        with pytest.raises(BadRequestError) as wrong:
            sdk.episodes.reward(first, 1.0, turn_scores=[1.0])
        assert wrong.value.param == "turn_scores"

    # Any key of the organization rewards, a viewer's too; a later reward replaces the last.
    with Mint(live_server.url, tenant.keys["viewer"]) as viewer:
        given = viewer.episodes.reward(first, 0.5, turn_scores=[0.0, 1.0], label="partial", comment="a nudge")
        assert (given.status, given.reward, given.turn_scores, given.label) == ("rewarded", 0.5, [0.0, 1.0], "partial")
        assert given.rewarded_by and given.comment == "a nudge"
        assert viewer.episodes.reward(third, -1.0).reward == -1.0
        assert [e.id for e in viewer.episodes.list("agent-prod", rewarded=True)] == [third, first]
        assert [e.id for e in viewer.episodes.list("agent-prod", rewarded=False)] == [second]
        # Or a grader of the registry gives it, from the episode's last answer and a reference.
        graded = viewer.episodes.reward(second, grader="exact", reference="Shipped.")
        assert graded.reward == 1.0 and "exact" in (graded.rewarded_by or "")
        with pytest.raises(BadRequestError):
            viewer.episodes.reward(second)  # neither a score nor a grader: refused before it is sent

    async def the_async_twin() -> None:
        async with AsyncMint(live_server.url, tenant.keys["viewer"]) as client:
            assert [e.id async for e in client.episodes.list("agent-prod", limit=2)] == [third, second, first]
            assert [e.id for e in await client.episodes.list("agent-prod", task="other").to_list()] == [third]
            read = await client.episodes.get(first)
            assert read.turns is not None and len(read.turns) == 2 and read.reward == 0.5
            again = await client.episodes.reward(first, 1.0, label="solved")
            assert (again.reward, again.turn_scores, again.label) == (1.0, None, "solved")
            with pytest.raises(NotFoundError):
                await client.episodes.get("never-recorded")

    asyncio.run(the_async_twin())


def test_an_online_rl_job_starts_on_a_deployment_that_records_tokens(
    live_server: LiveServer, prepared: Settings, tenant: Tenant
) -> None:
    with Mint(live_server.url, tenant.keys["developer"]) as sdk:
        deployed(sdk, prepared, tenant, "quiet-prod", tokens=False)
        with pytest.raises(ConflictError, match="turn on token capture") as refused:
            sdk.jobs.create_online(BASE, "quiet-prod", steps=2)
        assert refused.value.param == "method.online_rl.deployment"
        with pytest.raises(BadRequestError) as wrong:  # refused before anything is sent
            sdk.jobs.create_online(BASE, "quiet-prod", steps=2, hyperparameters={"group_size": 4})
        assert wrong.value.param == "method.online_rl.hyperparameters.group_size"

        live_id, _ = deployed(sdk, prepared, tenant, "live-prod", tokens=True)
        hyperparameters = OnlineRlHyperparameters(batch_size=2, publish_every=1, max_steps_off_policy=1)
        job = sdk.jobs.create_online(
            BASE, "live-prod", steps=2, serve="register", hyperparameters=hyperparameters, suffix="live-bot"
        )
        try:
            assert job.status in ("validating_files", "queued") and job.training_file is None
            method = job.method
            assert method["type"] == "online_rl" and method["online_rl"]["deployment"] == live_id  # resolved
            assert method["online_rl"]["serve"] == "register"
            assert method["online_rl"]["hyperparameters"]["publish_every"] == 1
            assert job.total_steps == 2
            messages = [event.message for event in job.events()]
            assert any("live episodes of deployment live-prod" in message for message in messages), messages
        finally:
            assert job.cancel().status == "cancelled"

    async def the_async_twin() -> None:
        async with AsyncMint(live_server.url, tenant.keys["developer"]) as client:
            started = await client.jobs.create_online(BASE, "live-prod", steps=1, hyperparameters={"batch_size": 1})
            assert (await started.cancel()).status == "cancelled"
            assert started.method["online_rl"]["hyperparameters"]["batch_size"] == 1

    asyncio.run(the_async_twin())


@pytest.fixture
def cli(live_server: LiveServer, tenant: Tenant) -> Cli:
    """Run `mint ARGS` as the tenant's developer (or the `role` given); fail on a non-zero exit
    unless `code` says which."""

    def run(*args: str, role: str = "developer", code: int = 0) -> subprocess.CompletedProcess[str]:
        environment = {**os.environ, "MINT_BASE_URL": live_server.url, "MINT_API_KEY": tenant.keys[role]}
        environment["COLUMNS"] = "200"
        done = subprocess.run(
            [sys.executable, "-m", "mint", *args],
            capture_output=True,
            text=True,
            env=environment,
            timeout=900,  # a command that never returns fails its test instead of stalling the suite
        )
        assert done.returncode == code, f"mint {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done

    return run


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


def ids(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [row["id"] for row in as_json(done)]


def test_episodes_and_online_rl_from_the_command_line(
    cli: Cli, live_server: LiveServer, prepared: Settings, tenant: Tenant
) -> None:
    (ref,) = register_versions(prepared, tenant, "cli-agent", 1, base=BASE)
    created = as_json(cli("deploy", "cli-agent-prod", "--model", ref, "--json"))
    deployment_id = created["id"]

    # Capture: --tokens turns on the episodes' token ids; a flag left out is unchanged.
    captured = as_json(cli("deployments", "capture", "cli-agent-prod", "--rate", "1", "--json"))
    assert captured["capture"] == {"rate": 1.0, "retention_days": 30, "tokens": False}
    # Without tokens, an online RL job is refused, with the command that turns them on.
    refused = cli(
        "jobs", "create", "--model", BASE, "--method", "online_rl", "--deployment", "cli-agent-prod",
        "--steps", "2", code=5,
    )  # fmt: skip
    assert f"`mint deployments capture {deployment_id} --rate 1 --tokens`" in refused.stderr, refused.stderr
    with_tokens = cli("deployments", "capture", "cli-agent-prod", "--tokens")
    assert "1 for 30 d, tokens" in with_tokens.stdout, with_tokens.stdout
    assert as_json(cli("deployments", "capture", "cli-agent-prod", "--json"))["capture"]["tokens"] is True

    first, second, third = order_episodes(tenant, deployment_id, ref, "cli")
    assert ids(cli("episodes", "list", "cli-agent-prod", "--json")) == [third, second, first]
    assert ids(cli("episodes", "list", deployment_id, "--task", "order", "--json")) == [second, first]
    table = cli("episodes", "list", "cli-agent-prod", "--limit", "2").stdout
    assert third in table and second in table and first not in table and "open" in table

    # One episode, turn by turn: what the harness added, the tool call, the answer, the version.
    shown = cli("episodes", "get", first).stdout
    lines = [line.strip() for line in shown.splitlines()]
    assert "turn 1  " in shown and f"{ref} (revision 1)" in shown, shown
    order = [
        "+ user: Where is my order A1?",
        'assistant calls lookup_order({"order_id": "A1"})',
        '+ tool (call_1): {"status": "shipped"}',
        f"assistant: {ANSWER}",
    ]
    assert [line for line in lines if line in order] == order, shown
    assert "4 prompt + 2 sampled tokens" in shown and "reward: none yet" in shown
    assert "sampled ids [21, 22]" not in shown
    assert "sampled ids [21, 22]" in cli("episodes", "get", first, "--tokens").stdout
    assert as_json(cli("episodes", "get", first, "--json"))["turns"][1]["logprobs"] == [-0.25, -1.5]

    # Rewards: a viewer may give one; per-turn scores are one per turn; a negative score after --.
    given = as_json(
        cli(
            "episodes", "reward", first, "1", "--label", "solved", "--turn-scores", "0,1", "--comment", "good",
            "--json", role="viewer",
        )
    )  # fmt: skip
    assert (given["reward"], given["turn_scores"], given["status"]) == (1.0, [0.0, 1.0], "rewarded")
    assert (given["label"], given["comment"]) == ("solved", "good")
    assert "reward: 1  label solved" in cli("episodes", "get", first).stdout
    assert "turn_scores" in cli("episodes", "reward", first, "1", "--turn-scores", "1", code=6).stderr
    assert "--turn-scores" in cli("episodes", "reward", first, "1", "--turn-scores", "a,b", code=6).stderr
    assert as_json(cli("episodes", "reward", "--json", third, "--", "-1"))["reward"] == -1.0
    assert ids(cli("episodes", "list", "cli-agent-prod", "--rewarded", "--json")) == [third, first]
    assert ids(cli("episodes", "list", "cli-agent-prod", "--open", "--json")) == [second]
    missing = cli("episodes", "get", "never-recorded", code=3)
    assert "`mint deployments capture NAME --rate 1 --tokens`" in missing.stderr, missing.stderr

    # The online RL job: its method object from the flags; a flag for another method is refused.
    assert "--deployment NAME" in cli("jobs", "create", "--model", BASE, "--method", "online_rl", code=6).stderr
    assert (
        "online_rl"
        in cli(
            "jobs", "create", "--model", BASE, "--method", "supervised", "--deployment", "cli-agent-prod", code=6
        ).stderr
    )
    job = as_json(
        cli(
            "jobs", "create", "--model", BASE, "--method", "online_rl", "--deployment", "cli-agent-prod",
            "--steps", "2", "--publish-every", "1", "--serve", "register", "--batch-size", "2",
            "--suffix", f"cli-online-{uuid.uuid4().hex[:6]}", "--json",
        )
    )  # fmt: skip
    try:
        assert job["method"]["type"] == "online_rl" and job["training_file"] is None
        online = job["method"]["online_rl"]
        assert (online["deployment"], online["serve"]) == (deployment_id, "register")
        assert online["hyperparameters"]["publish_every"] == 1 and online["hyperparameters"]["batch_size"] == 2
        assert "live episodes of deployment cli-agent-prod" in cli("jobs", "events", job["id"]).stdout
    finally:
        assert as_json(cli("jobs", "cancel", job["id"], "--json"))["status"] == "cancelled"

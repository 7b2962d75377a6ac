"""Episodes on the serving path, end to end: the official `openai` client marks the turns of an
episode (headers, or the `episode` field through `extra_body`), a deployment whose capture
records tokens keeps each turn token-exact (the prompt ids its node rendered, the sampled ids
and their logprobs, the version that sampled them), the episode reads back as one trajectory,
and a reward given afterwards (a viewer's too) is kept with it.

A real serving node of the tiny base answers; the adapter version is trained here for a few
steps (`tests.serving.test_inference_api`'s helper).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mint.config import PROJECT_ROOT, Settings
from tests.conftest import LiveServer, Tenant, Workers, make_tenant, serving_node, wait_for
from tests.serving.test_inference_api import BASE, QUESTION, _train_version

pytestmark = [pytest.mark.torch, pytest.mark.integration]

HARNESS = PROJECT_ROOT / "examples" / "agent_harness"


@pytest.fixture(scope="module")
def node(prepared: Settings) -> Iterator[subprocess.Popen[bytes]]:
    yield from serving_node(prepared, BASE)


@pytest.fixture(scope="module")
def owner(prepared: Settings) -> Tenant:
    return make_tenant(prepared)


@pytest.fixture(scope="module")
def resident(prepared: Settings) -> Any:
    from mint.config import PROJECT_ROOT
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.session import ResidentBase

    return ResidentBase(get_base_model_spec(BASE, PROJECT_ROOT / "configs" / "models"), prepared.models_cache_dir)


@pytest.fixture(scope="module")
def version(prepared: Settings, owner: Tenant, resident: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _train_version(prepared, owner, resident, tmp_path_factory.mktemp("episode-adapter") / "a", "five")


@pytest.fixture(scope="module")
def api(live_server: LiveServer, owner: Tenant, node: Any) -> httpx.Client:
    return httpx.Client(base_url=live_server.url, headers=owner.headers("developer"), timeout=120)


def test_a_marked_episode_is_recorded_token_exact_and_rewarded_after_the_fact(
    live_server: LiveServer, api: httpx.Client, owner: Tenant, version: str, resident: Any, prepared: Settings
) -> None:
    from openai import OpenAI

    from mint.chat.render import render_prompt

    client = OpenAI(base_url=f"{live_server.url}/v1", api_key=owner.keys["developer"], max_retries=0)
    created = api.post("/v1/deployments", json={"name": "agent-prod", "model": version})
    assert created.status_code == 201, created.text
    deployment = created.json()["id"]
    episode = {"X-Mint-Episode": "ep-1", "X-Mint-Task": "sum"}

    # Capture without tokens records no episode, and the answer says so.
    api.patch(f"/v1/deployments/{deployment}/capture", json={"rate": 1.0}).raise_for_status()
    quiet = client.chat.completions.with_raw_response.create(
        model="agent-prod", messages=QUESTION, max_tokens=4, extra_headers=episode
    )
    assert quiet.headers["X-Mint-Episode-Recorded"] == "false"
    missing = api.get("/v1/episodes/ep-1")
    assert missing.status_code == 404 and "tokens" in missing.json()["error"]["message"]

    patched = api.patch(f"/v1/deployments/{deployment}/capture", json={"tokens": True})
    assert patched.json()["capture"] == {"rate": 1.0, "retention_days": 30, "tokens": True}, patched.text
    first = client.chat.completions.with_raw_response.create(
        model="agent-prod", messages=QUESTION, max_tokens=6, temperature=1.0, seed=3, extra_headers=episode
    )
    assert first.headers["X-Mint-Episode-Recorded"] == "true"
    answer = first.parse().choices[0].message
    # The second turn: the harness sends back the conversation with a user's reply, streamed, and
    # marked through the body instead of the headers.
    conversation = [*QUESTION, {"role": "assistant", "content": answer.content}, {"role": "user", "content": "Sure?"}]
    chunks = list(
        client.chat.completions.create(
            model="agent-prod",
            messages=conversation,
            max_tokens=5,
            stream=True,
            extra_body={"episode": {"id": "ep-1", "task": "sum"}},
        )
    )
    assert chunks

    read = api.get("/v1/episodes/ep-1")
    assert read.status_code == 200, read.text
    recorded = read.json()
    assert recorded["status"] == "open" and recorded["task"] == "sum" and recorded["steps"] == 2
    assert recorded["models"] == [version]
    first_turn, second_turn = recorded["turns"]
    assert first_turn["id"] == first.parse().id
    tokenizer = resident.tokenizer
    assert first_turn["prompt_token_ids"] == render_prompt(tokenizer, QUESTION, None)  # as the engine rendered it
    assert second_turn["prompt_token_ids"] == render_prompt(tokenizer, conversation, None)
    for turn in (first_turn, second_turn):
        assert len(turn["token_ids"]) == len(turn["logprobs"]) > 0
        assert all(logprob <= 0 for logprob in turn["logprobs"])
        assert turn["model"] == version
    assert second_turn["added_messages"] == [{"role": "user", "content": "Sure?"}]
    assert recorded["messages"][: len(conversation)] == conversation
    assert recorded["tokens_out"] == len(first_turn["token_ids"]) + len(second_turn["token_ids"])

    # A reward after the fact: per-turn scores must match the turns; a viewer may give it.
    viewer = {"Authorization": f"Bearer {owner.keys['viewer']}"}
    wrong = api.post("/v1/episodes/ep-1/reward", json={"score": 1.0, "turn_scores": [1.0]}, headers=viewer)
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "turn_scores"
    given = api.post(
        "/v1/episodes/ep-1/reward",
        json={"score": 0.5, "turn_scores": [0.0, 1.0], "label": "partial", "comment": "needed a nudge"},
        headers=viewer,
    )
    assert given.status_code == 200, given.text
    assert given.json()["status"] == "rewarded" and given.json()["rewarded_by"]
    listed = api.get("/v1/episodes", params={"deployment": "agent-prod", "rewarded": True}).json()["data"]
    assert [row["id"] for row in listed] == ["ep-1"] and listed[0]["reward"] == 0.5
    # Another organization's key finds neither the deployment's episodes nor the episode.
    stranger = {"Authorization": f"Bearer {make_tenant(prepared).keys['developer']}"}
    assert api.get("/v1/episodes", params={"deployment": "agent-prod"}, headers=stranger).status_code == 404
    assert api.get("/v1/episodes/ep-1", headers=stranger).status_code == 404
    assert api.post("/v1/episodes/ep-1/reward", json={"score": 1.0}, headers=stranger).status_code == 404

    # Or a grader of the registry computes it, on the episode's added messages (the last answer
    # for a text grader), against a reference; a judge asks the model its config names.
    last = second_turn["message"]["content"]
    right = api.post("/v1/episodes/ep-1/reward", json={"grader": {"type": "exact"}, "reference": last})
    assert right.status_code == 200 and right.json()["reward"] == 1.0, right.text
    assert "exact grader" in right.json()["rewarded_by"]
    wrong_answer = api.post("/v1/episodes/ep-1/reward", json={"grader": {"type": "exact"}, "reference": "seven"})
    assert wrong_answer.json()["reward"] == 0.0 and wrong_answer.json()["comment"]
    judged = api.post(
        "/v1/episodes/ep-1/reward",
        json={"grader": {"type": "judge", "config": {"rubric": "Is it five?", "model": version}}, "reference": "five"},
    )
    assert judged.status_code == 200, judged.text
    assert 0.0 <= judged.json()["reward"] <= 1.0 and "judge grader" in judged.json()["rewarded_by"]
    both = api.post("/v1/episodes/ep-1/reward", json={"score": 1.0, "grader": {"type": "exact"}})
    assert both.status_code in (400, 422), both.text

    # A malformed key, and two names for one request, are refused before anything is served.
    bad = api.post(
        "/v1/chat/completions",
        json={"model": "agent-prod", "messages": QUESTION, "max_tokens": 2},
        headers={"X-Mint-Episode": "no spaces allowed"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Mint-Episode"
    two = api.post(
        "/v1/chat/completions",
        json={"model": "agent-prod", "messages": QUESTION, "max_tokens": 2, "episode": {"id": "ep-2"}},
        headers={"X-Mint-Episode": "ep-3"},
    )
    assert two.status_code == 400 and two.json()["error"]["param"] == "episode"
    several = api.post(
        "/v1/chat/completions",
        json={"model": "agent-prod", "messages": QUESTION, "max_tokens": 2, "n": 2},
        headers={"X-Mint-Episode": "ep-4"},
    )
    assert several.status_code == 400 and several.json()["error"]["param"] == "n"


@pytest.mark.long_run
def test_an_online_rl_job_trains_from_live_episodes_and_the_deployment_serves_its_versions_while_traffic_runs(
    live_server: LiveServer, api: httpx.Client, owner: Tenant, version: str, workers: Workers
) -> None:
    """The loop where the agent runs: traffic (single-turn episodes rewarded by whether the answer
    says "five", and the example harness's multi-turn tool episodes beside them) flows through a
    deployment while an online RL job trains from its rewarded episodes, publishes a version each
    step and the deployment serves it at once. No request fails across the switches, later turns
    name the new versions, and the job reports its signal and what it left out."""
    import sys
    import threading

    from openai import OpenAI

    sys.path.insert(0, str(HARNESS))
    import agent as harness  # noqa: PLC0415
    import tasks as order_desk  # noqa: PLC0415

    created = api.post("/v1/deployments", json={"name": "agent-online", "model": version})
    assert created.status_code == 201, created.text
    deployment = created.json()["id"]
    api.patch(f"/v1/deployments/{deployment}/capture", json={"rate": 1.0, "tokens": True}).raise_for_status()
    job = api.post(
        "/v1/fine_tuning/jobs",
        json={
            "model": BASE,
            "steps": 3,
            "learning_rate": 2e-3,
            "method": {
                "type": "online_rl",
                "online_rl": {
                    "deployment": "agent-online",
                    "hyperparameters": {"batch_size": 4, "publish_every": 1, "max_steps_off_policy": 1},
                },
            },
        },
    )
    assert job.status_code == 200, job.text
    job_id = job.json()["id"]
    assert job.json()["training_file"] is None
    workers.start("online")

    client = OpenAI(base_url=f"{live_server.url}/v1", api_key=owner.keys["developer"], max_retries=0)
    stop = threading.Event()
    failures: list[str] = []
    served: list[str] = []

    def traffic() -> None:
        number = 0
        while not stop.is_set():
            key = f"sum-{number}"
            number += 1
            try:
                reply = client.chat.completions.with_raw_response.create(
                    model="agent-online",
                    messages=QUESTION,
                    max_tokens=6,
                    temperature=1.0,
                    seed=number,
                    extra_headers={"X-Mint-Episode": key, "X-Mint-Task": "sum"},
                )
                served.append(reply.headers["X-Mint-Adapter"])
                text = reply.parse().choices[0].message.content or ""
                rewarded = api.post(f"/v1/episodes/{key}/reward", json={"score": float("five" in text)})
                rewarded.raise_for_status()
            except Exception as exc:  # noqa: BLE001 - every failure is a finding
                failures.append(f"{key}: {exc}")

    def harness_traffic() -> None:
        while not stop.is_set():
            summary = harness.run(client, "agent-online", order_desk.load_split("train")[:2], 2, max_tokens=16)
            failures.extend(summary.errors)

    threads = [threading.Thread(target=traffic), threading.Thread(target=harness_traffic)]
    for thread in threads:
        thread.start()
    try:
        finished = wait_for(
            lambda: (
                (row := api.get(f"/v1/fine_tuning/jobs/{job_id}").json())["status"]
                in ("succeeded", "failed", "cancelled")
                and row
            ),
            "the online RL job to finish",
            timeout=600,
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    assert finished["status"] == "succeeded", finished
    assert failures == []

    events = api.get(f"/v1/fine_tuning/jobs/{job_id}/events", params={"limit": 100}).json()["data"]
    published = [event["data"]["model"] for event in events if event.get("data", {}).get("served")]
    assert len(published) == 2  # steps 1 and 2; step 3's version is the job's result, served at its end
    metrics = [event["data"] for event in events if event.get("type") == "metrics"]
    assert len(metrics) == 3
    for step in metrics:
        assert step["episodes"] >= 1 and "episodes_stale" in step and "episodes_unrewarded" in step
        assert "reward" in step and "groups_with_signal" in step
    result = finished["fine_tuned_model"]
    history = api.get(f"/v1/deployments/{deployment}").json()
    assert history["serving"]["routing"]["model"] == result, history
    assert history["current_revision"] == 4  # created, then two versions along the way and the result
    # Later turns name the versions the deployment switched to.
    later = api.get("/v1/episodes", params={"deployment": "agent-online", "limit": 100}).json()["data"]
    models = {model for episode in later for model in episode["models"]}
    assert version in models and models & set(published), (models, published)
    assert set(served) >= {version}

"""The `remote` grader and reward endpoints, end to end: a real HTTP reward server on 127.0.0.1
verifies every request's Standard Webhooks signature with the `standardwebhooks` library, as a
team's `mint reward-server` would, and answers by the path it was called on.

Endpoints are managed over REST (developers write, viewers read, the secret is shown once); an
eval run of a small benchmark on the tiny base records the rewards the server computed; every
way a server can fail (timeout, 5xx, 429, malformed JSON, the wrong count, NaN, an oversized
answer, a refusing 4xx) is a grade of 0 whose detail names it; a 500 then a 200 is retried; an
unknown endpoint is a 400 when a run, a job or an episode reward names it; an RL job's grader
sends each prompt row's fields.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from standardwebhooks.webhooks import Webhook as Verifier

from mint.config import Settings
from mint.evals.graders import GradeContext, GraderSpec, grade
from mint.schemas.reward_endpoints import MAX_REWARD_ANSWER_BYTES
from mint.sdk import BadRequestError, Mint
from mint.services.evals.remote_rewards import RemoteRewards, graders_for
from mint.storage.db import session_scope
from tests.conftest import LiveServer, Tenant
from tests.evals.test_evals_api import BASE, create_benchmark, jsonl, resident, run_in_this_process  # noqa: F401
from tests.jobs.conftest import prompt_rows, upload
from tests.test_cli import mint


@dataclass
class RewardServer:
    """A reward server on 127.0.0.1: `/<mode>` answers as the mode says; every request is kept
    with its verified body. `release` lets a `/slow` request answer (after the test is done with it)."""

    base: str
    secrets_by_mode: dict[str, str] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, mode: str) -> list[dict[str, Any]]:
        with self.lock:
            return [body for path, body, _ in self.requests if path == mode]


def reward_of(item: dict[str, Any]) -> float:
    """What the server computes for an item: a quarter per reference character, plus a tenth if answered."""
    return min(1.0, 0.25 * len(str(item["reference"])) + (0.1 if item["completion_text"] else 0.0))


def _answer(mode: str, items: list[dict[str, Any]], attempt: int) -> tuple[int, bytes]:
    rewards = [reward_of(item) for item in items]
    details = [f"{len(item['completion_text'])} chars" for item in items]
    ok = json.dumps({"rewards": rewards, "details": details}).encode()
    answers: dict[str, tuple[int, bytes]] = {
        "ok": (200, ok),
        "flaky": (500, b"warming up") if attempt == 1 else (200, ok),
        "broken": (500, b"the reward function raised"),
        "busy": (429, b"slow down"),
        "refusing": (403, b"forbidden"),
        "garbage": (200, b"<html>not json</html>"),
        "count": (200, json.dumps({"rewards": rewards * 2}).encode()),
        "nan": (200, b'{"rewards": [NaN]}'),
        "huge": (200, b'{"rewards": [1.0], "details": ["' + b"x" * (MAX_REWARD_ANSWER_BYTES + 10) + b'"]}'),
        "negative": (200, json.dumps({"rewards": [-2.5]}).encode()),
    }
    return answers[mode]


# answer(mode, verified body, attempt of that mode) -> (HTTP status, body)
Answer = Callable[[str, dict[str, Any], int], tuple[int, bytes]]


@contextlib.contextmanager
def signed_server(answer: Answer) -> Iterator[RewardServer]:
    """A server on 127.0.0.1 that verifies each request's signature with its mode's secret (the
    path is the mode), keeps it, and answers what `answer` says; `/slow` waits for `release`."""
    box: list[RewardServer] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            target = box[0]
            mode = self.path.strip("/")
            raw = self.rfile.read(int(self.headers["content-length"]))
            headers = {k.lower(): v for k, v in self.headers.items()}
            body = dict(Verifier(target.secrets_by_mode[mode]).verify(raw, headers))  # raises if not signed
            with target.lock:
                target.requests.append((mode, body, headers))
                target.calls[mode] = attempt = target.calls.get(mode, 0) + 1
            if mode == "slow":
                target.release.wait()
                status, reply = 200, b'{"rewards": [1.0]}'
            else:
                status, reply = answer(mode, body, attempt)
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            with contextlib.suppress(OSError):  # Mint stopped reading (an oversized answer, a timeout)
                self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box.append(RewardServer(base=f"http://127.0.0.1:{http.server_address[1]}"))
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield box[0]
    finally:
        box[0].release.set()
        http.shutdown()
        thread.join(timeout=10)


@pytest.fixture
def server() -> Iterator[RewardServer]:
    with signed_server(lambda mode, body, attempt: _answer(mode, body["items"], attempt)) as started:
        yield started


def add_endpoint(client: TestClient, tenant: Tenant, server: RewardServer, mode: str, role: str = "developer") -> Any:
    name = f"{mode}-{secrets.token_hex(3)}"
    body = {"name": name, "url": f"{server.base}/{mode}", "description": f"answers {mode}"}
    response = client.post("/v1/reward_endpoints", headers=tenant.headers(role), json=body)
    if response.status_code == 201:
        server.secrets_by_mode[mode] = response.json()["secret"]
    return response


def remote(endpoint: str, **config: Any) -> dict[str, Any]:
    return {"type": "remote", "config": {"endpoint": endpoint, **config}}


# ---- the registry over REST ------------------------------------------------------------------


def test_endpoints_belong_to_one_organization_viewers_only_read_and_the_secret_is_shown_once(
    client: TestClient, tenant: Tenant, other_tenant: Tenant, server: RewardServer
) -> None:
    assert add_endpoint(client, tenant, server, "ok", role="viewer").status_code == 403
    created = add_endpoint(client, tenant, server, "ok")
    assert created.status_code == 201, created.text
    endpoint = created.json()
    assert endpoint["object"] == "reward_endpoint" and endpoint["secret"].startswith("whsec_")
    assert endpoint["id"].startswith("rwe_") and endpoint["description"] == "answers ok"
    viewer = tenant.headers("viewer")
    for ref in (endpoint["id"], endpoint["name"]):
        read = client.get(f"/v1/reward_endpoints/{ref}", headers=viewer)
        assert read.status_code == 200 and "secret" not in read.json()
    listed = client.get("/v1/reward_endpoints", headers=viewer).json()["data"]
    assert [row["id"] for row in listed] == [endpoint["id"]] and "secret" not in listed[0]
    assert client.get(f"/v1/reward_endpoints/{endpoint['id']}", headers=other_tenant.headers()).status_code == 404

    again = client.post(
        "/v1/reward_endpoints", headers=tenant.headers("developer"), json={"name": endpoint["name"], "url": server.base}
    )
    assert again.status_code == 409 and again.json()["error"]["param"] == "name"

    path = f"/v1/reward_endpoints/{endpoint['id']}"
    assert client.patch(path, headers=viewer, json={"description": "no"}).status_code == 403
    changed = client.patch(path, headers=tenant.headers("developer"), json={"description": "the math verifier"})
    assert changed.status_code == 200 and changed.json()["description"] == "the math verifier"
    assert changed.json()["url"] == endpoint["url"]
    rotated = client.post(f"{path}/rotate_secret", headers=tenant.headers("developer"))
    assert rotated.status_code == 200 and rotated.json()["secret"] not in (endpoint["secret"], None)
    assert client.delete(path, headers=viewer).status_code == 403
    assert client.delete(path, headers=tenant.headers("developer")).status_code == 200
    assert client.get(path, headers=viewer).status_code == 404

    audit = client.get("/v1/audit_log", headers=tenant.headers("admin")).json()["data"]
    actions = {row["action"] for row in audit if row.get("resource_id") == endpoint["id"]}
    assert actions == {f"reward_endpoint.{a}" for a in ("create", "update", "rotate_secret", "delete")}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "bad name!", "url": "https://rewards.example.com"}, "name"),
        ({"name": "x" * 101, "url": "https://rewards.example.com"}, "name"),
        ({"name": "ok", "url": "ftp://rewards.example.com"}, "url"),
        ({"name": "ok", "url": "https://rewards.example.com", "extra": 1}, "extra"),
        ({"url": "https://rewards.example.com"}, "name"),
    ],
)
def test_bad_endpoints_name_the_field(client: TestClient, tenant: Tenant, body: dict[str, Any], param: str) -> None:
    response = client.post("/v1/reward_endpoints", headers=tenant.headers("developer"), json=body)
    assert response.status_code in (400, 422), response.text
    assert param in (response.json()["error"]["param"] or ""), response.text


def test_private_endpoints_are_refused_unless_the_operator_allows_them(prepared: Settings, tenant: Tenant) -> None:
    from mint.errors import InvalidRequest
    from mint.services.auth import operator
    from mint.services.evals import reward_endpoints

    with session_scope(prepared.database) as db, pytest.raises(InvalidRequest) as refused:
        reward_endpoints.create_endpoint(
            db, operator(tenant.organization_id), name="local", url="http://127.0.0.1:9/x", description=""
        )
    assert "not a public address" in refused.value.message and refused.value.param == "url"


def test_bad_remote_grader_configs_are_refused() -> None:
    from mint.errors import InvalidRequest

    for config, param in [
        ({}, "config.endpoint"),
        ({"endpoint": "x", "timeout_s": 0}, "config.timeout_s"),
        ({"endpoint": "x", "timeout_s": 1000}, "config.timeout_s"),
        ({"endpoint": "x", "retries": 9}, "config.retries"),
        ({"endpoint": "x", "pass_threshold": 2}, "config.pass_threshold"),
    ]:
        with pytest.raises(InvalidRequest) as refused:
            GraderSpec.model_validate({"type": "remote", "config": config})
        assert refused.value.param == param


# ---- grading: the answer and every failure ---------------------------------------------------


def _grade(prepared: Settings, tenant: Tenant, endpoint: str, output: Any = "The answer is 5", **config: Any) -> Any:
    spec = GraderSpec.model_validate(remote(endpoint, **config))
    calls = RemoteRewards(tenant.organization_id, allow_private=True, database=prepared.database)
    context = GradeContext(reward=calls, source="arith").about(
        [{"role": "user", "content": "What is 2 + 3?"}], {"metadata": {"columns": {"level": 1}}}, "add"
    )
    return grade(spec, output, "5", context=context)


def test_a_remote_grade_is_the_servers_reward_for_the_item_it_was_sent(
    client: TestClient, prepared: Settings, tenant: Tenant, server: RewardServer
) -> None:
    endpoint = add_endpoint(client, tenant, server, "ok").json()
    graded = _grade(prepared, tenant, endpoint["name"])
    assert graded.score == pytest.approx(0.35) and not graded.passed
    assert graded.detail == f"reward endpoint {endpoint['name']!r}: reward 0.35: '15 chars'"
    ((body,),) = [server.of("ok")]
    assert body["type"] == "reward.request"
    assert body["items"] == [
        {
            "prompt": [{"role": "user", "content": "What is 2 + 3?"}],
            "completion": [{"role": "assistant", "content": "The answer is 5"}],
            "completion_text": "The answer is 5",
            "reference": "5",
            "data_source": "arith",
            "extra_info": {"task_id": "add"},
            "columns": {"level": 1},
        }
    ]
    # By id too, and a reward outside [0, 1] is clipped, saying so.
    assert _grade(prepared, tenant, endpoint["id"], pass_threshold=0.3).passed
    negative = add_endpoint(client, tenant, server, "negative").json()
    clipped = _grade(prepared, tenant, negative["name"])
    assert clipped.score == 0.0 and "reward -2.5 (clipped to 0" in clipped.detail


def test_a_500_is_retried_with_the_same_request_id(
    client: TestClient, prepared: Settings, tenant: Tenant, server: RewardServer
) -> None:
    endpoint = add_endpoint(client, tenant, server, "flaky").json()
    graded = _grade(prepared, tenant, endpoint["name"])
    assert graded.score == pytest.approx(0.35), graded.detail
    first, second = [headers for path, _, headers in server.requests if path == "flaky"]
    assert first["webhook-id"] == second["webhook-id"]


@pytest.mark.parametrize(
    ("mode", "config", "says", "calls"),
    [
        ("broken", {"retries": 2}, "answered HTTP 500: 'the reward function raised' (after 3 attempts)", 3),
        ("busy", {"retries": 1}, "the endpoint answered HTTP 429: 'slow down' (after 2 attempts)", 2),
        ("refusing", {"retries": 2}, "HTTP 403: 'forbidden' (not retried", 1),
        ("garbage", {}, "malformed answer: not JSON", 1),
        ("count", {}, "wrong count: 2 rewards for 1 item(s)", 1),
        ("nan", {}, "non-finite reward: rewards[0] is nan", 1),
        ("huge", {}, f"oversized answer: more than {MAX_REWARD_ANSWER_BYTES} bytes", 1),
    ],
)
def test_a_failing_endpoint_gives_0_with_a_detail_naming_what_went_wrong(
    client: TestClient,
    prepared: Settings,
    tenant: Tenant,
    server: RewardServer,
    mode: str,
    config: dict[str, Any],
    says: str,
    calls: int,
) -> None:
    endpoint = add_endpoint(client, tenant, server, mode).json()
    graded = _grade(prepared, tenant, endpoint["name"], **config)
    assert graded.score == 0.0 and not graded.passed
    assert graded.detail.startswith(f"reward endpoint {endpoint['name']!r} gave no reward: "), graded.detail
    assert says in graded.detail, graded.detail
    assert server.calls[mode] == calls


def test_a_slow_endpoint_times_out_at_the_graders_deadline(
    client: TestClient, prepared: Settings, tenant: Tenant, server: RewardServer
) -> None:
    endpoint = add_endpoint(client, tenant, server, "slow").json()
    graded = _grade(prepared, tenant, endpoint["name"], timeout_s=0.5)
    server.release.set()
    assert graded.score == 0.0
    assert "gave no reward: timeout: no answer within the timeout_s of 0.5 s" in graded.detail


def test_a_deleted_endpoint_scores_0_saying_so(
    client: TestClient, prepared: Settings, tenant: Tenant, server: RewardServer
) -> None:
    endpoint = add_endpoint(client, tenant, server, "ok").json()
    client.delete(f"/v1/reward_endpoints/{endpoint['id']}", headers=tenant.headers("developer"))
    graded = _grade(prepared, tenant, endpoint["name"])
    assert graded.score == 0.0 and f"has no endpoint {endpoint['name']!r} (deleted?)" in graded.detail


# ---- eval runs, jobs, episodes ---------------------------------------------------------------


@pytest.mark.torch
def test_an_eval_run_records_the_rewards_the_server_computed(
    client: TestClient,
    prepared: Settings,
    tenant: Tenant,
    other_tenant: Tenant,
    server: RewardServer,
    resident: Any,  # noqa: F811 - the fixture
) -> None:

    endpoint = add_endpoint(client, tenant, server, "ok").json()
    rows: list[dict[str, Any]] = [
        {"id": "add", "messages": [{"role": "user", "content": "2 + 3?"}], "reference": "5"},
        {
            "id": "mul",
            "messages": [{"role": "user", "content": "6 * 7?"}],
            "reference": "42",
            "metadata": {"data_source": "openai/gsm8k", "extra_info": {"index": 7}},
        },
    ]
    benchmark = create_benchmark(
        client, tenant, format="jsonl", content=jsonl(rows), grader=remote(endpoint["name"], pass_threshold=0.5)
    )
    assert benchmark.status_code == 201, benchmark.text
    dev = tenant.headers("developer")

    # Another organization's benchmark naming an endpoint it does not have is refused at create.
    theirs = create_benchmark(client, other_tenant, format="jsonl", content=jsonl(rows), grader=remote("ok"))
    their_run = {"benchmark_id": theirs.json()["id"], "model": BASE}
    refused = client.post("/v1/evals", headers=other_tenant.headers("developer"), json=their_run)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "benchmark_id"
    assert (
        "the remote grader names endpoint 'ok', which this organization does not have"
        in refused.json()["error"]["message"]
    )

    run_id = run_in_this_process(prepared, tenant, benchmark.json()["id"], resident)

    trajectories = client.get(f"/v1/evals/{run_id}/trajectories", headers=dev).json()["data"]
    sent = {body["items"][0]["extra_info"]["task_id"]: body["items"][0] for body in server.of("ok")}
    assert sorted(sent) == ["add", "mul"] and len(trajectories) == 2
    for trajectory in trajectories:
        item = sent[trajectory["task_id"]]
        assert item["completion_text"] == trajectory["output"]
        assert trajectory["score"] == pytest.approx(reward_of(item)) and trajectory["error"] is None
        assert trajectory["passed"] == (reward_of(item) >= 0.5)
        assert f"reward {reward_of(item):g}" in trajectory["grade"]["detail"]
    assert sent["add"]["data_source"] == benchmark.json()["name"] and sent["add"]["extra_info"] == {"task_id": "add"}
    assert sent["mul"]["data_source"] == "openai/gsm8k" and sent["mul"]["extra_info"] == {"index": 7, "task_id": "mul"}
    assert sent["mul"]["prompt"] == rows[1]["messages"]


def test_an_rl_job_naming_an_unknown_endpoint_is_refused_and_its_grader_sends_each_row(
    client: TestClient, prepared: Settings, tenant: Tenant, server: RewardServer
) -> None:
    training = upload(client, tenant, prompt_rows())
    method = {"type": "reinforcement", "reinforcement": {"grader": remote("no-such-endpoint")}}
    body = {"model": BASE, "training_file": training["id"], "method": method}
    refused = client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "method.reinforcement.grader"
    assert "'no-such-endpoint'" in refused.json()["error"]["message"]

    # The worker's grader, as the RL recipe uses it: bound to each row, remembering what it explained.
    endpoint = add_endpoint(client, tenant, server, "ok").json()
    grader = graders_for(prepared, tenant.organization_id)(remote(endpoint["name"]))
    row = {
        "messages": [{"role": "user", "content": "Say a"}],
        "reference": "a",
        "data_source": "lighteval/MATH",
        "extra_info": {"split": "train"},
        "columns": {"solution": "a"},
    }
    bound = grader.for_row(row)
    assert bound.reward("a", "a") == pytest.approx(0.35)
    assert bound.explain("a", "a") == f"reward endpoint {endpoint['name']!r}: reward 0.35: '1 chars'"
    (body,) = server.of("ok")  # explaining asked nothing more
    (item,) = body["items"]
    assert item["prompt"] == row["messages"] and item["data_source"] == "lighteval/MATH"
    assert item["extra_info"] == {"split": "train"} and item["columns"] == {"solution": "a"}


def test_an_episode_reward_naming_an_unknown_endpoint_is_a_400(client: TestClient, tenant: Tenant) -> None:
    from tests.test_tenancy import _episode

    key = _episode(client, tenant)
    response = client.post(
        f"/v1/episodes/{key}/reward", headers=tenant.headers("developer"), json={"grader": remote("nowhere")}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "grader"


@pytest.mark.client_surface
def test_the_sdk_and_the_cli_manage_reward_endpoints(live_server: LiveServer, tenant: Tenant) -> None:
    with Mint(live_server.url, tenant.keys["developer"]) as sdk:
        endpoint = sdk.reward_endpoints.create("sdk-verify", "https://rewards.example.com/a", description="ci")
        assert endpoint.secret.startswith("whsec_") and endpoint.name == "sdk-verify"
        assert [e.id for e in sdk.reward_endpoints.list()] == [endpoint.id]
        moved = sdk.reward_endpoints.update("sdk-verify", url="https://rewards.example.com/b")
        assert moved.url == "https://rewards.example.com/b" and moved.description == "ci"
        assert sdk.reward_endpoints.rotate_secret(endpoint.id).secret != endpoint.secret
        with pytest.raises(BadRequestError) as refused:  # checked before sending, with the server's schema
            sdk.reward_endpoints.create("bad name", "https://rewards.example.com")
        assert refused.value.param == "name"

    environment = {**os.environ, "MINT_BASE_URL": live_server.url, "MINT_API_KEY": tenant.keys["developer"]}
    url = "https://rewards.example.com/c"
    created = json.loads(mint("reward-endpoints", "create", "cli-verify", url, "--json", env=environment).stdout)
    assert created["secret"].startswith("whsec_") and created["name"] == "cli-verify"
    listed = json.loads(mint("reward-endpoints", "list", "--json", env=environment).stdout)
    assert [e["name"] for e in listed] == ["cli-verify", "sdk-verify"]
    rotated = json.loads(mint("reward-endpoints", "rotate-secret", "cli-verify", "--json", env=environment).stdout)
    assert rotated["secret"] != created["secret"]
    mint("reward-endpoints", "delete", created["id"], "--json", env=environment)
    listed = json.loads(mint("reward-endpoints", "list", "--json", env=environment).stdout)
    assert [e["name"] for e in listed] == ["sdk-verify"]

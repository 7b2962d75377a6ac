"""A serving node answers only callers with its credential, and clients never learn where nodes are.

The node app runs in this process on the tiny base (its real engine, cache and registration in
the session's database). Every route of the app but the open probes is tried with no token,
wrong ones and the right one, read from the app itself, so a route added later is covered; the
body sent is one the route would refuse (422), so a 401 also shows that it was not read. The
API's side (the credential it presents, the 503 of a node that does not answer) goes through
the API app and the serving_nodes rows as the API reads them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select

from mint.api.node_app import create_node_app
from mint.api.node_guard import OPEN_PATHS
from mint.config import Settings
from mint.services.serving.nodes import node_for, register_node, unregister_node
from mint.serving.hosting import NodeHost
from mint.storage.db import session_scope
from mint.storage.tables import ServingNode
from tests.conftest import Tenant, free_port

pytestmark = [pytest.mark.torch, pytest.mark.integration]

BASE = "tiny-glm-moe"
SHARED_TOKEN = "shared-node-token-of-at-least-32-characters"
COMPLETE = "/internal/v1/complete"
UNKNOWN_SHA = "ab" * 32
ADAPTER = {"ref": "nowhere@1", "sha256": UNKNOWN_SHA, "object_key": "adapters/nowhere/1/adapter.tar"}
# With the right token each route answers from its handler: (body, status). An unknown adapter
# is not in the object store (404) and cannot be unpinned (400); the rest succeed.
AUTHORIZED_CALLS: dict[tuple[str, str], tuple[dict[str, Any] | None, int]] = {
    ("GET", "/internal/v1/cache"): (None, 200),
    ("POST", "/internal/v1/cache/pin"): ({"adapter": ADAPTER}, 404),
    ("POST", "/internal/v1/cache/unpin"): ({"adapter": ADAPTER}, 400),
    ("POST", "/internal/v1/cache/evict"): ({"adapter": ADAPTER}, 200),
    ("POST", "/internal/v1/cache/prefetch"): ({"adapters": []}, 200),
    ("POST", COMPLETE): ({"prompt": "Rivers:", "max_tokens": 2, "temperature": 0.0}, 200),
}


class Recorded(logging.Handler):
    """Every log record of the process, at every level, as text."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record) + repr(record.args))


@dataclass
class RunningNode:
    client: TestClient
    row: ServingNode
    logs: Recorded


def run_node(settings: Settings, url: str) -> Iterator[RunningNode]:
    """The node app of the tiny base, started (engine loaded, registered at `url`), all its logging recorded."""
    logs, root = Recorded(), logging.getLogger()
    previous_level = root.level
    root.addHandler(logs)
    root.setLevel(logging.DEBUG)
    try:
        with TestClient(
            create_node_app(settings, NodeHost(settings, BASE), url), raise_server_exceptions=False
        ) as client:
            with session_scope(settings.database) as session:
                row = session.execute(select(ServingNode).where(ServingNode.url == url)).scalar_one()
                session.expunge(row)
            yield RunningNode(client, row, logs)
    finally:
        root.removeHandler(logs)
        root.setLevel(previous_level)


@pytest.fixture(scope="module")
def node(prepared: Settings) -> Iterator[RunningNode]:
    """A node with no MINT_NODE_TOKEN: it issues its own token and records it in its row."""
    yield from run_node(prepared, "http://node-issued.invalid:8100")


def guarded_calls(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every route of the node app but the open probes."""
    routes = [route for route in app.routes if isinstance(route, APIRoute)]
    return sorted((method, route.path) for route in routes for method in route.methods if route.path not in OPEN_PATHS)


def test_every_route_but_the_probes_refuses_a_missing_or_wrong_token(node: RunningNode) -> None:
    token = node.row.token
    assert token and len(token) >= 32
    calls = guarded_calls(node.client.app)
    assert {("POST", "/internal/v1/complete"), ("POST", "/internal/v1/cache/pin")} <= set(calls)
    refused_headers: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {token[:-1]}"},  # all but its last character
        {"Authorization": f"Bearer {token}x"},
        {"Authorization": f"Basic {token}"},
        {"Authorization": token},
        {"X-API-Key": token},
    ]
    # Paths no route has, and the framework's own pages, are refused too: deny by default.
    for method, path in [*calls, ("GET", "/internal/v1/nope"), ("GET", "/docs"), ("GET", "/openapi.json")]:
        for headers in refused_headers:
            # A body the route would refuse with 422 if it were read: the 401 comes first.
            reply = node.client.request(method, path, headers=headers, content=b'{"not": "this route\'s body"')
            assert reply.status_code == 401, (method, path, headers, reply.text)
            assert reply.json()["error"]["type"] == "authentication_error"
            assert reply.headers["www-authenticate"] == "Bearer"
            assert token not in reply.text


def test_with_its_token_every_route_answers(node: RunningNode) -> None:
    assert set(AUTHORIZED_CALLS) == set(guarded_calls(node.client.app)), "give each node route a call here"
    headers = {"Authorization": f"Bearer {node.row.token}"}
    for (method, path), (body, status) in AUTHORIZED_CALLS.items():
        reply = node.client.request(method, path, headers=headers, json=body)
        assert reply.status_code == status, (method, path, reply.text)
    lines = node.client.post(COMPLETE, headers=headers, json=AUTHORIZED_CALLS[("POST", COMPLETE)][0])
    assert lines.json()[0]["served"]["adapter"] is None and lines.json()[-1]["finish_reason"]


def test_the_probes_are_open_and_say_nothing_about_the_node(node: RunningNode) -> None:
    assert node.client.get("/healthz").json() == {"status": "ok"}
    metrics = node.client.get("/metrics")
    assert metrics.status_code == 200 and "mint_adapter_cache_hits" in metrics.text
    for reply in (node.client.get("/healthz"), metrics):
        assert node.row.token not in reply.text and node.row.url not in reply.text and node.row.id not in reply.text


def test_the_node_never_logs_its_token(node: RunningNode) -> None:
    headers = {"Authorization": f"Bearer {node.row.token}"}
    node.client.post(COMPLETE, headers=headers, json={"prompt": "Hi", "max_tokens": 1})
    node.client.get("/internal/v1/cache", headers={"Authorization": "Bearer wrong"})
    assert node.logs.lines, "the node logged nothing: the recording does not work"
    assert not [line for line in node.logs.lines if node.row.token in line]


def test_a_node_with_the_shared_token_records_none_and_requires_it(prepared: Settings) -> None:
    shared = prepared.model_copy(update={"node_token": SecretStr(SHARED_TOKEN)})
    for running in run_node(shared, "http://node-shared.invalid:8100"):
        assert running.row.token is None
        assert running.client.get("/internal/v1/cache", headers={"Authorization": f"Bearer {SHARED_TOKEN}"}).is_success
        assert running.client.get("/internal/v1/cache", headers={"Authorization": "Bearer other"}).status_code == 401
        # The API presents the shared token to a node that recorded none, and a node's own to one that did.
        with session_scope(prepared.database) as session:
            assert node_for(session, BASE, BASE, SHARED_TOKEN).token == SHARED_TOKEN
            assert node_for(session, BASE, BASE, None).token is None


@pytest.fixture
def unreachable_node(prepared: Settings) -> Iterator[tuple[str, str]]:
    """A registered node of a base that nothing listens for: (its id, its URL)."""
    node_id, url = "smollm2-135m-instruct@gone/1", f"http://127.0.0.1:{free_port()}"
    with session_scope(prepared.database) as session:
        register_node(
            session,
            node_id=node_id,
            base_model="smollm2-135m-instruct",
            url=url,
            hostname="gone",
            pid=1,
            token="issued-by-a-node-that-is-gone-long-ago",
        )
    yield node_id, url
    with session_scope(prepared.database) as session:
        unregister_node(session, node_id)


def test_a_node_that_does_not_answer_is_named_by_id_never_by_url(
    client: TestClient, tenant: Tenant, unreachable_node: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    node_id, url = unreachable_node
    port = url.rsplit(":", 1)[1]
    question = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    with caplog.at_level(logging.WARNING, logger="mint.services.serving.node_client"):
        for stream in (False, True):
            reply = client.post(
                "/v1/chat/completions", headers=tenant.headers("developer"), json={**question, "stream": stream}
            )
            assert reply.status_code == 503, reply.text
            message = reply.json()["error"]["message"]
            assert node_id in message and "did not answer" in message
            assert url not in reply.text and port not in reply.text and "127.0.0.1" not in reply.text
    assert url in caplog.text, "the server's log names the URL the node did not answer at"

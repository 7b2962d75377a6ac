"""Several serving nodes of one base: the API spreads requests over them and moves on from a
dead one without failing a request that another node can answer.

Two real node processes of the tiny base (`mint serve --base tiny-glm-moe`) serve the API on a
real socket (the official `openai` client); one is killed with SIGKILL, and every completion
after it succeeds. The order in which nodes are asked (`serving_nodes.serving_order`) and the
probe that brings a node marked down back (`node_client.NodeTraffic`) are tested on their own.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from sqlalchemy import delete

from mint.config import Settings
from mint.schemas.node import NodeCompletion
from mint.services.serving import node_client
from mint.services.serving.node_client import NodeTraffic, complete_lines, open_stream
from mint.services.serving.nodes import NodeAddress, live_addresses, register_node, serving_order
from mint.storage.db import session_scope
from mint.storage.tables import ServingNode
from tests.conftest import LiveServer, Tenant, free_port, make_tenant, serving_node, wait_for

pytestmark = [pytest.mark.torch, pytest.mark.integration]

BASE = "tiny-glm-moe"
QUESTION = [{"role": "user", "content": "Name a river."}]


# ---- the order in which nodes are asked -----------------------------------------------------


@pytest.mark.backend_free
def test_the_nodes_sharing_an_affinity_take_turns_and_the_least_busy_goes_first() -> None:
    nodes = ["a", "b", "c", "d"]
    ranked = serving_order(nodes, "adapter-sha", share=1)
    assert sorted(ranked) == nodes  # every node is in the order: the others are fallbacks
    # One node per affinity (a mixture): always its first-ranked node, whatever the turn.
    assert {serving_order(nodes, "adapter-sha", share=1, turn=turn)[0] for turn in range(8)} == {ranked[0]}
    # An adapter's two nodes take turns; the base's requests go round all of them.
    assert {serving_order(nodes, "adapter-sha", share=2, turn=turn)[0] for turn in range(8)} == set(ranked[:2])
    assert {serving_order(nodes, "base", share=None, turn=turn)[0] for turn in range(8)} == set(nodes)
    # The least busy of those sharing goes first; the rest follow in rank order.
    busy = {ranked[0]: 3, ranked[1]: 1}
    assert serving_order(nodes, "adapter-sha", share=2, in_flight=busy) == [ranked[1], ranked[0], *ranked[2:]]


@pytest.mark.backend_free
def test_a_node_marked_down_goes_last_and_the_next_takes_its_share() -> None:
    nodes = ["a", "b", "c"]
    ranked = serving_order(nodes, "adapter-sha", share=1)
    order = serving_order(nodes, "adapter-sha", share=1, down={ranked[0]})
    assert order == [ranked[1], ranked[2], ranked[0]]  # still asked, last, when no other answers
    assert serving_order(nodes, "adapter-sha", share=1, down=set(nodes)) == ranked


class _Healthz(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.backend_free
def test_a_node_marked_down_is_asked_as_any_other_once_its_healthz_answers() -> None:
    traffic = NodeTraffic(probe_every_s=0.05)
    port = free_port()
    node = NodeAddress(id=f"{BASE}@gone/1", url=f"http://127.0.0.1:{port}")
    traffic.mark_down(node, ConnectionRefusedError())
    assert traffic.down() == {node.id}
    server = HTTPServer(("127.0.0.1", port), _Healthz)  # the node is back, at the same address
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        wait_for(lambda: not traffic.down(), "the probe to find the node answering again")
    finally:
        server.shutdown()
        server.server_close()


def test_a_node_restarted_at_its_address_replaces_the_row_its_killed_predecessor_left(prepared: Settings) -> None:
    url = f"http://127.0.0.1:{free_port()}"

    def register(node_id: str, hostname: str, pid: int) -> None:
        with session_scope(prepared.database) as session:
            register_node(
                session, node_id=node_id, base_model=BASE, url=url, hostname=hostname, pid=pid, token=f"token-{pid}"
            )

    def ids_at_url() -> set[str]:
        with session_scope(prepared.database) as session:
            return {address.id for address in live_addresses(session, BASE, None) if address.url == url}

    try:
        register(f"{BASE}@here/1", "here", 1)  # killed: never unregistered
        register(f"{BASE}@here/2", "here", 2)  # restarted at the same port of the same machine
        assert ids_at_url() == {f"{BASE}@here/2"}
        register(f"{BASE}@there/3", "there", 3)  # another machine (one URL behind a load balancer)
        assert ids_at_url() == {f"{BASE}@here/2", f"{BASE}@there/3"}
    finally:
        with session_scope(prepared.database) as session:
            session.execute(delete(ServingNode).where(ServingNode.url == url))


# ---- real nodes ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nodes(prepared: Settings) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two serving nodes of the tiny base, both registered; the rows of those killed here are
    removed after, as a stopped node removes its own."""
    first, second = serving_node(prepared, BASE), serving_node(prepared, BASE)
    processes = [next(first), next(second)]
    try:
        yield processes
    finally:
        for started in (first, second):
            started.close()  # SIGTERM, and wait
        with session_scope(prepared.database) as session:
            pids = [process.pid for process in processes]
            session.execute(delete(ServingNode).where(ServingNode.base_model == BASE, ServingNode.pid.in_(pids)))


def addresses(settings: Settings, processes: list[subprocess.Popen[bytes]]) -> list[NodeAddress]:
    """The registered addresses of `processes`, in their order."""
    with session_scope(settings.database) as session:
        by_pid = {address.id.rsplit("/", 1)[1]: address for address in live_addresses(session, BASE, None)}
    return [by_pid[str(process.pid)] for process in processes]


def request() -> NodeCompletion:
    """A request as the API forwards it: streamed by the node, whether or not its client streams."""
    return NodeCompletion(messages=QUESTION, max_tokens=4, temperature=0.0, seed=0, stream=True)


def test_an_answer_comes_from_the_next_node_when_the_first_refuses_the_connection(
    prepared: Settings, nodes: list[subprocess.Popen[bytes]]
) -> None:
    alive = addresses(prepared, nodes)[0]
    for stream in (True, False):
        traffic = NodeTraffic()
        dead = NodeAddress(id=f"{BASE}@gone/{stream}", url=f"http://127.0.0.1:{free_port()}")

        async def ask(stream: bool = stream, traffic: NodeTraffic = traffic, dead: NodeAddress = dead) -> Any:
            if not stream:
                first, rest = await complete_lines([dead, alive], request(), traffic)
                return [first, *rest]
            first, lines = await open_stream([dead, alive], request(), traffic)
            return [first, *[line async for line in lines]]

        lines = asyncio.run(ask())
        assert lines[0].served.adapter is None and lines[-1].finish_reason, lines
        assert traffic.down() == {dead.id}
        assert traffic.asked() == {dead.id: 1, alive.id: 1} and traffic.in_flight() == {}


@pytest.fixture(scope="module")
def owner(prepared: Settings) -> Tenant:
    return make_tenant(prepared)


def test_requests_spread_over_both_nodes_and_none_fails_after_one_is_killed(
    prepared: Settings, live_server: LiveServer, owner: Tenant, nodes: list[subprocess.Popen[bytes]]
) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{live_server.url}/v1", api_key=owner.keys["developer"], max_retries=0)
    first, second = addresses(prepared, nodes)

    def ask(stream: bool) -> str:
        options: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
        reply = client.chat.completions.create(model=BASE, messages=QUESTION, max_tokens=3, temperature=0, **options)
        if not stream:
            assert reply.usage.completion_tokens >= 1
            return str(reply.choices[0].message.content)
        chunks = list(reply)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
        return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)

    asked_before = node_client.TRAFFIC.asked()
    for number in range(4):
        ask(stream=number % 2 == 1)
    asked = node_client.TRAFFIC.asked()
    for node in (first, second):  # one request at a time, and still both nodes served
        assert asked.get(node.id, 0) - asked_before.get(node.id, 0) >= 1, (asked_before, asked)

    nodes[0].send_signal(signal.SIGKILL)
    nodes[0].wait()
    asked_before = asked
    answers = [ask(stream=number % 2 == 1) for number in range(8)]  # every one answered: no exception
    assert len(answers) == 8
    asked = node_client.TRAFFIC.asked()
    assert asked.get(first.id, 0) > asked_before.get(first.id, 0), "the killed node was never tried: no failover"
    assert asked[second.id] - asked_before[second.id] == 8
    assert first.id in node_client.TRAFFIC.down()

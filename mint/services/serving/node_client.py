"""Every call to a serving node's internal routes, and the one reading of a node's replies.

The API forwards inference to the nodes of a base in the order `serving_nodes.nodes_for`
gives (`open_stream` for a streamed answer, `complete_lines` for a whole one, both JSON lines
as the node writes them), the eval runner sends its batches (`complete`), and the API and
`mint admin` manage nodes' adapter caches (`call_node`: statistics, pins, evictions, prefetch
hints). Every call presents the node's credential (`Authorization: Bearer`). A node's errors
come back as Mint's: a refusal keeps its type and message (so the client sees what the node
said, and the CLI its exit code); anything else, including no answer, is ServiceUnavailable,
which names the node by its id and never by its URL.

A node that dies takes no request down with it where another node can answer: a connection
refused, reset or closed before the client was sent any byte of the answer is retried on the
next node in the order (for a streamed answer, until its first line arrives; for a whole one,
until its last, since the client is sent nothing before). The dead node is marked down in this
process's `NodeTraffic`, which puts it last for later requests until it answers its
`/healthz` again. A node that answers slowly (a read timeout) is not dead: it is not retried.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncGenerator, Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from mint import errors, tracing
from mint.errors import MintError, ServiceUnavailable
from mint.schemas.inference import AdapterOnNode
from mint.schemas.node import NodeChoiceLine, NodeCompletion, NodeServedLine
from mint.services.serving.nodes import NodeAddress

log = logging.getLogger(__name__)
TIMEOUT_S = 30.0
# Generation may queue behind other batches on the node: reads wait long. Connecting is quick
# for the network, but under load (hundreds of concurrent requests in one API process) the
# API's own busy event loop is slow to finish a connect: 5 s failed 4-30 % of 256 concurrent
# requests in bench/serve_load.py. A node whose process is down refuses at once, and one that
# stopped heartbeating is soon no longer chosen, so a longer connect budget costs little.
COMPLETION_TIMEOUT = httpx.Timeout(connect=30.0, read=600.0, write=30.0, pool=30.0)
COMPLETE_PATH = "/internal/v1/complete"
# The refusals a node passes on as they are, by the `type` of its error body.
REFUSALS: dict[str, type[MintError]] = {
    cls.type: cls for cls in (errors.InvalidRequest, errors.NotFound, errors.Conflict, errors.PayloadTooLarge)
}


# Failures that mean the node's process is gone (or its host unreachable): nothing was
# generated that the client saw, so the next node is asked. A read timeout is a slow node,
# not a dead one, and is not among them.
NODE_DOWN_ERRORS: tuple[type[httpx.HTTPError], ...] = (
    httpx.NetworkError,  # connection refused or reset, a broken pipe
    httpx.RemoteProtocolError,  # closed before the reply, or within its body
    httpx.ConnectTimeout,
)
# A node marked down is asked for its /healthz this often, and forgotten (tried as any other
# again, and marked again if it still fails) when it has not answered for this long: by then
# its row is no longer live unless its process still heartbeats.
PROBE_EVERY_S = 1.0
PROBE_TIMEOUT_S = 2.0
FORGET_DOWN_AFTER_S = 120.0


class NodeTraffic:
    """This process's view of the serving nodes it calls: the requests in flight on each (the
    least busy node of a base is asked first), the requests asked of each so far, and the nodes
    that failed to answer, which are tried last until their `/healthz` answers again (a thread
    per such node probes it)."""

    def __init__(self, *, probe_every_s: float = PROBE_EVERY_S, forget_after_s: float = FORGET_DOWN_AFTER_S) -> None:
        self.probe_every_s = probe_every_s
        self.forget_after_s = forget_after_s
        self._lock = threading.Lock()
        self._in_flight: Counter[str] = Counter()
        self._asked: Counter[str] = Counter()
        self._down: dict[str, NodeAddress] = {}
        self._turns = 0

    def in_flight(self) -> dict[str, int]:
        with self._lock:
            return dict(self._in_flight)

    def asked(self) -> dict[str, int]:
        """Requests this process has asked of each node, answered or not: how the load spread."""
        with self._lock:
            return dict(self._asked)

    def down(self) -> set[str]:
        """Ids of the nodes marked down: they go last in every order until they answer again."""
        with self._lock:
            return set(self._down)

    def next_turn(self) -> int:
        """A counter advanced per request, which rotates equally busy nodes (`serving_order`)."""
        with self._lock:
            self._turns += 1
            return self._turns

    def started(self, node: NodeAddress) -> None:
        with self._lock:
            self._in_flight[node.id] += 1
            self._asked[node.id] += 1

    def finished(self, node: NodeAddress) -> None:
        with self._lock:
            self._in_flight[node.id] -= 1
            if self._in_flight[node.id] <= 0:
                del self._in_flight[node.id]

    def mark_down(self, node: NodeAddress, error: BaseException) -> None:
        """Put `node` last in every order until its /healthz answers again."""
        with self._lock:
            if node.id in self._down:
                return
            self._down[node.id] = node
        log.warning(
            "serving node %s at %s is down (%s); asking other nodes of its base until it answers again",
            node.id,
            node.url,
            type(error).__name__,
        )
        threading.Thread(target=self._probe, args=(node,), name=f"probe {node.id}", daemon=True).start()

    def _probe(self, node: NodeAddress) -> None:
        """Ask a node marked down for its /healthz until it answers (then it is tried as any
        other) or until `forget_after_s` has passed (then it is forgotten, tried again, and marked
        again if it still fails: a row whose process is gone stops being live meanwhile)."""
        given_up_at = time.monotonic() + self.forget_after_s
        while time.monotonic() < given_up_at:
            time.sleep(self.probe_every_s)
            try:
                answered = httpx.get(f"{node.url}/healthz", timeout=PROBE_TIMEOUT_S).status_code == 200
            except httpx.HTTPError:
                answered = False
            if answered:
                log.info("serving node %s answers again", node.id)
                break
        with self._lock:
            self._down.pop(node.id, None)


# The one view per process: the API's requests and the eval runner's share it.
TRAFFIC = NodeTraffic()


def request_headers(node: NodeAddress) -> dict[str, str]:
    """The node's credential, and the id of the request this call serves (`mint.tracing`)."""
    headers = {"Authorization": f"Bearer {node.token}"} if node.token else {}
    request_id = tracing.current()
    if request_id is not None:
        headers[tracing.HEADER] = request_id
    return headers


def node_error(node: NodeAddress, status: int, text: str, retry_after: str | None = None) -> MintError:
    """The Mint error for a node's error reply (status, body text and Retry-After header).

    A node whose queue is full answers 429: the client gets the 429 and the node's Retry-After.
    A 401 means the node and this process disagree on the credential (MINT_NODE_TOKEN).
    Clients are told the node's id, never its URL, which goes to this process's log.
    """
    try:
        error = json.loads(text)["error"]
        message, kind, param = str(error["message"]), str(error.get("type", "")), error.get("param")
    except (ValueError, KeyError, TypeError):
        message, kind, param = text[:300], "", None
    if status == 429 and kind == errors.RateLimited.type:
        wait_s = int(retry_after) if retry_after and retry_after.isdigit() else 1
        return errors.RateLimited(message, param=param, retry_after_s=wait_s)
    refusal = REFUSALS.get(kind)
    if refusal is not None and 400 <= status < 500:
        return refusal(message, param=param)
    if status == 401:
        log.error(
            "serving node %s at %s refused this process's credential: set MINT_NODE_TOKEN to the same value "
            "for the API and its nodes, or unset it everywhere so that each node issues its own",
            node.id,
            node.url,
        )
        return ServiceUnavailable(f"serving node {node.id} refused the API's node credential (MINT_NODE_TOKEN); retry")
    log.warning("serving node %s at %s failed (%s): %s", node.id, node.url, status, message)
    return ServiceUnavailable(f"serving node {node.id} failed ({status}): {message}; retry")


def _no_answer(node: NodeAddress, exc: httpx.HTTPError) -> ServiceUnavailable:
    log.warning("serving node %s at %s did not answer: %r", node.id, node.url, exc)
    # Some of httpx's errors (ConnectTimeout) have an empty message: their class says what
    # happened; their text may name the URL, so it stays in the log above.
    return ServiceUnavailable(f"serving node {node.id} did not answer ({type(exc).__name__}); retry")


def call_node(node: NodeAddress, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One JSON call to a node's internal route."""
    try:
        response = httpx.request(
            method, f"{node.url}{path}", json=body, headers=request_headers(node), timeout=TIMEOUT_S
        )
    except httpx.HTTPError as exc:
        raise _no_answer(node, exc) from exc
    if response.status_code >= 400:
        raise node_error(node, response.status_code, response.text)
    return dict(response.json())


def complete(node: NodeAddress, body: NodeCompletion) -> list[dict[str, Any]]:
    """A whole completion from a node: its lines (what served it first, then the choices' events),
    each checked to be a `NodeLine`, as the JSON objects the node wrote."""
    try:
        response = httpx.post(
            f"{node.url}{COMPLETE_PATH}",
            json=body.model_dump(mode="json"),
            headers=request_headers(node),
            timeout=COMPLETION_TIMEOUT,
        )
    except httpx.HTTPError as exc:
        raise _no_answer(node, exc) from exc
    if response.status_code >= 400:
        raise node_error(node, response.status_code, response.text, response.headers.get("retry-after"))
    lines = list(response.json())
    for index, line in enumerate(lines):
        _read(node, line, NodeChoiceLine if index else NodeServedLine)
    return lines


Line = TypeVar("Line", bound=BaseModel)


def _read(node: NodeAddress, line: str | dict[str, Any], kind: type[Line]) -> Line:
    """One line of a node's reply (its text, or its JSON object) as `kind`: the first line is
    what served the request, the others choices' tokens. One that is not is ServiceUnavailable."""
    try:
        return kind.model_validate(json.loads(line) if isinstance(line, str) else line)
    except (ValueError, ValidationError) as exc:  # json.JSONDecodeError is a ValueError
        log.warning("serving node %s at %s sent a line that is no %s: %s", node.id, node.url, kind.__name__, exc)
        raise ServiceUnavailable(f"serving node {node.id} sent a reply line this API cannot read; retry") from None


async def _node_lines(node: NodeAddress, body: NodeCompletion, traffic: NodeTraffic) -> AsyncGenerator[str, None]:
    """A completion's lines as `node` writes them (`body.stream` set), unread; its transport errors as
    httpx raises them, for the caller to tell a dead node from a slow one. Counted in flight."""
    traffic.started(node)
    try:
        async with (
            httpx.AsyncClient(timeout=COMPLETION_TIMEOUT, headers=request_headers(node)) as client,
            client.stream("POST", f"{node.url}{COMPLETE_PATH}", json=body.model_dump(mode="json")) as response,
        ):
            if response.status_code >= 400:
                text = (await response.aread()).decode()
                raise node_error(node, response.status_code, text, response.headers.get("retry-after"))
            async for line in response.aiter_lines():
                if line.strip():
                    yield line
    finally:
        traffic.finished(node)


def _none_answered(failures: list[tuple[NodeAddress, httpx.HTTPError]]) -> ServiceUnavailable:
    """The error when no node of a base answered: each named by id (the URLs go to the log)."""
    if not failures:
        return ServiceUnavailable("no serving node of the base was given to ask; retry")
    if len(failures) == 1:
        return _no_answer(*failures[0])
    for node, exc in failures:
        log.warning("serving node %s at %s did not answer: %r", node.id, node.url, exc)
    named = ", ".join(f"{node.id} ({type(exc).__name__})" for node, exc in failures)
    return ServiceUnavailable(f"serving nodes {named} did not answer; retry")


async def _rest(
    node: NodeAddress, lines: AsyncGenerator[str, None], traffic: NodeTraffic
) -> AsyncGenerator[NodeChoiceLine, None]:
    """The lines after the first: the client has been sent the answer's start, so a node that
    fails now ends the answer with ServiceUnavailable, and is marked down if it died."""
    try:
        async for line in lines:
            yield _read(node, line, NodeChoiceLine)
    except httpx.TransportError as exc:
        if isinstance(exc, NODE_DOWN_ERRORS):
            traffic.mark_down(node, exc)
        raise _no_answer(node, exc) from exc
    finally:
        await lines.aclose()


async def open_stream(
    nodes: Sequence[NodeAddress], body: NodeCompletion, traffic: NodeTraffic = TRAFFIC
) -> tuple[NodeServedLine, AsyncGenerator[NodeChoiceLine, None]]:
    """A completion streamed from the first of `nodes` that answers: its first line (what
    served it) and an iterator of the rest. A node that dies before its first line is marked
    down and the next is asked; one that dies later ends the stream with ServiceUnavailable.
    A node's refusal (its queue full, a bad request) is raised as it is, without asking another."""
    failures: list[tuple[NodeAddress, httpx.HTTPError]] = []
    for node in nodes:
        lines = _node_lines(node, body, traffic)
        try:
            first = await anext(lines)
        except NODE_DOWN_ERRORS as exc:
            await lines.aclose()
            traffic.mark_down(node, exc)
            failures.append((node, exc))
            continue
        except httpx.TransportError as exc:
            await lines.aclose()
            raise _no_answer(node, exc) from exc
        except StopAsyncIteration:
            raise ServiceUnavailable(f"serving node {node.id} answered with nothing; retry") from None
        try:
            served = _read(node, first, NodeServedLine)
        except ServiceUnavailable:
            await lines.aclose()
            raise
        return served, _rest(node, lines, traffic)
    raise _none_answered(failures)


async def complete_lines(
    nodes: Sequence[NodeAddress], body: NodeCompletion, traffic: NodeTraffic = TRAFFIC
) -> tuple[NodeServedLine, list[NodeChoiceLine]]:
    """A whole completion's lines (what served it, then the choices' lines) from the first of
    `nodes` that answers to the end (`body.stream` set, as for `open_stream`): the client is sent
    nothing before, so a node that dies at any point is marked down and the request is asked of
    the next. Refusals are raised as they are."""
    failures: list[tuple[NodeAddress, httpx.HTTPError]] = []
    for node in nodes:
        lines = _node_lines(node, body, traffic)
        try:
            read = [line async for line in lines]
        except NODE_DOWN_ERRORS as exc:
            traffic.mark_down(node, exc)
            failures.append((node, exc))
            continue
        except httpx.TransportError as exc:
            raise _no_answer(node, exc) from exc
        finally:
            await lines.aclose()
        if not read:
            raise ServiceUnavailable(f"serving node {node.id} answered with nothing; retry")
        return _read(node, read[0], NodeServedLine), [_read(node, line, NodeChoiceLine) for line in read[1:]]
    raise _none_answered(failures)


def prefetch_on_nodes(nodes: list[NodeAddress], adapters: list[AdapterOnNode]) -> None:
    """Hint every node of the base to warm these adapters; a node that does not answer is skipped."""
    body = {"adapters": [adapter.model_dump() for adapter in adapters]}
    for node in nodes:
        try:
            call_node(node, "POST", "/internal/v1/cache/prefetch", body)
        except ServiceUnavailable:
            log.warning("could not send a prefetch hint to serving node %s", node.id, exc_info=True)

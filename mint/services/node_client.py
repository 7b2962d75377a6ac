"""Every call to a serving node's internal routes, and the one reading of a node's replies.

The API forwards inference (`complete_stream`, JSON lines as the node writes them), the eval
runner sends its batches (`complete`), and the API and `mint admin` manage nodes' adapter
caches (`call_node`: statistics, pins, evictions, prefetch hints). Every call presents the
node's credential (`Authorization: Bearer`). A node's errors come back as Mint's: a refusal
keeps its type and message (so the client sees what the node said, and the CLI its exit
code); anything else, including no answer, is ServiceUnavailable, which names the node by its
id and never by its URL.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx

from mint import errors
from mint.errors import MintError, ServiceUnavailable
from mint.schemas.inference import AdapterOnNode
from mint.services.serving_nodes import NodeAddress
from mint.serving.completion import NodeCompletion

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


def _headers(node: NodeAddress) -> dict[str, str]:
    return {"Authorization": f"Bearer {node.token}"} if node.token else {}


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
        response = httpx.request(method, f"{node.url}{path}", json=body, headers=_headers(node), timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise _no_answer(node, exc) from exc
    if response.status_code >= 400:
        raise node_error(node, response.status_code, response.text)
    return dict(response.json())


def complete(node: NodeAddress, body: NodeCompletion) -> list[dict[str, Any]]:
    """A whole completion from a node: its lines (what served it first, then the choices' events)."""
    try:
        response = httpx.post(
            f"{node.url}{COMPLETE_PATH}",
            json=body.model_dump(mode="json"),
            headers=_headers(node),
            timeout=COMPLETION_TIMEOUT,
        )
    except httpx.HTTPError as exc:
        raise _no_answer(node, exc) from exc
    if response.status_code >= 400:
        raise node_error(node, response.status_code, response.text, response.headers.get("retry-after"))
    return list(response.json())


async def complete_stream(node: NodeAddress, body: NodeCompletion) -> AsyncIterator[dict[str, Any]]:
    """A completion's lines as the node writes them (`body.stream` set)."""
    async with httpx.AsyncClient(timeout=COMPLETION_TIMEOUT, headers=_headers(node)) as client:
        try:
            async with client.stream(
                "POST", f"{node.url}{COMPLETE_PATH}", json=body.model_dump(mode="json")
            ) as response:
                if response.status_code >= 400:
                    text = (await response.aread()).decode()
                    raise node_error(node, response.status_code, text, response.headers.get("retry-after"))
                async for line in response.aiter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.TransportError as exc:
            raise _no_answer(node, exc) from exc


def prefetch_on_nodes(nodes: list[NodeAddress], adapters: list[AdapterOnNode]) -> None:
    """Hint every node of the base to warm these adapters; a node that does not answer is skipped."""
    body = {"adapters": [adapter.model_dump() for adapter in adapters]}
    for node in nodes:
        try:
            call_node(node, "POST", "/internal/v1/cache/prefetch", body)
        except ServiceUnavailable:
            log.warning("could not send a prefetch hint to serving node %s", node.id, exc_info=True)

"""The internal HTTP app of a serving node (`mint serve --base NAME`).

It holds one serving node (`Node`: serving's ServingNode, started by the `NodeHost` that
`mint serve` passes in, which loads the engine; torch is imported there, never in the public
API process, and this module imports nothing of the serving package) and answers the public API,
which forwards each inference request (`mint.schemas.node.NodeCompletion`) with its model
already resolved. Replies stream as JSON lines (`mint.schemas.node.NodeLine`): first what
served the request (`{"served": ...}`), then one line per batch of new tokens of one choice.
Every route reads the running node through one dependency (`Running`). The node
registers itself in the database with its URL once its base is loaded (so a registered node
is one that can serve: `/readyz` of the API counts them) and heartbeats, so the API finds it.

Several nodes of one base may run on one machine (`mint up --serve BASE --serve BASE`): each
claims an adapter-cache folder of its own on the SSD (`claim_cache_folder`), since a node
empties its folder's unfinished writes at start and evicts what is over its budget.

Every route but `/healthz` and `/metrics` requires the node's credential (`mint.api.node_guard`):
the shared MINT_NODE_TOKEN, or, where that is unset, a random token the node issues at start
and records in its serving_nodes row for the API to read. The token is never logged.

Routes: `POST /internal/v1/complete`, `GET /internal/v1/cache`, `POST /internal/v1/cache/pin`
`/unpin`, `/evict` and `/prefetch`, `GET /healthz`, `GET /metrics` (the cache's per-tier counters).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, asynccontextmanager
from dataclasses import asdict, dataclass
from itertools import chain
from pathlib import Path
from typing import IO, Annotated, Any, Protocol

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from mint import tracing
from mint.api.errors import install_error_handlers
from mint.api.node_guard import NodeCredentialGuard
from mint.api.request_log import RequestLog
from mint.chat.tool_calls import parse_tool_calls
from mint.config import Settings
from mint.errors import ConfigurationError, ServiceUnavailable
from mint.schemas.inference import AdapterOnNode
from mint.schemas.node import NodeChoiceLine, NodeCompletion, NodeServedLine, ServedBy, node_line_json
from mint.services.serving.nodes import (
    HEARTBEAT_EVERY_S,
    heartbeat,
    node_credential,
    register_node,
    unregister_node,
)
from mint.storage.db import session_scope

log = logging.getLogger(__name__)

# Nodes of one base on one machine, each with its own adapter-cache folder.
MAX_NODES_PER_BASE_HERE = 64


def claim_cache_folder(root: Path, base_model: str) -> tuple[Path, IO[bytes]]:
    """An adapter-cache folder under `root` that no other live node of `base_model` on this
    machine uses, and the open lock file that holds it (the claim ends when it is closed, or
    when the process dies, even by SIGKILL).

    The first node takes `<root>/<base>`, others `<root>/<base>.1`, `.2`, ...; a restarted node
    takes the first free one, usually the one it had, and adopts the copies left there."""
    locks = root / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    for slot in range(MAX_NODES_PER_BASE_HERE):
        lock = (locks / f"{base_model}.{slot}.lock").open("ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return root / (base_model if slot == 0 else f"{base_model}.{slot}"), lock
    raise ConfigurationError(
        f"{MAX_NODES_PER_BASE_HERE} serving nodes of {base_model} already run on this machine, each with its own "
        f"adapter cache under {root}; run more on other machines"
    )


class PinRequest(BaseModel):
    adapter: AdapterOnNode


class EvictRequest(BaseModel):
    adapter: AdapterOnNode
    tier: str | None = None


class PrefetchRequest(BaseModel):
    adapters: list[AdapterOnNode]


def _assistant_message(text: str, call_prefix: str) -> dict[str, Any]:
    """The reply as an OpenAI assistant message: tool calls when the text makes them."""
    calls = parse_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [call.to_openai(f"call_{call_prefix}_{index}") for index, call in enumerate(calls)],
    }


# ---- the node, as this app uses it ---------------------------------------------------------------
# What the app needs of serving's ServingNode and of the host that starts one (serving's
# NodeHost, which `mint serve` passes in): the API imports nothing of the serving package.


class RouteDecisionLike(Protocol):
    """The router's decision (serving's RouteDecision)."""

    @property
    def adapter(self) -> str: ...

    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...


class UsageLike(Protocol):
    def model_dump(self) -> dict[str, Any]: ...


class NodeEvent(Protocol):
    """New tokens of one request (serving's StreamEvent)."""

    @property
    def text(self) -> str: ...

    @property
    def token_ids(self) -> list[int]: ...

    @property
    def logprobs(self) -> list[float]: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def usage(self) -> UsageLike | None: ...

    @property
    def finished(self) -> bool: ...


class AdapterCache(Protocol):
    """The node's tiered adapter cache, by content hash."""

    def stats(self) -> Any: ...  # a dataclass of per-tier counters

    def pin(self, key: str) -> None: ...

    def unpin(self, key: str) -> None: ...

    def evict(self, key: str, *, tier: str | None = None) -> list[str]: ...


class Node(Protocol):
    """A serving node: routes, generates and caches (serving's ServingNode)."""

    @property
    def cache(self) -> AdapterCache: ...

    def know(self, adapter: AdapterOnNode) -> None: ...

    def prefetch(self, adapters: Sequence[AdapterOnNode]) -> None: ...

    def route(self, request: NodeCompletion) -> tuple[NodeCompletion, RouteDecisionLike | None]: ...

    def stream(self, request: NodeCompletion, *, refuse_when_full: bool = False) -> Iterator[NodeEvent]: ...

    def logprobs_content(self, event: Any) -> list[dict[str, Any]]: ...

    def prompt_tokens(self, request: NodeCompletion) -> list[int]: ...

    def remember(self, request: NodeCompletion, decision: Any, reply: dict[str, Any]) -> None: ...


class NodeHost(Protocol):
    """Starts the node of one base (loading its engine) and stops it on exit."""

    @property
    def base_model(self) -> str: ...

    def open(self, ssd_dir: Path, registry: CollectorRegistry) -> AbstractContextManager[Node]: ...


@dataclass(frozen=True)
class RunningNode:
    """The node this app serves, once its lifespan has started it."""

    node: Node
    node_id: str
    base_model: str
    registry: CollectorRegistry


def running_node(request: Request) -> RunningNode:
    running: RunningNode | None = getattr(request.app.state, "running", None)
    if running is None:
        raise ServiceUnavailable("the serving node is not started yet; retry")
    return running


Running = Annotated[RunningNode, Depends(running_node)]


# ---- the routes ----------------------------------------------------------------------------------


def healthz() -> dict[str, str]:
    """Open to anyone: that the node is up, and nothing about it."""
    return {"status": "ok"}


def metrics(running: Running) -> Response:
    return Response(generate_latest(running.registry), media_type=CONTENT_TYPE_LATEST)


def cache_stats(running: Running) -> dict[str, Any]:
    stats = running.node.cache.stats()
    return {"node_id": running.node_id, "base_model": running.base_model, **asdict(stats)}


def pin(body: PinRequest, running: Running) -> dict[str, Any]:
    running.node.know(body.adapter)
    running.node.cache.pin(body.adapter.sha256)
    return {"pinned": body.adapter.sha256}


def unpin(body: PinRequest, running: Running) -> dict[str, Any]:
    running.node.cache.unpin(body.adapter.sha256)
    return {"unpinned": body.adapter.sha256}


def evict(body: EvictRequest, running: Running) -> dict[str, Any]:
    return {"evicted_from": running.node.cache.evict(body.adapter.sha256, tier=body.tier)}


def prefetch(body: PrefetchRequest, running: Running) -> dict[str, Any]:
    running.node.prefetch(body.adapters)
    return {"prefetching": [adapter.sha256 for adapter in body.adapters]}


async def complete(body: NodeCompletion, running: Running) -> Response:
    lines = _completion_lines(running.node, body)
    # The first line comes once the request is in the queue: a full queue (RateLimited) and
    # any other refusal become an error reply (429: Retry-After), not a broken stream.
    first = await run_in_threadpool(next, lines)
    if body.stream:
        return StreamingResponse(iterate_in_threadpool(chain([first], lines)), media_type="application/x-ndjson")
    return JSONResponse(await run_in_threadpool(_collect, list, chain([first], lines)))


# (method, path, handler): added to the app itself, so that `app.routes` lists each.
ROUTES: tuple[tuple[str, str, Callable[..., Any]], ...] = (
    ("GET", "/healthz", healthz),
    ("GET", "/metrics", metrics),
    ("GET", "/internal/v1/cache", cache_stats),
    ("POST", "/internal/v1/cache/pin", pin),
    ("POST", "/internal/v1/cache/unpin", unpin),
    ("POST", "/internal/v1/cache/evict", evict),
    ("POST", "/internal/v1/cache/prefetch", prefetch),
    ("POST", "/internal/v1/complete", complete),
)


def _collect(gather: Any, lines: Iterator[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gather(lines)]


def _completion_lines(node: Node, body: NodeCompletion) -> Iterator[str]:
    """JSON lines (`mint.schemas.node.NodeLine`): what served the request, then each choice's
    new tokens, then its end. When the request asked for logprobs, a line's `logprobs_content`
    holds its tokens' OpenAI chat entries (text, bytes, logprob, top_logprobs), named here,
    where the tokenizer is."""
    routed, decision = node.route(body)
    served = ServedBy(
        adapter=routed.adapter.ref if routed.adapter else None,
        sha256=routed.adapter.sha256 if routed.adapter else None,
        route=decision.model_dump(mode="json") if decision is not None else None,
    )
    # The first choice is queued (or refused) before anything is written; the others wait for room.
    first = node.stream(routed.choice(0), refuse_when_full=True)
    first_events = chain([next(first)], first)
    yield node_line_json(NodeServedLine(served=served))
    for choice in range(body.n):
        text = []
        for event in first_events if choice == 0 else node.stream(routed.choice(choice)):
            text.append(event.text)
            line: dict[str, Any] = {
                "choice": choice,
                "text": event.text,
                "token_ids": event.token_ids,
                "logprobs": event.logprobs,
            }
            if body.logprobs:
                line["logprobs_content"] = node.logprobs_content(event)
            if event.finished:
                line |= {
                    "finish_reason": event.finish_reason,
                    "usage": event.usage.model_dump() if event.usage else None,
                }
                if body.prompt_token_ids:
                    line["prompt_token_ids"] = node.prompt_tokens(routed)
                if body.messages is not None:
                    reply = _assistant_message("".join(text), hashlib.sha256("".join(text).encode()).hexdigest()[:12])
                    line["message"] = reply
                    node.remember(body, decision, reply)
            yield node_line_json(NodeChoiceLine.model_validate(line))


# ---- the app -------------------------------------------------------------------------------------


class NodeApp:
    """A serving node's app: `host`'s node, started by the app's lifespan, registered in the
    database under `url` (where the API reaches it) while it runs, and heartbeating."""

    def __init__(self, settings: Settings, host: NodeHost, url: str) -> None:
        self.settings = settings
        self.host = host
        self.url = url
        self.base_model = host.base_model
        self.node_id = f"{self.base_model}@{socket.gethostname()}/{os.getpid()}"
        self.credential = node_credential(settings.shared_node_token)

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        settings = self.settings
        ssd_dir, cache_claim = claim_cache_folder(settings.home / "adapter-cache", self.base_model)
        with ExitStack() as stack:
            stack.enter_context(cache_claim)  # released last, once the node is stopped
            registry = CollectorRegistry()
            node = await run_in_threadpool(stack.enter_context, self.host.open(ssd_dir, registry))
            stop = threading.Event()
            app.state.running = RunningNode(node, self.node_id, self.base_model, registry)
            with session_scope(settings.database) as session:
                register_node(
                    session,
                    node_id=self.node_id,
                    base_model=self.base_model,
                    url=self.url,
                    hostname=socket.gethostname(),
                    pid=os.getpid(),
                    token=self.credential.recorded,
                )
            beating = threading.Thread(target=_heartbeat, args=(settings, self.node_id, stop), daemon=True)
            beating.start()
            try:
                yield
            finally:
                stop.set()
                app.state.running = None
                stack.close()  # the node, its engine, then the cache folder's claim
                with session_scope(settings.database) as session:
                    unregister_node(session, self.node_id)

    def build(self) -> FastAPI:
        logging.basicConfig(level=self.settings.log_level)
        tracing.install()  # every line names the API request it serves
        # No /docs or /openapi.json: the node is no public API (and the guard would refuse them).
        app = FastAPI(
            title=f"Mint serving node ({self.base_model})",
            lifespan=self.lifespan,
            docs_url=None,
            redoc_url=None,
            openapi_url=None,
        )
        install_error_handlers(app)
        app.add_middleware(NodeCredentialGuard, token=self.credential.token)
        # Outermost: the API's request id (its X-Request-Id) names this node's lines for the request.
        app.add_middleware(RequestLog)
        for method, path, handler in ROUTES:
            app.add_api_route(path, handler, methods=[method])
        return app


def create_node_app(settings: Settings, host: NodeHost, url: str) -> FastAPI:
    """The node app of `host`'s base, reachable by the API at `url`. `host` (serving's
    `NodeHost`) has already refused a machine that cannot hold the base."""
    return NodeApp(settings, host, url).build()


def _heartbeat(settings: Settings, node_id: str, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_EVERY_S):
        try:
            with session_scope(settings.database) as session:
                heartbeat(session, node_id)
        except Exception:  # noqa: BLE001 - a missed heartbeat is retried; liveness allows for it
            log.warning("serving node heartbeat failed", exc_info=True)

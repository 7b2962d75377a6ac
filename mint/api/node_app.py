"""The internal HTTP app of a serving node (`mint serve --base NAME`).

It holds one `mint.serving.node.ServingNode` (loaded at start-up; torch is imported here,
never in the public API process) and answers the public API, which forwards each inference
request with its model already resolved. Replies stream as JSON lines: first what served the
request (`{"served": ...}`), then one line per batch of new tokens of one choice. The node
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
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from itertools import chain
from pathlib import Path
from typing import IO, Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from mint.api.errors import install_error_handlers
from mint.api.node_guard import NodeCredentialGuard
from mint.chat.tool_calls import parse_tool_calls
from mint.config import Settings
from mint.errors import ConfigurationError
from mint.schemas.base_models import get_base_model_spec
from mint.schemas.inference import AdapterOnNode
from mint.services.serving.nodes import (
    HEARTBEAT_EVERY_S,
    heartbeat,
    node_credential,
    register_node,
    unregister_node,
)
from mint.serving.completion import NodeCompletion
from mint.storage.db import session_scope
from mint.storage.objects import object_store_for

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


def create_node_app(settings: Settings, base_model: str, url: str) -> FastAPI:
    """The node app for `base_model`, reachable by the API at `url`; refused (ConfigurationError)
    where this machine cannot hold the base as its serving profile says."""
    from mint.serving.engines import choose_engine
    from mint.serving.fit import machine_resources, refuse_unless_fits

    # Before anything is loaded or registered: a machine that cannot hold the base refuses it
    # now, saying what the base needs, instead of failing halfway through loading its weights.
    spec = get_base_model_spec(base_model, settings.model_configs_dir)
    engine_kind = choose_engine(spec, settings.serving_engine, vllm_python=settings.vllm_python)
    refuse_unless_fits(spec.name, spec.serving, engine_kind, machine_resources())
    node_id = f"{base_model}@{socket.gethostname()}/{os.getpid()}"
    credential = node_credential(settings.shared_node_token)
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        from mint.serving.cache_stats import register_metrics
        from mint.serving.engines import open_engine
        from mint.serving.node import ServingNode

        engine = await run_in_threadpool(
            open_engine,
            spec,
            settings.models_cache_dir,
            kind=engine_kind,
            vllm_python=settings.vllm_python,
            max_adapters=settings.serving_engine_slots,
            max_batch_size=settings.serving_batch_size,
            compute_dtype=settings.compute_dtype,
        )
        ssd_dir, cache_claim = claim_cache_folder(settings.home / "adapter-cache", base_model)
        node = await run_in_threadpool(
            ServingNode,
            spec,
            engine,
            object_store_for(settings),
            ssd_dir=ssd_dir,
            max_waiting=settings.serving_max_waiting,
        )
        log.info("serving %s with the %s engine", base_model, type(engine).__name__)
        registry = CollectorRegistry()
        register_metrics(node.cache, registry)
        state.update(node=node, registry=registry, stop=threading.Event())
        with session_scope(settings.database) as session:
            register_node(
                session,
                node_id=node_id,
                base_model=base_model,
                url=url,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                token=credential.recorded,
            )
        beating = threading.Thread(target=_heartbeat, args=(settings, node_id, state["stop"]), daemon=True)
        beating.start()
        try:
            yield
        finally:
            state["stop"].set()
            node.close()
            engine.close()
            cache_claim.close()
            with session_scope(settings.database) as session:
                unregister_node(session, node_id)

    # No /docs or /openapi.json: the node is no public API (and the guard would refuse them).
    app = FastAPI(
        title=f"Mint serving node ({base_model})", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    install_error_handlers(app)
    app.add_middleware(NodeCredentialGuard, token=credential.token)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """Open to anyone: that the node is up, and nothing about it."""
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(state["registry"]), media_type=CONTENT_TYPE_LATEST)

    @app.get("/internal/v1/cache")
    def cache_stats() -> dict[str, Any]:
        stats = state["node"].cache.stats()
        return {"node_id": node_id, "base_model": base_model, **asdict(stats)}

    @app.post("/internal/v1/cache/pin")
    def pin(body: PinRequest) -> dict[str, Any]:
        node = state["node"]
        node.know(body.adapter)
        node.cache.pin(body.adapter.sha256)
        return {"pinned": body.adapter.sha256}

    @app.post("/internal/v1/cache/unpin")
    def unpin(body: PinRequest) -> dict[str, Any]:
        state["node"].cache.unpin(body.adapter.sha256)
        return {"unpinned": body.adapter.sha256}

    @app.post("/internal/v1/cache/evict")
    def evict(body: EvictRequest) -> dict[str, Any]:
        return {"evicted_from": state["node"].cache.evict(body.adapter.sha256, tier=body.tier)}

    @app.post("/internal/v1/cache/prefetch")
    def prefetch(body: PrefetchRequest) -> dict[str, Any]:
        state["node"].prefetch(body.adapters)
        return {"prefetching": [adapter.sha256 for adapter in body.adapters]}

    @app.post("/internal/v1/complete")
    async def complete(body: NodeCompletion) -> Response:
        node = state["node"]
        lines = _completion_lines(node, body)
        # The first line comes once the request is in the queue: a full queue (RateLimited) and
        # any other refusal become an error reply (429: Retry-After), not a broken stream.
        first = await run_in_threadpool(next, lines)
        if body.stream:
            return StreamingResponse(iterate_in_threadpool(chain([first], lines)), media_type="application/x-ndjson")
        return JSONResponse(await run_in_threadpool(_collect, list, chain([first], lines)))

    return app


def _collect(gather: Any, lines: Iterator[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gather(lines)]


def _completion_lines(node: Any, body: NodeCompletion) -> Iterator[str]:
    """JSON lines: what served the request, then each choice's new tokens, then its end. When
    the request asked for logprobs, a line's `logprobs_content` holds its tokens' OpenAI chat
    entries (text, bytes, logprob, top_logprobs), named here, where the tokenizer is."""
    routed, decision = node.route(body)
    served = {
        "adapter": routed.adapter.ref if routed.adapter else None,
        "sha256": routed.adapter.sha256 if routed.adapter else None,
        "route": decision.model_dump(mode="json") if decision is not None else None,
    }
    # The first choice is queued (or refused) before anything is written; the others wait for room.
    first = node.stream(routed.choice(0), refuse_when_full=True)
    first_events = chain([next(first)], first)
    yield json.dumps({"served": served}, default=str) + "\n"
    for choice in range(body.n):
        text = []
        for event in first_events if choice == 0 else node.stream(routed.choice(choice)):
            text.append(event.text)
            line = {"choice": choice, "text": event.text, "token_ids": event.token_ids, "logprobs": event.logprobs}
            if body.logprobs:
                line["logprobs_content"] = node.logprobs_content(event)
            if event.finished:
                line |= {
                    "finish_reason": event.finish_reason,
                    "usage": event.usage.model_dump() if event.usage else None,
                }
                if body.messages is not None:
                    reply = _assistant_message("".join(text), hashlib.sha256("".join(text).encode()).hexdigest()[:12])
                    line["message"] = reply
                    node.remember(body, decision, reply)
            yield json.dumps(line) + "\n"


def _heartbeat(settings: Settings, node_id: str, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_EVERY_S):
        try:
            with session_scope(settings.database) as session:
                heartbeat(session, node_id)
        except Exception:  # noqa: BLE001 - a missed heartbeat is retried; liveness allows for it
            log.warning("serving node heartbeat failed", exc_info=True)

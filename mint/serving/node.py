"""A serving node: one resident base, the multi-LoRA engine, the adapter cache, and the routers.

`mint serve --base NAME` runs one `ServingNode` behind an internal HTTP app
(`mint.api.node_app`); the public API resolves a model reference (a base, `adapter@version`
or a deployment) to what must serve it and forwards the request here, a
`mint.schemas.node.NodeCompletion`, which this node turns into the engine's
`GenerateRequest`. A request carries the adapter version it needs (or its mixture's
versions) by content hash and object key, so the node never reads the
database: the cache fetches the version from the object store the first time (once, however
many requests wait) and keeps it in its tiers (engine slots -> CPU RAM -> local SSD).

Requests from concurrent HTTP calls are gathered into batches: a batcher thread takes what
is waiting (up to the engine's batch size) and streams the batch through the engine, where
requests on different adapters share each forward pass. Two batchers run, so a new batch
starts while a long one is still decoding (the engine interleaves them step by step).

Mixture deployments are routed here, where the MiniLM encoder and the engine are: a request
names the deployment's revision and its spec (`mint.schemas.node.NodeMixture`; the spec a
`mint.serving.mixture.MixtureSpec`, validated when its router is built), and the node keeps
one `Router` per revision.
A reply that makes a tool call is remembered, so the conversation's continuation returns to
the adapter that made the call.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mint.chat.render import render_prompt
from mint.errors import InvalidRequest, RateLimited
from mint.schemas.base_models import BaseModelSpec
from mint.schemas.inference import AdapterOnNode
from mint.schemas.node import NodeCompletion, NodeMixture
from mint.serving.cache import TieredCache
from mint.serving.embeddings import EncoderOnLane, TextEncoder, get_encoder
from mint.serving.engine import ADAPTER_FILES, AdapterTensors, Engine, GenerateRequest, StreamEvent
from mint.serving.router import RouteDecision, Router
from mint.serving.tiers import CpuTier, EngineTier, LocalDiskTier, ObjectStoreTier
from mint.serving.token_text import TokenText
from mint.storage.archives import archive_views
from mint.storage.objects import ObjectStore
from mint.trainer.peft_files import MAX_HEADER_BYTES, safetensors_header

log = logging.getLogger(__name__)

BATCHERS = 2
MAX_ROUTERS = 256
# What a node with a full queue tells clients to wait: a batch step frees room within it.
RETRY_AFTER_S = 1


# The dtypes of a safetensors file that an adapter's factors may be saved in.
SAFETENSORS_FLOATS = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def decode_archive(payload: bytes) -> AdapterTensors:
    """An adapter version's archive (the PEFT files in a tar) as tensors in memory.

    The tensors are views of `payload`, read-only and copied by nothing: an engine copies them
    into its adapter slots, and the cache's RAM tier keeps `payload` itself. (safetensors'
    own loader copies each tensor out of the file, and the tar's reader the file out of the
    archive: two copies of the version on the path to its first token.)
    """
    files = archive_views(payload, exactly=ADAPTER_FILES, param="model")
    return AdapterTensors(
        config=json.loads(bytes(files["adapter_config.json"])),
        tensors=safetensors_views(files["adapter_model.safetensors"]),
    )


def safetensors_views(data: memoryview) -> dict[str, Any]:
    """The tensors of a safetensors file in memory, as views of `data` (torch tensors, read-only).

    The header is checked as the trainer checks an uploaded adapter's (`safetensors_header`),
    and each tensor's bytes against its dtype and shape; a problem is InvalidRequest.
    """
    import warnings

    import torch

    def refused(problem: str) -> InvalidRequest:
        return InvalidRequest(f"adapter_model.safetensors of this version {problem}", param="model")

    start = 8 + int.from_bytes(data[:8], "little")
    try:
        header = safetensors_header(bytes(data[: min(start, 8 + MAX_HEADER_BYTES)]))  # the header only
    except ValueError as exc:
        raise refused(f"is not a safetensors file: {exc}") from None
    tensors = {}
    for name, entry in header.items():
        try:
            dtype = getattr(torch, SAFETENSORS_FLOATS[entry["dtype"]])
            shape, (begin, end) = entry["shape"], entry["data_offsets"]
            if not all(isinstance(number, int) for number in (*shape, begin, end)) or not isinstance(shape, list):
                raise TypeError
        except (KeyError, TypeError, ValueError):
            raise refused(f"describes {name!r} as {entry!r}: a float tensor's dtype, shape and data_offsets") from None
        count = math.prod(shape)
        if (
            min(shape, default=0) < 0
            or not 0 <= begin <= end <= len(data) - start
            or end - begin != count * dtype.itemsize
        ):
            raise refused(
                f"holds {end - begin} bytes at {begin} for {name!r}, not its shape {shape} of {entry['dtype']}"
            )
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        with warnings.catch_warnings():  # torch warns that `data` is read-only: so are the views
            warnings.simplefilter("ignore", UserWarning)
            tensors[name] = torch.frombuffer(data, dtype=dtype, count=count, offset=start + begin).view(shape)
    return tensors


class _Pending:
    """A request waiting for, or going through, a batch: its engine request and its event queue."""

    def __init__(self, request: GenerateRequest) -> None:
        self.request = request
        self.events: queue.Queue[StreamEvent | BaseException] = queue.Queue()


class ServingNode:
    """The engine, the cache and the routers of one base on this machine."""

    def __init__(
        self,
        spec: BaseModelSpec,
        engine: Engine,
        store: ObjectStore,
        *,
        ssd_dir: Path,
        cpu_bytes: int = 2 * 1024**3,
        ssd_bytes: int = 20 * 1024**3,
        max_waiting: int = 256,
    ) -> None:
        """Serve `spec` with `engine` (see `mint.serving.engines.open_engine`), whose adapter
        slots become the cache's first tier, and the adapter versions in `store`. At most
        `max_waiting` requests wait for a batch; `stream(..., refuse_when_full=True)` refuses more."""
        self.spec = spec
        self.store = store
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.token_text = TokenText(self.tokenizer)
        self._object_keys: dict[str, str] = {}
        self.ssd = LocalDiskTier(ssd_dir, capacity_bytes=ssd_bytes)
        self.cache = TieredCache(
            [
                EngineTier(engine, max_entries=engine.max_adapters, decode=decode_archive),
                CpuTier(capacity_bytes=cpu_bytes),
                self.ssd,
            ],
            # The cache checks what the object store hands it while the engine loads it.
            ObjectStoreTier(store, self._object_key, verify=False),
            check_origin=True,
        )
        self._adopt_ssd_copies()
        self._routers: OrderedDict[str, Router] = OrderedDict()
        self._routers_lock = threading.Lock()
        self._waiting: queue.Queue[_Pending] = queue.Queue(maxsize=max_waiting)
        self._stop = threading.Event()
        self._batchers = [
            threading.Thread(target=self._batch_loop, name=f"batcher-{n}", daemon=True) for n in range(BATCHERS)
        ]
        for thread in self._batchers:
            thread.start()

    def close(self) -> None:
        self._stop.set()

    # ---- adapters ---------------------------------------------------------------------------

    def _adopt_ssd_copies(self) -> None:
        """Serve the copies a previous process left on the SSD; delete those over its budget."""
        kept = dropped = 0
        for key, size_bytes in self.ssd.stored():
            if self.cache.adopt(self.ssd.name, key, size_bytes):
                kept += 1
            else:
                self.ssd.delete(key)
                dropped += 1
        if kept or dropped:
            log.info("adapter cache: adopted %d copies left on the SSD, removed %d over its budget", kept, dropped)

    def _object_key(self, sha256: str) -> str:
        from mint.errors import NotFound

        key = self._object_keys.get(sha256)
        if key is None:
            raise NotFound(f"no adapter version with sha256 {sha256} was named to this node")
        return key

    def know(self, adapter: AdapterOnNode) -> None:
        """Learn where an adapter version lives, so the cache can fetch it."""
        self._object_keys[adapter.sha256] = adapter.object_key

    def prefetch(self, adapters: Sequence[AdapterOnNode]) -> None:
        """Warm the CPU and SSD tiers with adapters about to be asked for (a deployment's, a
        mixture's), in the background: no engine slot is taken and no request waits for it."""
        for adapter in adapters:
            self.know(adapter)

        def warm() -> None:
            try:
                self.cache.prefetch([adapter.sha256 for adapter in adapters])
            except Exception:  # noqa: BLE001 - a prefetch is a hint; the request path fetches anyway
                log.warning("prefetching %d adapters failed", len(adapters), exc_info=True)

        threading.Thread(target=warm, name="prefetch", daemon=True).start()

    # ---- routing ----------------------------------------------------------------------------

    def _router(self, mixture: NodeMixture) -> Router:
        revision = mixture.revision_id
        with self._routers_lock:
            router = self._routers.get(revision)
            if router is not None:
                self._routers.move_to_end(revision)
                return router
        router = Router(mixture.spec, encoder=self._encoder(), generate=self._generate_for_router(mixture))
        self.prefetch(list(mixture.versions.values()))
        with self._routers_lock:
            self._routers[revision] = router
            while len(self._routers) > MAX_ROUTERS:
                self._routers.popitem(last=False)
        return router

    def _encoder(self) -> TextEncoder:
        """The process's sentence encoder, run where the engine computes if it computes in this process."""
        lane = self.engine.compute_lane
        return get_encoder() if lane is None else EncoderOnLane(get_encoder(), lane)

    def _generate_for_router(self, mixture: NodeMixture) -> Any:
        def generate(adapters: Sequence[str], messages: Sequence[dict[str, Any]], *, max_tokens: int) -> list[str]:
            requests = [
                NodeCompletion(
                    messages=list(messages),
                    adapter=mixture.versions[ref],
                    max_tokens=max_tokens,
                    temperature=0.0,
                    top_p=1.0,
                    seed=0,
                )
                for ref in adapters
            ]
            return [self.complete(request)[0].text for request in requests]

        return generate

    def route(self, request: NodeCompletion) -> tuple[NodeCompletion, RouteDecision | None]:
        """Pick the adapter of a mixture request (the request itself otherwise)."""
        if request.mixture is None:
            return request, None
        router = self._router(request.mixture)
        decision = router.route(request.messages or [], metadata=request.metadata)
        chosen = request.mixture.versions[decision.adapter]
        return request.model_copy(update={"adapter": chosen, "mixture": None}), decision

    def remember(self, request: NodeCompletion, decision: RouteDecision | None, reply: dict[str, Any]) -> None:
        """Keep the adapter of a reply that makes tool calls, so the continuation is routed back to it."""
        if decision is None or request.mixture is None or request.messages is None or not reply.get("tool_calls"):
            return
        self._router(request.mixture).remember_tool_call([*request.messages, reply], decision.adapter)

    # ---- generation -------------------------------------------------------------------------

    def prompt_tokens(self, request: NodeCompletion) -> list[int]:
        """The prompt's ids as the engine is given them: chat messages rendered with the base's
        template and tools, or text tokenized as is."""
        if request.messages is not None:
            return render_prompt(self.tokenizer, request.messages, request.tools)
        assert request.prompt is not None
        return list(self.tokenizer(request.prompt, add_special_tokens=False)["input_ids"])

    def _engine_request(self, request: NodeCompletion) -> GenerateRequest:
        return GenerateRequest(
            adapter_id=request.adapter.sha256 if request.adapter else None,
            prompt_tokens=self.prompt_tokens(request),
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=request.stop,
            top_logprobs=request.top_logprobs if request.logprobs else 0,
        )

    def stream(self, request: NodeCompletion, *, refuse_when_full: bool = False) -> Iterator[StreamEvent]:
        """Events of one request, generated in a batch with whatever else is waiting.

        The adapter is leased for the whole request, so it cannot leave the engine mid-stream.
        When the queue of waiting requests is full, the request waits for room, or, with
        `refuse_when_full` (a new request from a client), RateLimited is raised at once: a
        client retries on another node or later, instead of waiting without bound.
        """
        if refuse_when_full and self._waiting.full():
            raise self._full()
        engine_request = self._engine_request(request)
        lease = None
        if request.adapter is not None:
            self.know(request.adapter)
            lease = self.cache.acquire(request.adapter.sha256)
        try:
            pending = _Pending(engine_request)
            try:
                self._waiting.put(pending, block=not refuse_when_full)
            except queue.Full:
                raise self._full() from None
            while True:
                event = pending.events.get()
                if isinstance(event, BaseException):
                    raise event
                yield event
                if event.finished:
                    return
        finally:
            if lease is not None:
                lease.release()

    def _full(self) -> RateLimited:
        return RateLimited(
            f"the serving node of {self.spec.name} has {self._waiting.maxsize} requests waiting, its limit "
            f"(MINT_SERVING_MAX_WAITING); retry in {RETRY_AFTER_S} s",
            retry_after_s=RETRY_AFTER_S,
        )

    def complete(self, request: NodeCompletion) -> list[StreamEvent]:
        """The request's events merged into one: its whole text, tokens, logprobs and usage."""
        events = list(self.stream(request))
        last = events[-1]
        merged = StreamEvent(
            index=0,
            token_ids=[token for event in events for token in event.token_ids],
            text="".join(event.text for event in events),
            logprobs=[value for event in events for value in event.logprobs],
            top_logprobs=[top for event in events for top in event.top_logprobs],
            finish_reason=last.finish_reason,
            stop_match=last.stop_match,
            usage=last.usage,
        )
        return [merged]

    def logprobs_content(self, event: StreamEvent) -> list[dict[str, Any]]:
        """OpenAI's chat logprobs entries of an event's tokens: each token's text, bytes and
        logprob, and its step's most likely tokens (`top_logprobs`, empty unless asked for).

        The entries cover the tokens of the completion's text: a stop token that ended the
        request (end of sequence, or one of `stop_token_ids`) is left out, as its text is.
        """
        tokens = list(zip(event.token_ids, event.logprobs, strict=True))
        tops = event.top_logprobs or [[] for _ in tokens]
        if event.finish_reason == "stop" and isinstance(event.stop_match, int) and tokens:
            tokens, tops = tokens[:-1], tops[:-1]
        text = self.token_text
        return [
            text.entry(token, logprob) | {"top_logprobs": [text.entry(other, value) for other, value in top]}
            for (token, logprob), top in zip(tokens, tops, strict=True)
        ]

    def _batch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                first = self._waiting.get(timeout=0.5)
            except queue.Empty:
                continue
            batch = [first]
            while len(batch) < self.engine.max_batch_size:
                try:
                    batch.append(self._waiting.get_nowait())
                except queue.Empty:
                    break
            try:
                for event in self.engine.stream([pending.request for pending in batch]):
                    batch[event.index].events.put(event.model_copy(update={"index": 0}))
            except BaseException as error:  # noqa: BLE001 - handed to every waiting request
                log.exception("a batch of %d requests failed", len(batch))
                for pending in batch:
                    pending.events.put(error)

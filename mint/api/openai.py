"""OpenAI-compatible inference: `/v1/models`, `/v1/chat/completions`, `/v1/completions`.

The API resolves `model` (a base, `adapter@version` or a deployment) to what must serve it,
orders the live serving nodes of that base (`mint serve --base NAME`; the least busy of those
sharing the model first, `serving_nodes.nodes_for`) and forwards the request to the first that
answers: a node that died is passed over without failing the request as long as the client has
been sent nothing (`node_client.open_stream`, `complete_lines`). The node streams back JSON
lines, which become OpenAI's response or its server-sent events.
Every response says which adapter version served it: the `mint` field of the body (and of
the first streamed chunk) and the `X-Mint-Adapter` header. Tokens served are recorded as
usage of the caller's organization.

No database connection is held while a node generates: the caller is authenticated, and the
model resolved, each in a short session closed before the node is called, and usage is
recorded in another once the node has answered (at the end of a stream, likewise). A node
whose queue is full answers 429, and so does the API, with the node's Retry-After.

A deployment that captures chooses each request at random at its rate, before it is served; a
chosen one's answer (the whole body, or a stream's last chunk) is sent once the capture writer
has committed its row (`mint.services.serving.captures`), so feedback posted on receipt finds it.

Logprobs are OpenAI's: the node, which has the tokenizer, sends each token's text, bytes,
logprob and top-k list as chat's `logprobs.content` entries; chat returns them as they are,
text completions reshape them into `tokens`, `token_logprobs`, `top_logprobs` (one
`{token: logprob}` per token, None when k is 0) and `text_offset` (characters from the start
of the prompt, as OpenAI counts them). Streamed chunks carry the entries of their own tokens.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import Future
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers

from mint.api.deps import BriefPrincipal, SettingsDep
from mint.api.pagination import id_path
from mint.config import Settings
from mint.errors import InvalidRequest, MintError, NotFound
from mint.schemas.episodes import EPISODE_HEADER, TASK_HEADER, EpisodeMark
from mint.schemas.inference import (
    ChatCompletion,
    ChatCompletionCreate,
    CompletionCreate,
    ModelCard,
    ModelList,
    TextCompletion,
)
from mint.schemas.node import NodeChoiceLine, NodeCompletion, ServedBy, TokenLogprobEntry
from mint.services.billing.usage import record_usage
from mint.services.principal import Principal
from mint.services.serving.captures import CaptureRecord, CaptureWriter
from mint.services.serving.episodes import EpisodeTurnRecord, records_episode
from mint.services.serving.inference import ServingPlan, available_models, plan_for
from mint.services.serving.node_client import TRAFFIC, complete_lines, open_stream
from mint.services.serving.nodes import NodeAddress, nodes_for
from mint.storage.db import session_scope
from mint.storage.tables import utcnow

router = APIRouter(tags=["inference"])

# Says, on the answer of a request marked as an episode's turn, whether its turn was recorded.
RECORDED_HEADER = "X-Mint-Episode-Recorded"
ModelName = Annotated[str, id_path("A base, `adapter@version`, or a deployment name.")]


def _plan(settings: Settings, principal: Principal, model: str) -> tuple[ServingPlan, list[NodeAddress]]:
    """What serves `model`, and the live nodes of its base in the order to ask them."""
    with session_scope(settings.database) as session:
        plan = plan_for(session, principal.organization_id, model)
        nodes = nodes_for(
            session,
            plan.base_model,
            plan.affinity,
            settings.shared_node_token,
            share=plan.share,
            in_flight=TRAFFIC.in_flight(),
            down=TRAFFIC.down(),
            turn=TRAFFIC.next_turn(),
        )
        return plan, nodes


def _record(settings: Settings, principal: Principal, plan: ServingPlan, served: str | None, tokens: int) -> None:
    with session_scope(settings.database) as session:
        record_usage(
            session,
            organization_id=principal.organization_id,
            kind="served",
            tokens=tokens,
            base_model=plan.base_model,
            model_ref=served or plan.base_model,
            resource_type="deployment" if plan.deployment else None,
            resource_id=plan.deployment,
        )


class _StreamedUsage:
    """Tokens of a streamed completion as its lines arrive: each choice's finishing line gives
    its exact usage; a choice cut short counts the tokens streamed so far."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.cached_tokens = 0  # of the prompt tokens, those the node's prompt cache served
        self.streamed: dict[int, int] = {}
        self.finished: dict[int, int] = {}

    def add(self, line: NodeChoiceLine) -> None:
        index = line.choice
        self.streamed[index] = self.streamed.get(index, 0) + len(line.token_ids)
        if line.finish_reason and line.usage:
            self.prompt_tokens = line.usage.prompt_tokens
            self.cached_tokens = max(self.cached_tokens, line.usage.prompt_tokens_details.cached_tokens)
            self.finished[index] = line.usage.completion_tokens

    def usage(self) -> dict[str, Any]:
        completion = sum(self.finished.get(index, count) for index, count in self.streamed.items())
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


class _Choices:
    """Each choice's text, tokens, logprobs, finish reason and message, as the node's lines arrive."""

    def __init__(self) -> None:
        self.by_index: dict[int, dict[str, Any]] = {}

    def add(self, line: NodeChoiceLine) -> None:
        choice = self.by_index.setdefault(
            line.choice, {"text": [], "token_ids": [], "logprobs": [], "logprobs_content": []}
        )
        choice["text"].append(line.text)
        choice["token_ids"] += line.token_ids
        choice["logprobs"] += line.logprobs
        choice["logprobs_content"] += line.logprobs_content or []
        if "finish_reason" in line.model_fields_set:
            choice["finish_reason"] = line.finish_reason
            choice["message"] = line.message
            choice["prompt_token_ids"] = line.prompt_token_ids or []

    def in_order(self) -> list[tuple[int, dict[str, Any]]]:
        return sorted(self.by_index.items())


class _Keeping:
    """What is kept of one request: its capture (its deployment's rate chose it) and its
    episode's turn (it is marked, and its deployment records the episode's tokens), both handed
    to the capture writer once the answer is whole; `landed` waits until their rows are written."""

    def __init__(
        self,
        writer: CaptureWriter,
        principal: Principal,
        plan: ServingPlan,
        body: ChatCompletionCreate | CompletionCreate,
        completion_id: str,
        *,
        capture: bool,
        episode: EpisodeMark | None,
        started: float,
    ) -> None:
        self.writer, self.principal, self.plan, self.body = writer, principal, plan, body
        self.completion_id, self.capture, self.episode, self.started = completion_id, capture, episode, started
        self.receipts: list[Future[bool]] = []

    @property
    def anything(self) -> bool:
        return self.capture or self.episode is not None

    def offer(self, served: str | None, choices: _Choices, usage: dict[str, Any]) -> None:
        plan, body = self.plan, self.body
        assert plan.capture is not None
        chat = isinstance(body, ChatCompletionCreate)
        unkept = {"stream", "stream_options", "model", "episode"}
        asked = body.model_dump(mode="json", exclude_none=True, exclude=unkept)
        latency_ms = (time.perf_counter() - self.started) * 1000
        now = utcnow()
        if self.capture:
            answers = [_choice(index, choice, body, with_logprobs=False) for index, choice in choices.in_order()]
            record = CaptureRecord(
                id=self.completion_id,
                organization_id=self.principal.organization_id,
                target=plan.capture,
                revision=plan.revision or 0,
                model_ref=served or plan.base_model,
                kind="chat" if chat else "completion",
                request=asked,
                response={"choices": answers},
                prompt_tokens=usage["prompt_tokens"],
                completion_tokens=usage["completion_tokens"],
                latency_ms=latency_ms,
                created_at=now,
            )
            self.receipts.append(self.writer.offer(record))
        if self.episode is not None and choices.by_index:
            index, choice = choices.in_order()[0]  # an episode's turn is one choice (n = 1)
            answer = _choice(index, choice, body, with_logprobs=False)
            turn = EpisodeTurnRecord(
                id=self.completion_id,
                organization_id=self.principal.organization_id,
                target=plan.capture,
                mark=self.episode,
                revision=plan.revision or 0,
                model_ref=served or plan.base_model,
                request=asked,
                response={key: value for key, value in answer.items() if key in ("message", "text", "finish_reason")},
                prompt_token_ids=choice.get("prompt_token_ids") or [],
                token_ids=choice["token_ids"],
                logprobs=choice["logprobs"],
                latency_ms=latency_ms,
                created_at=now,
            )
            self.receipts.append(self.writer.offer(turn))

    async def landed(self, timeout_s: float) -> None:
        for receipt in self.receipts:
            await self.writer.landed(receipt, timeout_s)


def _episode_mark(body: ChatCompletionCreate | CompletionCreate, headers: Headers) -> EpisodeMark | None:
    """The episode a request says it is a turn of: its `X-Mint-Episode` (and `X-Mint-Task`)
    headers, or its `episode` field; a 400 when the two disagree or a key is malformed."""
    key, task = headers.get(EPISODE_HEADER), headers.get(TASK_HEADER)
    if key is None:
        if task is not None:
            raise InvalidRequest(f"{TASK_HEADER} needs {EPISODE_HEADER}: name the episode too", param=TASK_HEADER)
        return body.episode
    try:
        mark = EpisodeMark(id=key, task=task)
    except ValidationError:
        raise InvalidRequest(
            f"{EPISODE_HEADER} and {TASK_HEADER} are 1 to 128 letters, digits, '_', '.', ':' or '-', starting with a "
            f"letter or digit; got {key!r}" + (f" and {task!r}" if task is not None else ""),
            param=EPISODE_HEADER,
        ) from None
    if body.episode is not None and body.episode != mark:
        raise InvalidRequest(
            f"the request names episode {body.episode.id!r} in its body and {key!r} in {EPISODE_HEADER}; give one",
            param="episode",
        )
    return mark


def _mint_field(plan: ServingPlan, served: ServedBy) -> dict[str, Any]:
    return {
        "adapter": served.adapter,
        "adapter_sha256": served.sha256,
        "base_model": plan.base_model,
        "deployment": plan.deployment,
        "revision": plan.revision,
        "route": served.route,
    }


def _node_request(
    plan: ServingPlan, body: ChatCompletionCreate | CompletionCreate, *, prompt_token_ids: bool = False
) -> NodeCompletion:
    """The one request a node serves, built from OpenAI's body and the model the plan resolved."""
    prompt: dict[str, Any]
    if isinstance(body, ChatCompletionCreate):
        messages = [message.model_dump(exclude_none=True) for message in body.messages]
        for message in messages:
            if message["role"] == "developer":
                message["role"] = "system"
        prompt = {"messages": messages, "tools": body.tools}
    else:
        prompt = {"prompt": body.prompt}
    return NodeCompletion(
        **prompt,
        adapter=plan.adapter,
        mixture=plan.mixture,
        metadata=body.metadata or {},
        max_tokens=body.token_limit,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stops,
        n=body.n,
        stream=True,
        logprobs=body.alternatives is not None,
        top_logprobs=body.alternatives or 0,
        prompt_token_ids=prompt_token_ids,
    )


def _logprobs(
    content: list[TokenLogprobEntry], body: ChatCompletionCreate | CompletionCreate, offset: int = 0
) -> dict[str, Any]:
    """OpenAI's `choice.logprobs` of the tokens whose chat entries (from the node) are `content`;
    for a text completion, `offset` is the completion's characters before the first of them."""
    if isinstance(body, ChatCompletionCreate):
        return {"content": [entry.model_dump() for entry in content], "refusal": None}
    offsets = []
    at = len(body.prompt) + offset
    for entry in content:
        offsets.append(at)
        at += len(entry.token)
    tops = None
    if body.alternatives:
        tops = []
        for entry in content:
            top: dict[str, float] = {}
            for other in entry.top_logprobs:
                top.setdefault(other.token, other.logprob)  # two tokens may share a (lossy) text
            tops.append(top)
    return {
        "tokens": [entry.token for entry in content],
        "token_logprobs": [entry.logprob for entry in content],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


async def _serve(
    request_body: ChatCompletionCreate | CompletionCreate,
    settings: Settings,
    principal: Principal,
    captures: CaptureWriter,
    request_headers: Headers,
) -> Response:
    started = time.perf_counter()
    chat = isinstance(request_body, ChatCompletionCreate)
    if (
        isinstance(request_body, ChatCompletionCreate)
        and request_body.top_logprobs is not None
        and not request_body.logprobs
    ):
        raise InvalidRequest("top_logprobs needs logprobs: set logprobs to true to use it", param="top_logprobs")
    mark = _episode_mark(request_body, request_headers)
    plan, nodes = await run_in_threadpool(_plan, settings, principal, request_body.model)
    capturing = plan.capture is not None and plan.capture.chosen()  # decided once, before serving
    recording = records_episode(plan.capture, mark)
    if recording and request_body.n > 1:
        raise InvalidRequest("a turn of an episode is one completion: send n = 1", param="n")
    node_body = _node_request(plan, request_body, prompt_token_ids=recording)
    completion_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    keeping = _Keeping(
        captures,
        principal,
        plan,
        request_body,
        completion_id,
        capture=capturing,
        episode=mark if recording else None,
        started=started,
    )
    created = int(time.time())
    # A node's refusal is raised here, before any response starts; a node that died is passed
    # over: until the first line of a stream, and until the last of a whole answer.
    if request_body.stream:
        first, lines = await open_stream(nodes, node_body)
    else:
        first, rest = await complete_lines(nodes, node_body)
    served = first.served
    mint = _mint_field(plan, served)
    headers = {"X-Mint-Adapter": served.adapter or plan.base_model}
    if mark is not None:
        headers[RECORDED_HEADER] = "true" if recording else "false"
    if request_body.stream:
        kept = keeping if keeping.anything else None
        events = _sse(lines, request_body, plan, mint, settings, principal, completion_id, created, chat, kept)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    choices = _Choices()
    counted = _StreamedUsage()
    for line in rest:
        counted.add(line)
        choices.add(line)
    usage = counted.usage()
    if keeping.anything:
        keeping.offer(served.adapter, choices, usage)
    await run_in_threadpool(_record, settings, principal, plan, served.adapter, usage["total_tokens"])
    await keeping.landed(settings.capture_wait_s)  # the rows are written before the answer goes out
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": request_body.model,
        "choices": [
            _choice(index, choice, request_body, request_body.alternatives is not None)
            for index, choice in choices.in_order()
        ],
        "usage": usage,
        "system_fingerprint": (served.sha256 or "")[:16] or None,
        "mint": mint,
    }
    return JSONResponse(body, headers=headers)


def _choice(
    index: int, choice: dict[str, Any], body: ChatCompletionCreate | CompletionCreate, with_logprobs: bool
) -> dict[str, Any]:
    text = "".join(choice["text"])
    logprobs = _logprobs(choice["logprobs_content"], body) if with_logprobs else None
    finish = choice.get("finish_reason", "length")
    if isinstance(body, ChatCompletionCreate):
        message = choice.get("message") or {"role": "assistant", "content": text}
        return {
            "index": index,
            "message": message,
            "finish_reason": "tool_calls" if message.get("tool_calls") else finish,
            "logprobs": logprobs,
        }
    return {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}


async def _sse(
    lines: AsyncGenerator[NodeChoiceLine, None],
    request_body: ChatCompletionCreate | CompletionCreate,
    plan: ServingPlan,
    mint: dict[str, Any],
    settings: Settings,
    principal: Principal,
    completion_id: str,
    created: int,
    chat: bool,
    keeping: _Keeping | None,
) -> AsyncIterator[bytes]:
    """OpenAI's server-sent events; the first chunk of each choice carries the role and `mint`.
    A stream that ends whole is kept (`keeping`: captured, or an episode's turn recorded) from
    the node's lines, its last chunk sent once its rows are written."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    started: set[int] = set()
    offsets: dict[int, int] = {}  # each choice's characters of token text streamed so far
    served = _StreamedUsage()
    answer = _Choices() if keeping is not None else None
    recorded = False

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {
            "id": completion_id,
            "object": kind,
            "created": created,
            "model": request_body.model,
            "choices": choices,
        }
        return f"data: {json.dumps(body | extra)}\n\n".encode()

    try:
        async for line in lines:
            index = line.choice
            finish = line.finish_reason
            extra = {"mint": mint} if index not in started else {}
            if chat:
                delta: dict[str, Any] = {"content": line.text}
                if index not in started:
                    delta["role"] = "assistant"
                message = line.message or {}
                if finish and message.get("tool_calls"):
                    delta["tool_calls"] = [{**call, "index": n} for n, call in enumerate(message["tool_calls"])]
                    finish = "tool_calls"
                piece = {"index": index, "delta": delta, "finish_reason": finish}
            else:
                piece = {"index": index, "text": line.text, "finish_reason": finish}
            if request_body.alternatives is not None:
                content = line.logprobs_content or []
                piece["logprobs"] = _logprobs(content, request_body, offsets.get(index, 0))
                offsets[index] = offsets.get(index, 0) + sum(len(entry.token) for entry in content)
            started.add(index)
            served.add(line)
            if answer is not None:
                answer.add(line)
            yield chunk([piece], **extra)
        usage = served.usage()
        recorded = True
        if keeping is not None and answer is not None:
            keeping.offer(mint.get("adapter"), answer, usage)
        await run_in_threadpool(_record, settings, principal, plan, mint.get("adapter"), usage["total_tokens"])
        if keeping is not None:
            await keeping.landed(settings.capture_wait_s)
        yield chunk([], usage=usage)
        yield b"data: [DONE]\n\n"
    except MintError as error:
        yield f"data: {json.dumps({'error': {'type': error.type, 'message': error.message}})}\n\n".encode()
    finally:
        with anyio.CancelScope(shield=True):  # a disconnect cancels this task
            await lines.aclose()  # the node's connection, and its count of requests in flight
            if not recorded:  # the client went away, or the node failed mid-stream: what was sent is counted
                tokens = served.usage()["total_tokens"]
                await run_in_threadpool(_record, settings, principal, plan, mint.get("adapter"), tokens)


SSE = {"text/event-stream": {"schema": {"type": "string", "description": "OpenAI's server-sent events."}}}


@router.post("/v1/chat/completions", response_model=None, responses={200: {"model": ChatCompletion, "content": SSE}})
async def chat_completions(
    body: ChatCompletionCreate, request: Request, settings: SettingsDep, principal: BriefPrincipal
) -> Response:
    """OpenAI's chat completions, streaming included, on a base, an adapter version or a deployment.
    A deployment that captures traffic records the share of requests its rate chooses."""
    return await _serve(body, settings, principal, request.app.state.capture_writer, request.headers)


@router.post("/v1/completions", response_model=None, responses={200: {"model": TextCompletion, "content": SSE}})
async def completions(
    body: CompletionCreate, request: Request, settings: SettingsDep, principal: BriefPrincipal
) -> Response:
    """OpenAI's text completions: the prompt is continued as is, without a chat template."""
    return await _serve(body, settings, principal, request.app.state.capture_writer, request.headers)


def _models(settings: Settings, principal: Principal) -> list[dict[str, Any]]:
    with session_scope(settings.database) as session:
        return [
            {"id": name, "object": "model", "created": int(created.timestamp()), "owned_by": owner}
            for name, created, owner in available_models(session, principal.organization_id)
        ]


@router.get("/v1/models", response_model=ModelList)
async def list_models(settings: SettingsDep, principal: BriefPrincipal) -> dict[str, Any]:
    """Every model this organization can send: bases, adapter versions (`name@N`) and deployments."""
    return {"object": "list", "data": await run_in_threadpool(_models, settings, principal)}


@router.get("/v1/models/{model}", response_model=ModelCard)
async def get_model(model: ModelName, settings: SettingsDep, principal: BriefPrincipal) -> dict[str, Any]:
    for entry in await run_in_threadpool(_models, settings, principal):
        if entry["id"] == model:
            return entry
    raise NotFound(f"no model {model!r}; list them at /v1/models", param="model")

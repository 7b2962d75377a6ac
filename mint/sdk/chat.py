"""OpenAI-compatible inference: `client.chat.create(model, messages, stream=...)` and
`client.completions.create(model, prompt, stream=...)`, on a base, an `adapter@version` or a
deployment name.

A whole answer is the server's `ChatCompletion` (or `TextCompletion`), whose `mint` field
names the adapter version that served it. With `stream=True` the answer arrives as OpenAI's
server-sent events: a `Stream` yields each chunk as it comes, `text_deltas()` only the new
text, and after the last chunk `served`, `usage` and `text` hold the whole answer's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from types import TracebackType
from typing import Any, Literal, overload

import httpx
from pydantic import BaseModel, ConfigDict

from mint.schemas.inference import (
    ChatCompletion,
    ChatCompletionCreate,
    ChatMessage,
    CompletionCreate,
    Served,
    TextCompletion,
    Usage,
)
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_model, request_body
from mint.sdk.errors import error_from_body

Message = ChatMessage | dict[str, Any]


# ---- streamed chunks -----------------------------------------------------------------------
# The server writes these with json.dumps (mint/api/openai.py `_sse`); they have no schema in
# mint.schemas, so the SDK declares their shape here, as OpenAI documents it.


class ChunkDelta(BaseModel):
    """What a chat chunk adds to the assistant's message."""

    model_config = ConfigDict(extra="allow")

    role: str | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(BaseModel):
    model_config = ConfigDict(extra="allow")

    index: int
    delta: ChunkDelta | None = None  # chat completions
    text: str | None = None  # text completions
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None

    @property
    def content(self) -> str:
        """The new text of this chunk, for chat and text completions alike."""
        return (self.delta.content if self.delta is not None else self.text) or ""


class CompletionChunk(BaseModel):
    """One server-sent event of a streamed answer; the first of each choice carries `mint`, the last `usage`."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["chat.completion.chunk", "text_completion"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    mint: Served | None = None


def parse_event(line: str) -> CompletionChunk | None:
    """A chunk from one SSE line; None for blank lines, comments and the final `[DONE]`.

    An error that the server met mid-stream (after the 200 status) is raised as its typed error.
    """
    if not line.startswith("data:"):
        return None
    payload = line[len("data:") :].strip()
    if not payload or payload == "[DONE]":
        return None
    body = json.loads(payload)
    if "error" in body:
        raise error_from_body(None, body)
    return CompletionChunk.model_validate(body)


class _StreamState:
    """What a stream has gathered so far: the whole text of choice 0, what served it, the usage."""

    def __init__(self) -> None:
        self.text = ""
        self.served: Served | None = None
        self.usage: Usage | None = None

    def take(self, chunk: CompletionChunk) -> CompletionChunk:
        if chunk.mint is not None and self.served is None:
            self.served = chunk.mint
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices:
            if choice.index == 0:
                self.text += choice.content
        return chunk


class Stream(_StreamState):
    """A streamed answer: iterate for chunks, or `text_deltas()` for text. Close it (or use `with`)
    to stop early; reading it to the end closes it."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__()
        self.response = response

    def __iter__(self) -> Iterator[CompletionChunk]:
        try:
            for line in self.response.iter_lines():
                chunk = parse_event(line)
                if chunk is not None:
                    yield self.take(chunk)
        finally:
            self.close()

    def text_deltas(self) -> Iterator[str]:
        """The new text of each chunk of choice 0, as it arrives."""
        for chunk in self:
            for choice in chunk.choices:
                if choice.index == 0 and choice.content:
                    yield choice.content

    def close(self) -> None:
        self.response.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class AsyncStream(_StreamState):
    """A streamed answer for asyncio: `async for chunk in stream`, or `text_deltas()`."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__()
        self.response = response

    async def __aiter__(self) -> AsyncIterator[CompletionChunk]:
        try:
            async for line in self.response.aiter_lines():
                chunk = parse_event(line)
                if chunk is not None:
                    yield self.take(chunk)
        finally:
            await self.close()

    async def text_deltas(self) -> AsyncIterator[str]:
        async for chunk in self:
            for choice in chunk.choices:
                if choice.index == 0 and choice.content:
                    yield choice.content

    async def close(self) -> None:
        await self.response.aclose()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()


# ---- the calls ---------------------------------------------------------------------------------


def chat_call(model: str, messages: Sequence[Message], stream: bool, params: dict[str, Any]) -> Call[ChatCompletion]:
    body = request_body(ChatCompletionCreate, model=model, messages=list(messages), stream=stream or None, **params)
    return Call("POST", "/v1/chat/completions", parse_model(ChatCompletion), json=body)


def completion_call(model: str, prompt: str, stream: bool, params: dict[str, Any]) -> Call[TextCompletion]:
    body = request_body(CompletionCreate, model=model, prompt=prompt, stream=stream or None, **params)
    return Call("POST", "/v1/completions", parse_model(TextCompletion), json=body)


# ---- resources -------------------------------------------------------------------------------


class Chat:
    """`/v1/chat/completions`. `client.chat.completions.create` is the same method, as in `openai`."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    @property
    def completions(self) -> Chat:
        return self

    @overload
    def create(
        self, model: str, messages: Sequence[Message], *, stream: Literal[False] = False, **params: Any
    ) -> ChatCompletion: ...

    @overload
    def create(self, model: str, messages: Sequence[Message], *, stream: Literal[True], **params: Any) -> Stream: ...

    def create(
        self, model: str, messages: Sequence[Message], *, stream: bool = False, **params: Any
    ) -> ChatCompletion | Stream:
        """Answer `messages` with `model`; `params` are OpenAI's (max_tokens, temperature, top_p,
        seed, stop, n, logprobs, top_logprobs, tools, metadata). With `stream=True`, returns a `Stream`."""
        call = chat_call(model, messages, stream, params)
        if stream:
            return Stream(self._http.open_stream(call))
        return self._http.send(call)


class Completions:
    """`/v1/completions`: the prompt is continued as is, without a chat template."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    @overload
    def create(self, model: str, prompt: str, *, stream: Literal[False] = False, **params: Any) -> TextCompletion: ...

    @overload
    def create(self, model: str, prompt: str, *, stream: Literal[True], **params: Any) -> Stream: ...

    def create(self, model: str, prompt: str, *, stream: bool = False, **params: Any) -> TextCompletion | Stream:
        call = completion_call(model, prompt, stream, params)
        if stream:
            return Stream(self._http.open_stream(call))
        return self._http.send(call)


class AsyncChat:
    """`/v1/chat/completions`, for asyncio: the twin of `Chat`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    @property
    def completions(self) -> AsyncChat:
        return self

    @overload
    async def create(
        self, model: str, messages: Sequence[Message], *, stream: Literal[False] = False, **params: Any
    ) -> ChatCompletion: ...

    @overload
    async def create(
        self, model: str, messages: Sequence[Message], *, stream: Literal[True], **params: Any
    ) -> AsyncStream: ...

    async def create(
        self, model: str, messages: Sequence[Message], *, stream: bool = False, **params: Any
    ) -> ChatCompletion | AsyncStream:
        call = chat_call(model, messages, stream, params)
        if stream:
            return AsyncStream(await self._http.open_stream(call))
        return await self._http.send(call)


class AsyncCompletions:
    """`/v1/completions`, for asyncio: the twin of `Completions`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    @overload
    async def create(
        self, model: str, prompt: str, *, stream: Literal[False] = False, **params: Any
    ) -> TextCompletion: ...

    @overload
    async def create(self, model: str, prompt: str, *, stream: Literal[True], **params: Any) -> AsyncStream: ...

    async def create(
        self, model: str, prompt: str, *, stream: bool = False, **params: Any
    ) -> TextCompletion | AsyncStream:
        call = completion_call(model, prompt, stream, params)
        if stream:
            return AsyncStream(await self._http.open_stream(call))
        return await self._http.send(call)

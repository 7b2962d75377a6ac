"""The SDK's HTTP layer: what one request is, and how it is retried (where the client connects
is `mint.sdk.connection`).

A resource method describes its request as a `Call` (method, path, body, and how to parse the
answer), and hands it to `SyncHTTP` or `AsyncHTTP`; the two share everything but the waiting,
so `Mint` and `AsyncMint` behave the same, and so does every command of `mint`, which uses the
SDK. This is the one place where requests are retried:

- a 429 (the key's rate limit, the organization's quota, a serving node's full queue) means
  "not now": the request is sent again after the pause its `Retry-After` asks for (backing off
  when it gives none), as long as the pauses of one request add up to at most
  `max_rate_limit_wait_s` (300 s by default); a longer ask is raised at once as
  `RateLimitError`, whose `retry_after_s` says how long the server asked to wait;
- a 5xx answer, or no answer at all, is sent again at most `max_retries` times with exponential
  backoff (honouring a `Retry-After` up to a minute);
- `max_retries=0` turns both off.

A 429 is answered before anything is done, so sending the request again is safe whatever its
method. Error answers become the typed errors of `mint.sdk.errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import io
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Generic, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from mint import __version__, errors

# Where to connect is `mint.sdk.connection`'s; its names stay importable from here too.
from mint.sdk.connection import API_URL_FILE as API_URL_FILE
from mint.sdk.connection import DEFAULT_BASE_URL as DEFAULT_BASE_URL
from mint.sdk.connection import found_base_url as found_base_url
from mint.sdk.connection import local_api_url as local_api_url
from mint.sdk.connection import mint_home as mint_home
from mint.sdk.connection import resolve_api_key as resolve_api_key
from mint.sdk.errors import (
    APIConnectionError,
    APITimeoutError,
    BadRequestError,
    MintAPIError,
    error_from_body,
)

log = logging.getLogger("mint.sdk")

T = TypeVar("T")
ModelT = TypeVar("ModelT", bound=BaseModel)

# Generation on a large base can take minutes before the first byte of a non-streamed answer.
DEFAULT_TIMEOUT_S = 600.0
CONNECT_TIMEOUT_S = 10.0
DEFAULT_MAX_RETRIES = 3
INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
# A failing server (5xx) asking for a longer pause than this gets this; a client should not
# sleep for hours on a server that is down.
MAX_RETRY_AFTER_S = 60.0
# How long one request may wait out 429s, in all, before the RateLimitError is raised.
DEFAULT_MAX_RATE_LIMIT_WAIT_S = 300.0
# The shortest pause after a 429, whatever its Retry-After says: a request sent straight back
# is refused again.
MIN_RATE_LIMIT_PAUSE_S = 0.5

# What an upload accepts: a path, the bytes themselves, or an open binary file.
FileInput = str | os.PathLike[str] | bytes | IO[bytes]


# ---- one request -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Upload:
    """A multipart upload: one file field plus form fields; opened afresh for every attempt."""

    source: FileInput
    filename: str
    form: Mapping[str, str] = field(default_factory=dict)
    field_name: str = "file"
    content_type: str = "application/jsonl"

    @contextlib.contextmanager
    def opened(self) -> Iterator[dict[str, Any]]:
        """httpx's `files` argument, reading the source from its start (a retry resends it whole)."""
        source = self.source
        if isinstance(source, bytes):
            yield {self.field_name: (self.filename, io.BytesIO(source), self.content_type)}
        elif isinstance(source, str | os.PathLike):
            with open(source, "rb") as handle:  # noqa: PTH123 - a path or a str, opened once per attempt
                yield {self.field_name: (self.filename, handle, self.content_type)}
        else:
            if source.seekable():
                source.seek(0)
            yield {self.field_name: (self.filename, source, self.content_type)}


def filename_of(source: FileInput, filename: str | None, default: str = "upload.jsonl") -> str:
    if filename:
        return filename
    if isinstance(source, str | os.PathLike):
        return Path(source).name
    name = getattr(source, "name", None)
    return Path(name).name if isinstance(name, str) else default


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request and how to read its answer; sent by `SyncHTTP` or `AsyncHTTP`."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    upload: Upload | None = None
    headers: Mapping[str, str] | None = None

    def query(self) -> dict[str, Any] | None:
        """Query parameters without the unset ones; booleans as the API spells them."""
        if not self.params:
            return None
        return {
            name: (str(value).lower() if isinstance(value, bool) else value)
            for name, value in self.params.items()
            if value is not None
        }


def parse_model(cls: type[ModelT]) -> Callable[[httpx.Response], ModelT]:
    """Read a JSON answer as `cls` (a schema of `mint.schemas`, or an SDK subclass of one)."""
    return lambda response: cls.model_validate(response.json())


def parse_list(cls: type[ModelT]) -> Callable[[httpx.Response], list[ModelT]]:
    # pydantic builds the validator from list[cls] at run time; mypy cannot type a class held in a variable.
    adapter = TypeAdapter(list[cls])  # type: ignore[valid-type]
    return lambda response: adapter.validate_python(response.json())


def parse_bytes(response: httpx.Response) -> bytes:
    return response.content


def request_body(cls: type[ModelT], **fields: Any) -> dict[str, Any]:
    """Validate arguments with the server's request schema and dump what was given.

    Mistakes are caught before anything is sent, as `BadRequestError` naming the field, in the
    words the server would use.
    """
    try:
        body = cls.model_validate({name: value for name, value in fields.items() if value is not None})
    except ValidationError as exc:
        problems = exc.errors()
        param = ".".join(str(part) for part in problems[0]["loc"]) if problems else None
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in problems[:10])
        raise BadRequestError(f"Invalid request: {details}", param=param, error_type="invalid_request_error") from exc
    return body.model_dump(mode="json", exclude_unset=True)


# ---- retries ---------------------------------------------------------------------------------


def should_retry(status_code: int) -> bool:
    """429 (slow down) and every 5xx (the server or a service behind it failed) are worth another try."""
    return status_code == 429 or status_code >= 500


@dataclass
class Attempts:
    """What one request has spent on retries so far: failures retried, and seconds paused on 429s."""

    failures: int = 0
    rate_limited: int = 0
    rate_limited_s: float = 0.0


def retry_after_s(value: str | None) -> float | None:
    """`Retry-After` as seconds: a number, or an HTTP date; None if absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - datetime.now(UTC)).total_seconds())


def backoff_s(attempt: int, retry_after: str | None) -> float:
    """How long to wait before retry number `attempt + 1`.

    The server's `Retry-After` when it gives one (capped at MAX_RETRY_AFTER_S); otherwise
    0.5 s, 1 s, 2 s, ... up to MAX_BACKOFF_S, less up to a quarter at random so that many
    clients refused together do not come back together.
    """
    asked = retry_after_s(retry_after)
    if asked is not None:
        return min(asked, MAX_RETRY_AFTER_S)
    delay = min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * float(2**attempt))
    return delay * (1 - 0.25 * random.random())


def error_for(response: httpx.Response) -> MintAPIError:
    """The typed error of an error answer (its body must have been read); a 429's
    `retry_after_s` is its `Retry-After`."""
    try:
        body = response.json()
    except ValueError:
        body = None
    error = error_from_body(response.status_code, body, response.text)
    if isinstance(error, errors.RateLimited):
        asked = retry_after_s(response.headers.get("retry-after"))
        error.retry_after_s = max(1, math.ceil(asked)) if asked is not None else 1
    return error


def _transport_error(exc: httpx.TransportError, url: str, source: str) -> APIConnectionError:
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"{url} did not answer in time ({type(exc).__name__}); retry, or raise timeout_s")
    return APIConnectionError(
        f"could not reach Mint at {url} ({source}): {exc or type(exc).__name__}. Start it with `mint up`, or "
        "point MINT_BASE_URL (or MINT_API_PORT, for a local API) at the one running"
    )


def _headers(api_key: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {api_key}",
        "User-Agent": f"mint-sdk/{__version__}",
        "Accept": "application/json",
    }


def _timeout(timeout_s: float) -> httpx.Timeout:
    return httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))


class _Retrying:
    """What both transports share: settings, and the decision after each attempt."""

    def __init__(self, base_url: str, max_retries: int, max_rate_limit_wait_s: float, base_url_source: str) -> None:
        self.base_url = base_url
        self.base_url_source = base_url_source
        self.max_retries = max_retries
        self.max_rate_limit_wait_s = max_rate_limit_wait_s

    def _next_delay(self, call: Call[Any], spent: Attempts, outcome: httpx.Response | httpx.TransportError) -> float:
        """The pause before retrying (counted in `spent`), or raise the error if this outcome is final."""
        if isinstance(outcome, httpx.TransportError):
            if spent.failures >= self.max_retries:
                raise _transport_error(outcome, self.base_url, self.base_url_source) from outcome
            delay = backoff_s(spent.failures, None)
            reason = type(outcome).__name__
        elif outcome.status_code == 429:  # an answer of any httpx-like client (Starlette's TestClient too)
            return self._rate_limit_pause(call, spent, outcome)
        else:
            if not should_retry(outcome.status_code) or spent.failures >= self.max_retries:
                raise error_for(outcome)
            delay = backoff_s(spent.failures, outcome.headers.get("retry-after"))
            reason = f"HTTP {outcome.status_code}"
        spent.failures += 1
        what = f"{call.method} {call.path}: {reason}"
        log.info("%s; retry %d of %d in %.2fs", what, spent.failures, self.max_retries, delay)
        return delay

    def _rate_limit_pause(self, call: Call[Any], spent: Attempts, refused: httpx.Response) -> float:
        """Wait as a 429 asks (its Retry-After, else backing off), within the request's budget of
        `max_rate_limit_wait_s`; past it, or with retries off, the RateLimitError is raised."""
        asked = retry_after_s(refused.headers.get("retry-after"))
        if asked is None:
            asked = min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * float(2**spent.rate_limited))
        delay = max(MIN_RATE_LIMIT_PAUSE_S, asked)
        if self.max_retries <= 0 or spent.rate_limited_s + delay > self.max_rate_limit_wait_s:
            raise error_for(refused)
        spent.rate_limited += 1
        spent.rate_limited_s += delay
        log.info("%s %s: HTTP 429; waiting %.2fs as asked, then again", call.method, call.path, delay)
        return delay


class SyncHTTP(_Retrying):
    """Sends `Call`s with httpx's blocking client."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float,
        max_retries: int,
        max_rate_limit_wait_s: float = DEFAULT_MAX_RATE_LIMIT_WAIT_S,
        http_client: httpx.Client | None = None,
        base_url_source: str = "as given",
    ) -> None:
        super().__init__(base_url, max_retries, max_rate_limit_wait_s, base_url_source)
        if http_client is None:
            http_client = httpx.Client(base_url=base_url, timeout=_timeout(timeout_s))
        http_client.headers.update(_headers(api_key))
        self.client = http_client

    def send(self, call: Call[T]) -> T:
        """Send `call` (retrying as needed) and parse its answer."""
        return call.parse(self._send(call, stream=False))

    def open_stream(self, call: Call[Any]) -> httpx.Response:
        """Send `call` and return the answer unread, for streaming; the caller closes it."""
        return self._send(call, stream=True)

    def _send(self, call: Call[Any], *, stream: bool) -> httpx.Response:
        spent = Attempts()
        while True:
            outcome: httpx.Response | httpx.TransportError
            try:
                with contextlib.ExitStack() as stack:
                    files = stack.enter_context(call.upload.opened()) if call.upload else None
                    request = self.client.build_request(
                        call.method,
                        call.path,
                        params=call.query(),
                        json=call.json,
                        files=files,
                        data=dict(call.upload.form) if call.upload else None,
                        headers=call.headers,
                    )
                    outcome = self.client.send(request, stream=stream)
                if outcome.is_success:
                    return outcome
                outcome.read()
                outcome.close()
            except httpx.TransportError as exc:
                outcome = exc
            time.sleep(self._next_delay(call, spent, outcome))

    def close(self) -> None:
        self.client.close()


class AsyncHTTP(_Retrying):
    """Sends `Call`s with httpx's asyncio client."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float,
        max_retries: int,
        max_rate_limit_wait_s: float = DEFAULT_MAX_RATE_LIMIT_WAIT_S,
        http_client: httpx.AsyncClient | None = None,
        base_url_source: str = "as given",
    ) -> None:
        super().__init__(base_url, max_retries, max_rate_limit_wait_s, base_url_source)
        if http_client is None:
            http_client = httpx.AsyncClient(base_url=base_url, timeout=_timeout(timeout_s))
        http_client.headers.update(_headers(api_key))
        self.client = http_client

    async def send(self, call: Call[T]) -> T:
        """Send `call` (retrying as needed) and parse its answer."""
        return call.parse(await self._send(call, stream=False))

    async def open_stream(self, call: Call[Any]) -> httpx.Response:
        """Send `call` and return the answer unread, for streaming; the caller closes it."""
        return await self._send(call, stream=True)

    async def _send(self, call: Call[Any], *, stream: bool) -> httpx.Response:
        spent = Attempts()
        while True:
            outcome: httpx.Response | httpx.TransportError
            try:
                with contextlib.ExitStack() as stack:
                    # httpx reads a multipart body synchronously, even in its async client.
                    files = stack.enter_context(call.upload.opened()) if call.upload else None
                    request = self.client.build_request(
                        call.method,
                        call.path,
                        params=call.query(),
                        json=call.json,
                        files=files,
                        data=dict(call.upload.form) if call.upload else None,
                        headers=call.headers,
                    )
                    outcome = await self.client.send(request, stream=stream)
                if outcome.is_success:
                    return outcome
                await outcome.aread()
                await outcome.aclose()
            except httpx.TransportError as exc:
                outcome = exc
            await asyncio.sleep(self._next_delay(call, spent, outcome))

    async def close(self) -> None:
        await self.client.aclose()

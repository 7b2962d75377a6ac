"""The id of the request a process is working for, and the log lines that carry it.

The API gives every request an id (the client's `X-Request-Id` when it sends a well-formed one,
else a new `req_...`) and answers with it. The id travels with the work the request starts: in
the header of the queue message a route sends (a fine-tuning job, an eval run, a Tinker request)
and in the `X-Request-Id` of a call to a serving node. The worker and the node then work under
the same id, so one `grep req_...` across the API's, the worker's and the node's logs finds
every line about that request. Every log line of a Mint process carries the id in brackets
(`-` for work no request started).
"""

from __future__ import annotations

import logging
import re
import secrets
from contextvars import ContextVar, Token

HEADER = "X-Request-Id"
# The key of the id in a queue message's headers.
MESSAGE_HEADER = "mint_request_id"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
# What a client may send as its own id: short, printable, safe in a log line.
_WELL_FORMED = re.compile(r"[A-Za-z0-9._:-]{1,64}")

_current: ContextVar[str | None] = ContextVar("mint_request_id", default=None)


def current() -> str | None:
    """The id of the request this code runs for, if any."""
    return _current.get()


def new_id() -> str:
    return f"req_{secrets.token_hex(8)}"


def accepted(sent: str | None) -> str:
    """The id to work under: the one the caller sent, when well formed, else a new one."""
    return sent if sent is not None and _WELL_FORMED.fullmatch(sent) else new_id()


def begin(request_id: str | None) -> Token[str | None]:
    """Work under `request_id` from now on in this context; returns the token `end` takes."""
    return _current.set(request_id)


def end(token: Token[str | None]) -> None:
    _current.reset(token)


class RequestIdFilter(logging.Filter):
    """Stamps every record with the current request's id (`-` outside a request), so that a
    format naming `%(request_id)s` never fails."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current() or "-"
        return True


def install(handlers: list[logging.Handler] | None = None) -> None:
    """Give the root logger's handlers (or `handlers`) the request id and Mint's line format."""
    for handler in handlers if handlers is not None else logging.getLogger().handlers:
        if not any(isinstance(existing, RequestIdFilter) for existing in handler.filters):
            handler.addFilter(RequestIdFilter())
        handler.setFormatter(logging.Formatter(LOG_FORMAT))

"""One table from MintError to HTTP, and the one error body `{"error": {type, message, param}}`.

Every error a client sees goes through here: Mint's own, request validation (422, naming
the field), unknown routes and methods, and unexpected failures (500, logged, no detail
leaked).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mint import errors
from mint.schemas.common import ErrorBody, ErrorDetail

log = logging.getLogger(__name__)

STATUS_BY_ERROR: dict[type[errors.MintError], int] = {
    errors.InvalidRequest: 400,
    errors.Unauthenticated: 401,
    errors.PermissionDenied: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.Gone: 410,
    errors.SpendLimitExceeded: 402,
    errors.PayloadTooLarge: 413,
    errors.QuotaExceeded: 429,
    errors.RateLimited: 429,
    errors.ServiceUnavailable: 503,
    errors.ConfigurationError: 500,
    errors.MintError: 500,
}

HTTP_ERROR_TYPES = {404: "not_found_error", 405: "method_not_allowed_error", 401: "authentication_error"}

# Documented on every route, so the OpenAPI document shows the error body.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": description}
    for code, description in {
        400: "Invalid request",
        401: "Missing, unknown, revoked or expired API key",
        403: "The key's role does not allow this",
        404: "Not found in this organization",
        422: "The body or a parameter failed validation",
    }.items()
}


def status_for(error: errors.MintError) -> int:
    for cls in type(error).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return 500


def error_response(status: int, type_: str, message: str, param: str | None = None, **headers: str) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(type=type_, message=message, param=param))
    return JSONResponse(status_code=status, content=body.model_dump(), headers=headers or None)


def mint_error_response(exc: errors.MintError) -> JSONResponse:
    """The answer to a MintError, through the one table (also used by the request gate, which
    answers before the app's exception handlers run)."""
    status = status_for(exc)
    # A MintError is a condition the code named and explained, never a crash: one line, no
    # traceback. A 503 (no serving node yet, a backing service down) is expected at start-up
    # and in a failover, so a warning; tracebacks are for the errors nobody raised on purpose
    # (`_unhandled`).
    if status == 503:
        log.warning("%s (503): %s", type(exc).__name__, exc.message)
    elif status >= 500:
        log.error("%s (%d): %s", type(exc).__name__, status, exc.message)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    if isinstance(exc, errors.RateLimited):
        headers["Retry-After"] = str(exc.retry_after_s)
    return error_response(status, exc.type, exc.message, exc.param, **headers)


async def _mint_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.MintError)
    return mint_error_response(exc)


# The tag pydantic adds to a location for each member of a union (`n_epochs: int | "auto"` fails
# at `n_epochs.constrained-int` and `n_epochs.literal['auto']`): not a field a client can name.
_UNION_MEMBER = re.compile(r"^(constrained-\w+|literal\[.*\]|function-\w+\[.*\]|int|float|str|bool|none)$")


def _field_path(location: tuple[Any, ...]) -> str:
    parts = [
        str(part)
        for part in location
        if part not in ("body", "query", "path", "header") and not _UNION_MEMBER.match(str(part))
    ]
    return ".".join(parts) or ".".join(str(part) for part in location)


def _telling(problems: list[Any]) -> list[Any]:
    """The problems worth reading: for a number sent to a `number | "auto"` field, the bound it
    broke, not also that it is not "auto"."""
    paths = {_field_path(tuple(p.get("loc", ()))) for p in problems if p.get("type") != "literal_error"}
    kept = [
        p for p in problems if p.get("type") != "literal_error" or _field_path(tuple(p.get("loc", ()))) not in paths
    ]
    return kept or problems


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = _telling(list(exc.errors()))
    first = problems[0] if problems else {"loc": (), "msg": "invalid request"}
    param = _field_path(tuple(first.get("loc", ())))
    details = "; ".join(f"{_field_path(tuple(p.get('loc', ())))}: {p.get('msg', '')}" for p in problems[:10])
    return error_response(422, "invalid_request_error", f"Invalid request: {details}", param)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = str(exc.detail) if exc.detail else "Error"
    if exc.status_code == 404 and message == "Not Found":
        message = "No such route. The API reference is at /docs."
    return error_response(exc.status_code, HTTP_ERROR_TYPES.get(exc.status_code, "http_error"), message)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "Internal server error; the server log has the details.")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(errors.MintError, _mint_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)

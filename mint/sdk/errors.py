"""Typed errors of the Mint SDK: one class per kind of HTTP answer, all `MintAPIError`.

The server answers every error with `{"error": {"type", "message", "param"}}`; the SDK raises
the class of its status with that message, so `except NotFoundError` reads like the API
reference. Each class also derives from the matching class of `mint.errors` (one error
hierarchy for the whole platform), so the `mint` command maps them to the same exit codes
as the server-side errors: `except mint.errors.NotFound` catches both.
"""

from __future__ import annotations

from typing import Any

from mint import errors


class MintAPIError(errors.MintError):
    """An error answer of the Mint API (or no answer at all, for `APIConnectionError`).

    `status_code` is the HTTP status (None when the request never got one); `type`, `message`
    and `param` are the server's; `body` is the whole decoded error body (a gate refusal
    carries `body["error"]["verdict"]`).
    """

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status_code: int | None = None,
        error_type: str | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.status_code = status_code
        if error_type is not None:
            self.type = error_type
        self.body = body or {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_api_error,
            (type(self), self.message, self.param, self.status_code, self.type, self.body),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status_code={self.status_code}, type={self.type!r}, message={self.message!r})"


def _rebuild_api_error(
    cls: type[MintAPIError], message: str, param: str | None, status: int | None, kind: str, body: dict[str, Any]
) -> MintAPIError:
    return cls(message, param=param, status_code=status, error_type=kind, body=body)


class BadRequestError(MintAPIError, errors.InvalidRequest):
    """400: the request is malformed or asks for something impossible (the message says what to fix).

    Also raised before sending, with no status, when arguments fail the request schema.
    """


class UnprocessableEntityError(BadRequestError):
    """422: a body field or parameter failed validation; `param` names it."""


class AuthenticationError(MintAPIError, errors.Unauthenticated):
    """401: no API key, or one that is unknown, revoked or expired."""


class SpendLimitExceededError(MintAPIError, errors.SpendLimitExceeded):
    """402: the work's estimated cost passes a spend limit of the organization or the job's own
    budget; the message gives the estimate, the limit and how to get under it."""


class PermissionDeniedError(MintAPIError, errors.PermissionDenied):
    """403: the key's role does not allow this (viewer keys cannot write)."""


class NotFoundError(MintAPIError, errors.NotFound):
    """404: no such resource in this organization, or no such route."""


class ConflictError(MintAPIError, errors.Conflict):
    """409: the request conflicts with the current state (a duplicate name, a finished job, a gate)."""

    @property
    def verdict(self) -> dict[str, Any] | None:
        """The gate's numbers when a deployment gate refused a promotion."""
        verdict = self.body.get("error", {}).get("verdict")
        return verdict if isinstance(verdict, dict) else None


class PayloadTooLargeError(MintAPIError, errors.PayloadTooLarge):
    """413: an upload is larger than the server's limit."""


class RateLimitError(MintAPIError, errors.RateLimited):
    """429: too many requests for this key (raised once the retries are spent)."""


class QuotaExceededError(RateLimitError, errors.QuotaExceeded):
    """429: the organization is at a quota (live Tinker sessions, jobs, eval runs); the message
    names it and how an operator raises it (raised once the retries are spent)."""


class InternalServerError(MintAPIError):
    """5xx: the server failed (raised once the retries are spent); its log has the details."""

    type = "internal_error"


class ServiceUnavailableError(InternalServerError, errors.ServiceUnavailable):
    """503: a backing service or serving node is unavailable (raised once the retries are spent)."""

    type = "service_unavailable_error"


class APIConnectionError(MintAPIError, errors.ServiceUnavailable):
    """The server could not be reached or did not answer in time (after the retries)."""

    type = "connection_error"


class APITimeoutError(APIConnectionError):
    """The request timed out (after the retries)."""

    type = "timeout_error"


class DownloadError(MintAPIError):
    """A downloaded archive is not what the server promised: wrong sha256, or unsafe entries."""

    type = "download_error"


class WaitTimeoutError(errors.MintError, TimeoutError):
    """`wait(timeout_s=...)` gave up before the job or eval run finished; it keeps running on the server."""

    type = "wait_timeout"


STATUS_ERRORS: dict[int, type[MintAPIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    402: SpendLimitExceededError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}

# The server's error types, for errors that arrive inside a stream (whose status was 200).
TYPE_ERRORS: dict[str, type[MintAPIError]] = {
    "invalid_request_error": BadRequestError,
    "authentication_error": AuthenticationError,
    "permission_error": PermissionDeniedError,
    "spend_limit_exceeded_error": SpendLimitExceededError,
    "not_found_error": NotFoundError,
    "conflict_error": ConflictError,
    "payload_too_large_error": PayloadTooLargeError,
    "rate_limit_error": RateLimitError,
    "quota_exceeded_error": QuotaExceededError,
    "service_unavailable_error": ServiceUnavailableError,
}


def error_class_for(status_code: int) -> type[MintAPIError]:
    """The class raised for an error status: its own, else the class of its hundred."""
    if status_code in STATUS_ERRORS:
        return STATUS_ERRORS[status_code]
    return InternalServerError if status_code >= 500 else MintAPIError


def error_from_body(status_code: int | None, body: Any, fallback_text: str = "") -> MintAPIError:
    """Build the typed error of a decoded error body (or of a body that is not Mint's shape)."""
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict):
        message = str(detail.get("message") or "the server gave no message")
        param = detail.get("param")
        kind = detail.get("type")
        cls = error_class_for(status_code) if status_code is not None else TYPE_ERRORS.get(str(kind), MintAPIError)
        refined = TYPE_ERRORS.get(str(kind))
        if refined is not None and issubclass(refined, cls):  # e.g. a 429 that is a quota, not a rate
            cls = refined
        return cls(
            message,
            param=str(param) if param is not None else None,
            status_code=status_code,
            error_type=str(kind) if kind else None,
            body=body,
        )
    message = fallback_text.strip()[:500] or f"HTTP {status_code} with no error body"
    cls = error_class_for(status_code) if status_code is not None else MintAPIError
    return cls(message, status_code=status_code, body={} if not isinstance(body, dict) else body)

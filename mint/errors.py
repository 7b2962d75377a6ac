"""Mint's one error hierarchy.

Every failure that a user or an operator can act on is a `MintError`. The classes know
nothing of HTTP: `mint.api.errors` maps each to a status code in one table. They are
picklable (Celery carries them between processes), so every constructor argument is kept
in `args` and restored by `__reduce__`.

Messages say what was wrong and how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class MintError(Exception):
    """Base of every error Mint raises on purpose.

    `type` is the machine-readable kind shown to clients; `param` names the offending
    field or argument where there is one.
    """

    type = "mint_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.param))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[MintError], message: str, param: str | None) -> MintError:
    return cls(message, param=param)


class InvalidRequest(MintError):
    """The request is malformed or asks for something impossible."""

    type = "invalid_request_error"


class Unauthenticated(MintError):
    """No credentials, or credentials that are unknown, revoked or expired."""

    type = "authentication_error"


class PermissionDenied(MintError):
    """The caller is known but its role does not allow the operation."""

    type = "permission_error"


class NotFound(MintError):
    """The resource does not exist, or belongs to another organization."""

    type = "not_found_error"


class Conflict(MintError):
    """The request conflicts with the current state (a duplicate name, an immutable object)."""

    type = "conflict_error"


class NoCapacity(Conflict):
    """A worker has no room for more work of this kind now (every LoRA session slot of its base
    is taken); work that meets it waits and tries again rather than failing."""

    type = "capacity_error"


class Gone(MintError):
    """The resource existed but has ended for good (a Tinker session that expired); make a new one."""

    type = "gone_error"


class PayloadTooLarge(MintError):
    """An upload is larger than the configured limit."""

    type = "payload_too_large_error"


class RateLimited(MintError):
    """Too many requests (for this key, or for a serving node's queue); retry after
    `retry_after_s` seconds (the `Retry-After` header of the 429)."""

    type = "rate_limit_error"

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: int = 1) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_rate_limited, (type(self), self.message, self.param, self.retry_after_s))


def _rebuild_rate_limited(cls: type[RateLimited], message: str, param: str | None, retry_after_s: int) -> MintError:
    return cls(message, param=param, retry_after_s=retry_after_s)


class QuotaExceeded(RateLimited):
    """The organization is at one of its quotas (live Tinker sessions, jobs, eval runs): a 429
    whose message names the quota, the count and how an operator raises it. Retrying helps
    once some of that work ends."""

    type = "quota_exceeded_error"


class SpendLimitExceeded(MintError):
    """Work whose estimated cost passes a spend limit of the organization or the job's own
    budget: a 402 whose message gives the estimate, the limit and how to get under it."""

    type = "spend_limit_exceeded_error"


class ServiceUnavailable(MintError):
    """A backing service (database, broker, object store) cannot be reached."""

    type = "service_unavailable_error"


class ConfigurationError(MintError):
    """Settings or a registry file are wrong; raised at start-up, never per request."""

    type = "configuration_error"


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """` (did you mean 'x'?)` naming the candidates closest to a mistyped `name` (at most three,
    closest first), or an empty string when none is close: for not-found messages."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.6)
    if not close:
        prefixed = sorted(candidate for candidate in set(candidates) if candidate.startswith(name) and name)
        close = prefixed[:3]
    return f" (did you mean {' or '.join(repr(candidate) for candidate in close)}?)" if close else ""

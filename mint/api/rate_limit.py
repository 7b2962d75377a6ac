"""Rate limits: at most `MINT_RATE_LIMIT` requests per API key, and at most
`MINT_ORG_RATE_LIMIT` per organization across all its keys (an organization's admin can make
more keys, so a per-key limit alone does not bound what one organization asks of the platform);
each counted in a moving window by the `limits` library.

The counts live where every API replica sees them: on Redis when the deployment runs on Redis
(the broker's, unless `MINT_RATE_LIMIT_STORAGE_URL` names another), in this process's memory
on the embedded defaults (one API process). The request gate (`mint.api.gate`) asks after it
has authenticated the key and before any body is read, so a client over a limit costs one
header check and a counter or two, never a body. Routes that need no key (health probes,
`/metrics`, `/docs`, the dashboard's files) are not counted.

A storage that cannot be reached lets requests through (and says so in the log): a rate limit
protects the platform, and a Redis outage should not turn into an outage of every route.
"""

from __future__ import annotations

import logging
import math
import time

from limits import RateLimitItem, parse_many
from limits.errors import StorageError
from limits.storage import Storage, storage_from_string
from limits.strategies import MovingWindowRateLimiter

from mint.config import Settings
from mint.errors import RateLimited

log = logging.getLogger(__name__)

KEY_PREFIX = "mint-rate"
# A slow Redis must not hold requests: beyond this the request goes through, unlimited.
REDIS_TIMEOUT_S = 2.0


def _storage(uri: str) -> Storage:
    if uri.startswith(("redis://", "rediss://", "redis+unix://")):
        storage = storage_from_string(
            uri,
            key_prefix=KEY_PREFIX,
            wrap_exceptions=True,
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
        )
    else:
        storage = storage_from_string(uri, wrap_exceptions=True)
    if not isinstance(storage, Storage):  # an `async+` URI: the limiter counts synchronously
        raise ValueError(f"rate limit storage {uri!r} is an asyncio one; name a synchronous storage")
    return storage


class RateLimiter:
    """The rate limits of API keys (`MINT_RATE_LIMIT`, each key alone) and of organizations
    (`MINT_ORG_RATE_LIMIT`, all of an organization's keys together), on one `limits` storage."""

    def __init__(self, storage_uri: str, *, key_rate: str = "", org_rate: str = "") -> None:
        self.key_items: list[RateLimitItem] = parse_many(key_rate) if key_rate else []
        self.org_items: list[RateLimitItem] = parse_many(org_rate) if org_rate else []
        self.storage = _storage(storage_uri)
        self._limiter = MovingWindowRateLimiter(self.storage)

    @classmethod
    def from_settings(cls, settings: Settings) -> RateLimiter | None:
        """The limiter of `settings.rate_limit` and `settings.org_rate_limit`, or None when both
        are empty (no limit)."""
        if not settings.rate_limit and not settings.org_rate_limit:
            return None
        return cls(settings.rate_limit_storage, key_rate=settings.rate_limit, org_rate=settings.org_rate_limit)

    def hit(self, key_id: str, organization_id: str) -> None:
        """Count one request of the key and of its organization; RateLimited (a 429 with
        Retry-After) if either is over. The key's own limit comes first, and a request it refuses
        is not counted against the organization: one key hammering past its limit does not use up
        the requests of its organization's other keys."""
        try:
            for item in self.key_items:
                if not self._limiter.hit(item, "key", key_id):
                    wait_s = self.retry_after_s(item, "key", key_id)
                    raise RateLimited(
                        f"Rate limit exceeded: this API key may make {item.amount} requests per {_window(item)}. "
                        f"Retry after {wait_s} s, spread requests out, or use a key per client "
                        "(operators set the limit with MINT_RATE_LIMIT).",
                        retry_after_s=wait_s,
                    )
            for item in self.org_items:
                if not self._limiter.hit(item, "org", organization_id):
                    wait_s = self.retry_after_s(item, "org", organization_id)
                    raise RateLimited(
                        f"Rate limit exceeded: this organization may make {item.amount} requests per "
                        f"{_window(item)}, all its API keys together. Retry after {wait_s} s or spread "
                        "requests out (operators set the limit with MINT_ORG_RATE_LIMIT).",
                        retry_after_s=wait_s,
                    )
        except StorageError as exc:
            log.warning("rate limit storage unavailable, request not counted: %s", exc.storage_error)

    def retry_after_s(self, item: RateLimitItem, scope: str, identifier: str) -> int:
        """Whole seconds until the oldest request in the window of `scope`/`identifier` leaves it
        (at least 1)."""
        try:
            reset_at = self._limiter.get_window_stats(item, scope, identifier).reset_time
        except StorageError:
            return 1
        return max(1, math.ceil(reset_at - time.time()))


def _window(item: RateLimitItem) -> str:
    unit = item.GRANULARITY.name
    return unit if item.multiples == 1 else f"{item.multiples} {unit}s"

"""Per-key rate limits: at most `MINT_RATE_LIMIT` requests per API key, counted in a moving
window by the `limits` library.

The count lives where every API replica sees it: on Redis when the deployment runs on Redis
(the broker's, unless `MINT_RATE_LIMIT_STORAGE_URL` names another), in this process's memory
on the embedded defaults (one API process). The request gate (`mint.api.gate`) asks after it
has authenticated the key and before any body is read, so a client over its limit costs one
header check and one counter, never a body. Routes that need no key (health probes,
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
        return storage_from_string(
            uri,
            key_prefix=KEY_PREFIX,
            wrap_exceptions=True,
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
        )
    return storage_from_string(uri, wrap_exceptions=True)


class KeyRateLimiter:
    """The rate limit of every API key, on one `limits` storage."""

    def __init__(self, rate: str, storage_uri: str) -> None:
        self.rate = rate
        self.items: list[RateLimitItem] = parse_many(rate)
        self.storage = _storage(storage_uri)
        self._limiter = MovingWindowRateLimiter(self.storage)

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRateLimiter | None:
        """The limiter of `settings.rate_limit`, or None when it is empty (no limit)."""
        if not settings.rate_limit:
            return None
        return cls(settings.rate_limit, settings.rate_limit_storage)

    def hit(self, key_id: str) -> None:
        """Count one request of the key; RateLimited (a 429 with Retry-After) if it is over."""
        for item in self.items:
            try:
                allowed = self._limiter.hit(item, "key", key_id)
            except StorageError as exc:
                log.warning("rate limit storage unavailable, request not counted: %s", exc.storage_error)
                return
            if not allowed:
                wait_s = self.retry_after_s(item, key_id)
                raise RateLimited(
                    f"Rate limit exceeded: this API key may make {item.amount} requests per {_window(item)}. "
                    f"Retry after {wait_s} s, spread requests out, or use a key per client "
                    "(operators set the limit with MINT_RATE_LIMIT).",
                    retry_after_s=wait_s,
                )

    def retry_after_s(self, item: RateLimitItem, key_id: str) -> int:
        """Whole seconds until the key's oldest request in the window leaves it (at least 1)."""
        try:
            reset_at = self._limiter.get_window_stats(item, "key", key_id).reset_time
        except StorageError:
            return 1
        return max(1, math.ceil(reset_at - time.time()))


def _window(item: RateLimitItem) -> str:
    unit = item.GRANULARITY.name
    return unit if item.multiples == 1 else f"{item.multiples} {unit}s"

"""Adapter cache keys: an adapter version is named by its content, the sha256 of its archive.

Every tier of the adapter cache (`mint.serving.cache`, `mint.serving.tiers`) keys a payload by
its content hash, so a key is checked once for its form (`validate_content_hash`) and a payload
read from somewhere Mint does not control is checked against its key (`checked_content`).
"""

from __future__ import annotations

import hashlib
import re

from mint.errors import Conflict, InvalidRequest

_CONTENT_HASH = re.compile(r"[0-9a-f]{64}")


def validate_content_hash(key: str) -> str:
    """Return `key` if it is a sha256 hex digest (64 lowercase hex digits), else raise InvalidRequest."""
    if not isinstance(key, str) or not _CONTENT_HASH.fullmatch(key):
        raise InvalidRequest(
            f"adapter cache key {str(key)[:80]!r} is not a content hash: use the adapter version's sha256 "
            "as 64 lowercase hex digits",
            param="key",
        )
    return key


def content_hash(payload: bytes) -> str:
    """The key of a payload: its sha256 hex digest."""
    return hashlib.sha256(payload).hexdigest()


def checked_content(key: str, payload: bytes, where: str) -> bytes:
    """`payload` if its sha256 is `key`, else Conflict naming what `where` holds instead."""
    digest = content_hash(payload)
    if digest != key:
        raise Conflict(f"{where} holds content with sha256 {digest}, not the adapter version {key}")
    return payload

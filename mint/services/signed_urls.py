"""Short-lived download URLs that carry no API key (`tinker checkpoint download`, `tinker
session export-trace`): each names one object of the object store and when it expires.

An S3 store presigns its own (`ObjectStore.presigned_url`): the client then downloads from the
bucket, not through the API. Otherwise the API serves the object at `/api/v1/signed/<key>`,
and the URL carries an HMAC-SHA256 of the key and the expiry under the server's signing key:
anyone holding it can fetch that object until then, and nothing else. The key is
`MINT_URL_SIGNING_KEY` where set; otherwise 32 random bytes kept in the object store
(`secrets/url-signing-key`), written by the first process that needs it. Every API process of
one install shares the object store, so a URL signed by one is accepted by all.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime, timedelta
from urllib.parse import urlencode

from mint.config import Settings
from mint.errors import NotFound
from mint.storage.objects import ObjectStore, ObjectStream
from mint.storage.tables import utcnow

KEY_OBJECT = "secrets/url-signing-key"
# How long a download URL lives; the Tinker CLI asks for new ones when they near their end.
URL_LIFETIME_S = 3600
SIGNED_ROUTE = "/api/v1/signed/"


# The key each object store holds, by the store's URL, read once per process: signing a URL or
# checking one then costs no round trip to the store.
_stored_keys: dict[str, bytes] = {}


def signing_key(settings: Settings, store: ObjectStore) -> bytes:
    if settings.url_signing_key is not None:
        return settings.url_signing_key.get_secret_value().encode()
    key = _stored_keys.get(store.url)
    if key is None:
        if not store.exists(KEY_OBJECT):
            store.put_bytes(KEY_OBJECT, secrets.token_bytes(32))
        # Read back rather than keep what was written: of two processes that wrote at once,
        # both then hold the one that stayed.
        key = _stored_keys[store.url] = store.get_bytes(KEY_OBJECT)
    return key


def _signature(key: bytes, resource: str, expires: int) -> str:
    return hmac.new(key, f"{resource}\n{expires}".encode(), hashlib.sha256).hexdigest()


def sign(settings: Settings, store: ObjectStore, url: str, resource: str, expires_at: datetime) -> str:
    """`url` with the query that lets it fetch `resource` until `expires_at`."""
    expires = int(expires_at.timestamp())
    signature = _signature(signing_key(settings, store), resource, expires)
    return f"{url}?{urlencode({'expires': expires, 'signature': signature})}"


def verify(settings: Settings, store: ObjectStore, resource: str, expires: int, signature: str) -> None:
    """Raise NotFound unless `signature` signs `resource` until `expires`, and that is still ahead.

    A bad or expired URL is a 404 that says to ask again, never a hint of what exists."""
    expected = _signature(signing_key(settings, store), resource, expires)
    if not hmac.compare_digest(expected, signature) or expires < utcnow().timestamp():
        raise NotFound("this download URL is invalid or has expired; ask for a new one")


def download_url(settings: Settings, store: ObjectStore, api_url: str, key: str) -> tuple[str, datetime]:
    """A URL that reads the object at `key` with no credentials for `URL_LIFETIME_S`, and its expiry."""
    expires = utcnow() + timedelta(seconds=URL_LIFETIME_S)
    url = store.presigned_url(key, URL_LIFETIME_S) or sign(
        settings, store, f"{api_url}{SIGNED_ROUTE}{key}", key, expires
    )
    return url, expires


def signed_object(settings: Settings, store: ObjectStore, key: str, expires: int, signature: str) -> ObjectStream:
    """The object a URL from `download_url` names, while the URL is valid."""
    verify(settings, store, key, expires, signature)
    return store.stream(key)

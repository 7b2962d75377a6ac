"""Short-lived download URLs that carry no API key (`tinker checkpoint download`, `tinker
session export-trace`): each names one object of the object store, when it expires, and what
it stands on.

The API serves the object at `/api/v1/signed/<key>`, and the URL carries an HMAC-SHA256 of the
key, the expiry and its `Grant` under the server's signing key. The signing key is
`MINT_URL_SIGNING_KEY` where set; otherwise 32 random bytes kept in the object store
(`secrets/url-signing-key`), written by the first process that needs it. Every API process of
one install shares the object store, so a URL signed by one is accepted by all.

Three rules keep such a URL from outliving, or straying from, what allowed it:

- **Its host comes from settings, never from the request** (`public_base_url`): a request's
  `Host` header is the client's to choose, and a URL built from it could send the next user's
  download (and its signature) to any host. `MINT_PUBLIC_URL` names where clients reach the
  API. Without it, an API bound to a loopback address (the embedded default, 127.0.0.1) signs
  URLs on `http://<MINT_API_HOST>:<MINT_API_PORT>`, the only address that reaches it; an API
  bound to any other address refuses to sign (503) until `MINT_PUBLIC_URL` is set.
- **It is checked again at every fetch** (`Grant`): it names the API key that asked for it and,
  for weights read through another organization's publication, that published checkpoint. A
  fetch after the key was revoked (or expired) or the checkpoint unpublished or deleted is a
  404, even within the URL's lifetime.
- **Its signature never reaches a log** (`SignatureRedactor`, installed on uvicorn's access
  logger by `create_app`): the signature is the credential, and whoever reads the access log
  would otherwise hold every URL issued.

An S3 store can presign URLs of its own, which the client then fetches from the bucket rather
than through the API; but S3 cannot be asked whether a grant still stands, so such a URL lives
its whole lifetime whatever happens. Mint does so only when `MINT_PRESIGNED_URL_S` is set
(above 0), for that many seconds; by default every download URL is the API's own.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import NotFound, ServiceUnavailable
from mint.services.principal import Principal
from mint.storage.objects import ObjectStore, ObjectStream
from mint.storage.tables import ApiKey, TinkerCheckpoint, as_utc, utcnow

KEY_OBJECT = "secrets/url-signing-key"
# How long a download URL lives; the Tinker CLI asks for new ones when they near their end.
URL_LIFETIME_S = 3600
SIGNED_ROUTE = "/api/v1/signed/"
# The query parameter that carries a URL's signature, and what logs show in its place.
SIGNATURE_PARAM = "signature"
REDACTED = "[redacted]"
# The loggers that write request lines (with their query strings) in an API process.
ACCESS_LOGGERS = ("uvicorn.access",)
# What the fields of a grant look like: ids (`key_...`, `tkc_...`), never a separator.
GRANT_ID_PATTERN = "^[A-Za-z0-9_-]{1,64}$"


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


# ---- where URLs point ---------------------------------------------------------------------------


def public_base_url(settings: Settings) -> str:
    """Where clients reach this API, from settings alone: `MINT_PUBLIC_URL`, else the loopback
    address the API is bound to; ServiceUnavailable for an API bound to another address, whose
    public name only the operator knows."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    host = settings.api_host
    if _is_loopback(host):
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{settings.api_port}"
    raise ServiceUnavailable(
        f"download URLs need MINT_PUBLIC_URL: this API listens on {host}, and the address clients reach it at "
        "cannot be told from that (nor, safely, from a request); set MINT_PUBLIC_URL to it, e.g. "
        "https://mint.example.com"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---- what a URL stands on -----------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """What a download URL stands on, checked again at every fetch (`check_grant`): the API key
    that asked for it, and, for weights read through a publication (another organization's
    checkpoint, or the origin of a copy of one), that published checkpoint."""

    api_key_id: str
    publication_id: str | None = None

    @classmethod
    def of(cls, principal: Principal, *, publication_id: str | None = None) -> Grant:
        if principal.key_id is None:
            raise NotFound("download URLs are issued to an API key, and this request carries none")
        return cls(principal.key_id, publication_id)

    def query(self) -> dict[str, str]:
        """The grant as the URL's query parameters (signed with the rest)."""
        return {"key_id": self.api_key_id} | ({"publication": self.publication_id} if self.publication_id else {})

    def signed_with(self, object_key: str) -> str:
        """What the signature covers besides the expiry: the object and this grant."""
        return f"{object_key}\n{self.api_key_id}\n{self.publication_id or ''}"


def check_grant(session: Session, grant: Grant) -> None:
    """NotFound unless the key that asked for the URL is still valid and the publication it read
    through (if any) still stands."""
    key = session.get(ApiKey, grant.api_key_id)
    now = utcnow()
    if key is None or key.revoked_at is not None or (key.expires_at is not None and as_utc(key.expires_at) <= now):
        raise NotFound(
            "this download URL was withdrawn: the API key it was issued to is revoked or expired; ask for a new "
            "URL with a valid key"
        )
    if grant.publication_id is not None:
        published = session.get(TinkerCheckpoint, grant.publication_id)
        if published is None or not published.public:
            raise NotFound(
                "this download URL was withdrawn: the weights it reads are no longer published by their owner"
            )


# ---- signing and checking -----------------------------------------------------------------------


def _signature(key: bytes, resource: str, expires: int) -> str:
    return hmac.new(key, f"{resource}\n{expires}".encode(), hashlib.sha256).hexdigest()


def sign(
    settings: Settings,
    store: ObjectStore,
    url: str,
    resource: str,
    expires_at: datetime,
    params: dict[str, str] | None = None,
) -> str:
    """`url` with the query (`params`, then the expiry and signature) that lets it fetch
    `resource` until `expires_at`; `resource` must cover whatever of `params` matters."""
    expires = int(expires_at.timestamp())
    signature = _signature(signing_key(settings, store), resource, expires)
    return f"{url}?{urlencode({**(params or {}), 'expires': expires, SIGNATURE_PARAM: signature})}"


def verify(settings: Settings, store: ObjectStore, resource: str, expires: int, signature: str) -> None:
    """Raise NotFound unless `signature` signs `resource` until `expires`, and that is still ahead.

    A bad or expired URL is a 404 that says to ask again, never a hint of what exists."""
    expected = _signature(signing_key(settings, store), resource, expires)
    if not hmac.compare_digest(expected, signature) or expires < utcnow().timestamp():
        raise NotFound("this download URL is invalid or has expired; ask for a new one")


def download_url(settings: Settings, store: ObjectStore, key: str, grant: Grant) -> tuple[str, datetime]:
    """A URL that reads the object at `key` with no credentials while `grant` stands, for
    `URL_LIFETIME_S` at most (a store's own presigned URL for `MINT_PRESIGNED_URL_S`, where set),
    and its expiry."""
    if settings.presigned_url_s:
        presigned = store.presigned_url(key, settings.presigned_url_s)
        if presigned is not None:
            return presigned, utcnow() + timedelta(seconds=settings.presigned_url_s)
    expires = utcnow() + timedelta(seconds=URL_LIFETIME_S)
    url = f"{public_base_url(settings)}{SIGNED_ROUTE}{key}"
    return sign(settings, store, url, grant.signed_with(key), expires, grant.query()), expires


def signed_object(
    session: Session, settings: Settings, store: ObjectStore, key: str, expires: int, signature: str, grant: Grant
) -> ObjectStream:
    """The object a URL from `download_url` names, while the URL is valid and its grant stands."""
    verify(settings, store, grant.signed_with(key), expires, signature)
    check_grant(session, grant)
    return store.stream(key)


# ---- keeping signatures out of logs -------------------------------------------------------------

_SIGNATURE_IN_QUERY = re.compile(r"(?i)([?&][\w.-]*" + SIGNATURE_PARAM + r"=)[^&\s\"']*")


def redact_signatures(text: str) -> str:
    """`text` with the value of every `...signature=` query parameter (Mint's, S3's
    `X-Amz-Signature`) replaced by `[redacted]`."""
    return _SIGNATURE_IN_QUERY.sub(lambda match: match.group(1) + REDACTED, text)


class SignatureRedactor(logging.Filter):
    """Redacts URL signatures from a log record's message and arguments (uvicorn's access line
    passes the request path, query included, as an argument)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_signatures(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact_signatures(arg) if isinstance(arg, str) else arg for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {
                name: redact_signatures(value) if isinstance(value, str) else value
                for name, value in record.args.items()
            }
        return True


def install_log_redaction() -> None:
    """Put a `SignatureRedactor` on the access loggers, once per process. A filter on the logger
    itself stays through uvicorn's logging set-up, which replaces handlers but keeps filters."""
    for name in ACCESS_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, SignatureRedactor) for existing in logger.filters):
            logger.addFilter(SignatureRedactor())

"""Where and how Mint sends a request on a tenant's behalf (webhook endpoints): to a public
address only, unless the operator allows private networks; to exactly the address that was
checked; within a total deadline; reading a bounded answer.

A URL that a tenant chooses and Mint's workers then POST to is a way into the network the
workers sit in (server-side request forgery): the metadata service at 169.254.169.254, the
database, the broker, an admin port on localhost. So a host that resolves to a loopback,
private, link-local, carrier-grade NAT, multicast, reserved or unspecified address is refused,
when the URL is saved and again before every request (its DNS may change in between). Operators
whose endpoints live inside their own network set `MINT_WEBHOOK_ALLOW_PRIVATE_NETWORKS=1`.

Checking a name and then letting an HTTP client resolve it again is not enough: the name's DNS
can answer a public address to the check and 127.0.0.1 to the connection a moment later (DNS
rebinding). So `resolve` looks the host up once and checks every address of the answer, and
`send` connects to the first of them, whatever the name resolves to by then: only the TCP
connection is pinned, the request keeps the URL's host for `Host`, TLS SNI and the certificate
check. Redirects are never followed (httpcore, below httpx, follows none): a 3xx is the answer.

The receiver is the tenant's choice too, and requests run on workers that every tenant shares.
So a request has a total deadline, enforced on every socket operation (a receiver that sends a
byte just before each read's timeout cannot stretch it, as it would a per-read timeout), and at
most a small prefix of the answer's body is read before the connection is closed.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from mint.errors import InvalidRequest

# Shared address space (RFC 6598) is not `is_private` in Python's ipaddress, but it is not public.
_CARRIER_GRADE_NAT = ipaddress.ip_network("100.64.0.0/10")
DEFAULT_PORTS = {"http": 80, "https": 443}


class EgressError(Exception):
    """Mint did not send the request, or got no answer: the message says why (for a delivery log)."""


class NotPublic(EgressError):
    """The host resolves to an address that is not public, and private networks are not allowed."""


class Unresolvable(EgressError):
    """The host does not resolve now (or the URL has no host Mint can send to)."""


class DeadlinePassed(EgressError):
    """The request's total deadline passed before the answer's status and headers had come."""


class ConnectionFailed(EgressError):
    """Connecting, TLS or the HTTP exchange failed (refused, reset, a bad certificate, not HTTP)."""


def _not_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or (isinstance(address, ipaddress.IPv4Address) and address in _CARRIER_GRADE_NAT)
    )


def _addresses(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to now, in the order to try them (the host itself if it is
    an address); empty if it does not resolve. The one DNS lookup of a request."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass  # a name, not an address
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [str(sockaddr[0]) for *_, sockaddr in infos]


@dataclass(frozen=True)
class Destination:
    """A URL whose host was looked up once and checked: a request to it connects to `address`."""

    url: httpx.URL
    address: str

    @property
    def host(self) -> str:
        """The URL's host as it goes on the wire (IDNA-encoded): `Host`, TLS SNI, the certificate."""
        return self.url.raw_host.decode("ascii")

    @property
    def port(self) -> int:
        return self.url.port or DEFAULT_PORTS[self.url.scheme]


def resolve(url: str, *, allow_private: bool) -> Destination:
    """Look `url`'s host up once and check every address of the answer (unless `allow_private`);
    the destination connects to the first. NotPublic or Unresolvable otherwise."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise Unresolvable(f"{url!r} is not a URL Mint can send to: {exc}") from None
    if parsed.scheme not in DEFAULT_PORTS or not parsed.raw_host:
        raise Unresolvable(f"{url!r} is not an http:// or https:// URL with a host")
    host = parsed.raw_host.decode("ascii")
    addresses = _addresses(host, parsed.port or DEFAULT_PORTS[parsed.scheme])
    if not addresses:
        raise Unresolvable(f"{host} does not resolve now")
    if not allow_private:
        for address in addresses:
            if _not_public(ipaddress.ip_address(address.split("%")[0])):
                where = f"{host} resolves to {address}, which" if host != address else address
                raise NotPublic(
                    f"{where} is not a public address; Mint sends webhooks to public endpoints only "
                    "(an operator can allow private networks with MINT_WEBHOOK_ALLOW_PRIVATE_NETWORKS=1)"
                )
    return Destination(parsed, addresses[0])


def check_public(url: str, *, allow_private: bool, param: str = "url") -> None:
    """Refuse (400) a URL whose host is not public, unless private networks are allowed. A host
    that does not resolve now is accepted: each request checks again (and fails until it does)."""
    if allow_private:
        return
    try:
        resolve(url, allow_private=False)
    except NotPublic as refused:
        raise InvalidRequest(str(refused), param=param) from None
    except Unresolvable:
        pass


# --- sending: the pinned address, the deadline, the bounded answer --------------------------


class _Deadline:
    """A moment after which no socket operation of a request may wait any more."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at = time.monotonic() + seconds

    def clamp(self, timeout: float | None, expired: type[Exception]) -> float:
        """`timeout` cut to the time left; `expired` raised once none is left."""
        left = self._at - time.monotonic()
        if left <= 0:
            raise expired(f"the total deadline of {self.seconds:g} s passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake ends by the deadline, and whose
    reads take at most `read_bytes` at a time."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: _Deadline, read_bytes: int) -> None:
        self._stream = stream
        self._deadline = deadline
        self._read_bytes = read_bytes

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        timeout = self._deadline.clamp(timeout, httpcore.ReadTimeout)
        return self._stream.read(min(max_bytes, self._read_bytes), timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadline.clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        timeout = self._deadline.clamp(timeout, httpcore.ConnectTimeout)
        secured = self._stream.start_tls(ssl_context, server_hostname, timeout)
        return _DeadlineStream(secured, self._deadline, self._read_bytes)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _PinnedBackend(httpcore.NetworkBackend):
    """httpcore's socket backend, connecting to the destination's checked address for its host
    (and to nothing else), every operation within the deadline."""

    def __init__(self, destination: Destination, deadline: _Deadline, read_bytes: int) -> None:
        self._destination = destination
        self._deadline = deadline
        self._read_bytes = read_bytes
        self._sockets = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        if (host, port) != (self._destination.host, self._destination.port):  # e.g. a redirect's target
            raise httpcore.ConnectError(f"{host}:{port} was not checked; Mint connects only to checked addresses")
        timeout = self._deadline.clamp(timeout, httpcore.ConnectTimeout)
        stream = self._sockets.connect_tcp(self._destination.address, port, timeout, local_address, socket_options)
        return _DeadlineStream(stream, self._deadline, self._read_bytes)


@dataclass(frozen=True)
class Answer:
    """A receiver's status and the start of its body (at most the bytes asked for)."""

    status_code: int
    body_prefix: bytes


def _body_prefix(response: httpcore.Response, limit: int) -> bytes:
    """Up to `limit` bytes of the body: the status is the answer, the body is read for the log,
    so a body cut off by the deadline or the receiver is kept as far as it came."""
    prefix = bytearray()
    try:
        for chunk in response.iter_stream():
            prefix += chunk
            if len(prefix) >= limit:
                break
    except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError):
        pass
    return bytes(prefix[:limit])


def send(
    destination: Destination,
    *,
    method: str,
    headers: Mapping[str, str],
    body: bytes,
    deadline_s: float,
    answer_bytes: int,
) -> Answer:
    """One request to the destination's checked address, within `deadline_s` in all (connect,
    TLS, send, the answer's head and as much of its body as comes by then), reading at most
    `answer_bytes` of the body before closing the connection. DeadlinePassed or
    ConnectionFailed when no answer came."""
    deadline = _Deadline(deadline_s)
    url = httpcore.URL(
        scheme=destination.url.raw_scheme,
        host=destination.url.raw_host,
        port=destination.url.port,
        target=destination.url.raw_path,
    )
    timeouts = dict.fromkeys(("connect", "read", "write", "pool"), deadline_s)
    ssl_context = httpx.create_ssl_context() if destination.url.scheme == "https" else None
    backend = _PinnedBackend(destination, deadline, read_bytes=answer_bytes)
    try:
        with (
            httpcore.ConnectionPool(ssl_context=ssl_context, network_backend=backend, max_connections=1) as pool,
            pool.stream(
                method, url, headers=list(headers.items()), content=body, extensions={"timeout": timeouts}
            ) as response,
        ):
            return Answer(response.status, _body_prefix(response, answer_bytes))
    except httpcore.TimeoutException:
        raise DeadlinePassed(f"no answer within the deadline of {deadline_s:g} s") from None
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
        raise ConnectionFailed(f"{type(exc).__name__}: {exc}") from None

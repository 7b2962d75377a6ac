"""Where Mint may send a request on a tenant's behalf (webhook endpoints): public addresses only,
unless the operator allows private networks.

A URL that a tenant chooses and Mint's workers then POST to is a way into the network the
workers sit in (server-side request forgery): the metadata service at 169.254.169.254, the
database, the broker, an admin port on localhost. So a host that resolves to a loopback,
private, link-local, carrier-grade NAT, multicast, reserved or unspecified address is refused,
when the URL is saved and again before every delivery (its DNS may change in between). Operators
whose endpoints live inside their own network set `MINT_WEBHOOK_ALLOW_PRIVATE_NETWORKS=1`.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from mint.errors import InvalidRequest

# Shared address space (RFC 6598) is not `is_private` in Python's ipaddress, but it is not public.
_CARRIER_GRADE_NAT = ipaddress.ip_network("100.64.0.0/10")


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


def non_public_address(url: str) -> str | None:
    """The first address of `url`'s host that is not public, or None (None as well when the host
    does not resolve now: the delivery fails then, and retries)."""
    host = urlsplit(url).hostname or ""
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        pass  # a name, not an address
    else:
        return str(literal) if _not_public(literal) else None
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return None
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if _not_public(address):
            return str(address)
    return None


def refusal(url: str, allow_private: bool) -> str | None:
    """Why Mint will not send to `url`, or None when it may."""
    if allow_private:
        return None
    address = non_public_address(url)
    if address is None:
        return None
    host = urlsplit(url).hostname
    where = f"{host} resolves to {address}, which" if host != address else f"{address}"
    return (
        f"{where} is not a public address; Mint sends webhooks to public "
        "endpoints only (an operator can allow private networks with MINT_WEBHOOK_ALLOW_PRIVATE_NETWORKS=1)"
    )


def check_public(url: str, *, allow_private: bool, param: str = "url") -> None:
    """Refuse (400) a URL whose host is not public, unless private networks are allowed."""
    reason = refusal(url, allow_private)
    if reason is not None:
        raise InvalidRequest(reason, param=param)

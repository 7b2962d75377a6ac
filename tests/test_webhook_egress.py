"""What a webhook delivery may do on the network, attacked with real servers on loopback.

- DNS rebinding: a host that resolves to a public address when it is checked and to 127.0.0.1
  a moment later must never get Mint to connect to 127.0.0.1 (the delivery dials the address
  it checked, and resolves once).
- Redirects are answers, never followed: a 302 to an internal address is a failed attempt.
- The URL's host stays the host of the request: `Host`, TLS SNI and certificate verification
  use it, not the pinned address.
- A receiver that trickles its answer holds a delivery no longer than its total deadline
  (MINT_WEBHOOK_TIMEOUT_S), and a receiver that sends an endless body has only a small
  prefix of it read before the connection is closed.

The resolver is faked (`socket.getaddrinfo`, the function Mint and httpcore resolve with) for
names under `mint-test.example`; every socket the test's thread opens (a delivery runs on the
thread that calls it) goes through `Network`, which records the addresses dialed and the bytes
received, and refuses public addresses: the internet is out of reach of a test. Sockets of
other threads (a pool or server another test left running in the process) pass unrecorded.
"""

from __future__ import annotations

import datetime
import errno
import ipaddress
import socket
import socketserver
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from mint.config import Settings
from mint.services.principal import operator
from mint.services.webhooks import delivery as webhook_delivery
from mint.services.webhooks import events as webhooks
from mint.storage.db import session_scope
from mint.storage.tables import WebhookDelivery, utcnow
from tests.conftest import Tenant

TEST_DOMAIN = ".mint-test.example"
PUBLIC_ADDRESS = "93.184.216.34"  # what the attacker's DNS answers first: public, so the check passes
# A delivery's deadline here; a receiver trickling a byte every TRICKLE_S needs a minute for its answer.
DEADLINE_S = 1.0
TRICKLE_S = 0.2
HUGE_BODY_BYTES = 600 * 1024 * 1024


# --- the test's network: DNS, sockets, servers ----------------------------------------------


@dataclass
class Resolver:
    """A DNS that answers each lookup of a name under TEST_DOMAIN with the next of `answers`
    (the last one from then on), as a rebinding attacker's DNS does; other names and address
    literals go to the real resolver."""

    answers: list[str]
    lookups: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._real = socket.getaddrinfo

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if not name.endswith(TEST_DOMAIN):
            return self._real(host, port, *args, **kwargs)
        answer = self.answers[min(len(self.lookups), len(self.answers) - 1)]
        self.lookups.append(name)
        return self._real(answer, port, *args, **kwargs)


@dataclass
class Network:
    """Every socket the test's thread opened: the addresses dialed, bytes received per address,
    and public addresses refused (as an unreachable network refuses them)."""

    dialed: list[tuple[str, int]] = field(default_factory=list)
    received: Counter[tuple[str, int]] = field(default_factory=Counter)


@pytest.fixture
def network(monkeypatch: pytest.MonkeyPatch) -> Network:
    record = Network()
    test_thread = threading.get_ident()

    class RecordedSocket(socket.socket):
        def connect(self, address: Any) -> None:
            if threading.get_ident() == test_thread:
                peer = (str(address[0]), int(address[1]))
                record.dialed.append(peer)
                if ipaddress.ip_address(peer[0].split("%")[0]).is_global:
                    raise OSError(errno.ENETUNREACH, f"{peer[0]} is on the internet, out of a test's reach")
            super().connect(address)

        def recv(self, size: int, *args: Any) -> bytes:
            data = super().recv(size, *args)
            if threading.get_ident() == test_thread:
                record.received[self.getpeername()[:2]] += len(data)
            return data

    monkeypatch.setattr(socket, "socket", RecordedSocket)
    return record


def resolve_with(monkeypatch: pytest.MonkeyPatch, *answers: str) -> Resolver:
    resolver = Resolver(list(answers))
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    return resolver


@dataclass
class Server:
    """A TCP server on 127.0.0.1 whose connections `answer` handles, one thread each."""

    port: int
    connections: int = 0
    request_heads: list[bytes] = field(default_factory=list)
    bytes_sent: int = 0
    saw_close: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)

    def send(self, connection: socket.socket, data: bytes) -> bool:
        """Send `data`; False (and `saw_close` set) once the client has closed the connection."""
        try:
            connection.sendall(data)
        except OSError:
            self.saw_close.set()
            return False
        self.bytes_sent += len(data)
        return True


@contextmanager
def serve(answer: Callable[[Server, socket.socket], None]) -> Iterator[Server]:
    box: list[Server] = []

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            server = box[0]
            server.connections += 1
            server.request_heads.append(read_request(self.request))
            answer(server, self.request)

    tcp = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    tcp.daemon_threads = True
    box.append(Server(port=tcp.server_address[1]))
    thread = threading.Thread(target=tcp.serve_forever, daemon=True)
    thread.start()
    try:
        yield box[0]
    finally:
        tcp.shutdown()
        tcp.server_close()
        thread.join(timeout=10)


def read_request(connection: socket.socket) -> bytes:
    """The request's head, its body read too: a server that closes with a body unread resets
    the connection, and the client may then lose the answer."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = connection.recv(4096)
        if not chunk:
            return received
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        0,
    )
    while len(body) < length:
        chunk = connection.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n"


def answering(status: str, body: bytes, *headers: str) -> Callable[[Server, socket.socket], None]:
    def answer(server: Server, connection: socket.socket) -> None:
        lines = [f"HTTP/1.1 {status}", f"content-length: {len(body)}", "connection: close", *headers]
        server.send(connection, "\r\n".join(lines).encode() + b"\r\n\r\n" + body)
        server.finished.set()

    return answer


# --- deliveries ------------------------------------------------------------------------------


def new_delivery(settings: Settings, tenant: Tenant, url: str) -> str:
    """A pending delivery of a test event to `url`, saved without resolving it (as an endpoint
    whose DNS changed after it was checked)."""
    with session_scope(settings.database) as session:
        principal = operator(tenant.organization_id)
        webhook = webhooks.create_webhook(
            session,
            principal,
            url=url,
            events=["eval.run.completed"],
            description="",
            enabled=True,
            allow_private=True,
        )
        delivery = webhooks.send_test(session, principal, webhook.id, send=lambda task, **message: None)
        return delivery.id


def make_due(settings: Settings, delivery_id: str) -> None:
    """Move the delivery's next attempt to now, as its backoff ending would."""
    with session_scope(settings.database) as session:
        session.execute(
            update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(next_attempt_at=utcnow())
        )


def last_attempt(settings: Settings, delivery_id: str) -> dict[str, Any]:
    with session_scope(settings.database) as session:
        delivery = session.get(WebhookDelivery, delivery_id)
        assert delivery is not None
        return dict(delivery.attempt_log[-1])


@pytest.fixture
def strict(prepared: Settings) -> Settings:
    """Mint's defaults (private networks refused), a short deadline, retries left."""
    return prepared.model_copy(
        update={"webhook_allow_private_networks": False, "webhook_timeout_s": DEADLINE_S, "webhook_max_attempts": 3}
    )


@pytest.fixture
def lenient(strict: Settings) -> Settings:
    """An operator's settings whose endpoints live on their own network (loopback here)."""
    return strict.model_copy(update={"webhook_allow_private_networks": True})


# --- DNS rebinding, redirects, the host of the request ---------------------------------------


def test_a_host_rebound_to_loopback_after_its_check_is_never_connected_to(
    strict: Settings, tenant: Tenant, network: Network, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attacker's DNS answers a public address to the check and 127.0.0.1 after it: the
    delivery dials the checked public address (unreachable here) and never the local server,
    whose answer therefore never reaches the tenant's delivery log."""
    with serve(answering("200 OK", b"the local admin port's secrets")) as internal:
        url = f"http://hooks{TEST_DOMAIN}:{internal.port}/hooks"
        delivery_id = new_delivery(strict, tenant, url)
        resolver = resolve_with(monkeypatch, PUBLIC_ADDRESS, "127.0.0.1")

        for _ in range(2):  # the second attempt's lookup answers 127.0.0.1 to the check, which refuses it
            make_due(strict, delivery_id)
            assert webhook_delivery.deliver(strict, delivery_id, None) == "retrying"

    assert internal.connections == 0
    assert network.dialed == [(PUBLIC_ADDRESS, internal.port)]
    assert resolver.lookups == [f"hooks{TEST_DOMAIN}"] * 2  # once per attempt: the check's answer is dialed
    with session_scope(strict.database) as session:
        delivery = session.get(WebhookDelivery, delivery_id)
        assert delivery is not None
        first, second = delivery.attempt_log
    assert first["status_code"] is None and first["response"] == "" and "ConnectError" in first["error"]
    assert "127.0.0.1, which is not a public address" in second["error"] and second["response"] == ""


def test_the_checked_address_is_dialed_even_when_private_networks_are_allowed(
    lenient: Settings, tenant: Tenant, network: Network, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pinning holds whatever the check allows: the delivery connects to the first answer
    (127.0.0.1) and sends the URL's host in `Host`; the later answer (127.0.0.2, where nothing
    listens) is never asked for."""
    with serve(answering("204 No Content", b"")) as receiver:
        url = f"http://hooks{TEST_DOMAIN}:{receiver.port}/hooks"
        delivery_id = new_delivery(lenient, tenant, url)
        resolver = resolve_with(monkeypatch, "127.0.0.1", "127.0.0.2")
        assert webhook_delivery.deliver(lenient, delivery_id, None) == "succeeded"
    assert resolver.lookups == [f"hooks{TEST_DOMAIN}"]
    assert network.dialed == [("127.0.0.1", receiver.port)]
    assert last_attempt(lenient, delivery_id)["status_code"] == 204
    (head,) = receiver.request_heads
    assert f"\r\nhost: hooks{TEST_DOMAIN}:{receiver.port}\r\n".encode() in head.lower()


def test_a_redirect_is_an_answer_and_is_not_followed(lenient: Settings, tenant: Tenant, network: Network) -> None:
    with (
        serve(answering("200 OK", b"internal")) as internal,
        serve(answering("302 Found", b"", f"location: http://127.0.0.1:{internal.port}/admin")) as receiver,
    ):
        delivery_id = new_delivery(lenient, tenant, f"http://127.0.0.1:{receiver.port}/hooks")
        assert webhook_delivery.deliver(lenient, delivery_id, None) == "retrying"
    assert internal.connections == 0 and receiver.connections == 1
    assert network.dialed == [("127.0.0.1", receiver.port)]
    attempt = last_attempt(lenient, delivery_id)
    assert attempt["status_code"] == 302 and attempt["error"] == "the receiver answered HTTP 302"


# --- TLS: SNI and the certificate follow the URL's host --------------------------------------


def _certificates(folder: Path, host: str) -> tuple[Path, Path]:
    """A CA (written as a bundle for SSL_CERT_FILE) and a leaf certificate+key for `host`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        else:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = build("Mint test CA", ca_key, "Mint test CA", ca_key, ca=True)
    leaf = build(host, leaf_key, "Mint test CA", ca_key, ca=False)
    bundle, chain = folder / "ca.pem", folder / "leaf.pem"
    bundle.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    key_pem = leaf_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    chain.write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + key_pem)
    return bundle, chain


def test_tls_uses_the_urls_host_for_sni_and_the_certificate_while_dialing_the_checked_address(
    lenient: Settings, tenant: Tenant, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = f"hooks{TEST_DOMAIN}"
    bundle, chain = _certificates(tmp_path, host)
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    names: list[str | None] = []
    seen_hosts: list[str] = []

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(chain)
    context.sni_callback = lambda _socket, name, _context: names.append(name)  # type: ignore[assignment,misc,func-returns-value]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["content-length"]))
            seen_hosts.append(self.headers["host"])
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        resolve_with(monkeypatch, "127.0.0.1")
        delivered = new_delivery(lenient, tenant, f"https://{host}:{port}/hooks")
        assert webhook_delivery.deliver(lenient, delivered, None) == "succeeded"
        # Another name on the same address: the certificate is not for it, so nothing is sent.
        mismatched = new_delivery(lenient, tenant, f"https://other{TEST_DOMAIN}:{port}/hooks")
        assert webhook_delivery.deliver(lenient, mismatched, None) == "retrying"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert last_attempt(lenient, delivered)["status_code"] == 200
    assert names[0] == host and seen_hosts == [f"{host}:{port}"]
    assert "CERTIFICATE_VERIFY_FAILED" in last_attempt(lenient, mismatched)["error"]
    assert names[1] == f"other{TEST_DOMAIN}"


# --- a total deadline, a bounded answer -------------------------------------------------------

PADDING = b"x-padding: " + b"." * 200 + b"\r\n"


def trickling(head_first: bool) -> Callable[[Server, socket.socket], None]:
    """Send an answer one byte every TRICKLE_S (after a prompt `200 OK` head when `head_first`),
    stopping when the client closes the connection."""
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 400\r\n"

    def answer(server: Server, connection: socket.socket) -> None:
        prompt, slow = (head + b"\r\n", b"a" * 400) if head_first else (b"", head + PADDING + b"\r\n" + b"a" * 400)
        if prompt and not server.send(connection, prompt):
            return
        for at in range(len(slow)):
            if not server.send(connection, slow[at : at + 1]):
                return
            time.sleep(TRICKLE_S)
        server.finished.set()

    return answer


def test_a_receiver_trickling_its_answer_holds_a_delivery_only_until_its_deadline(
    lenient: Settings, tenant: Tenant, network: Network
) -> None:
    """One byte every TRICKLE_S never lets a per-read timeout expire; the total deadline ends
    the attempt as a timeout, and the receiver sees the connection closed long before it has
    sent its answer."""
    with serve(trickling(head_first=False)) as receiver:
        delivery_id = new_delivery(lenient, tenant, f"http://127.0.0.1:{receiver.port}/hooks")
        assert webhook_delivery.deliver(lenient, delivery_id, None) == "retrying"
        assert receiver.saw_close.wait(timeout=60)
    attempt = last_attempt(lenient, delivery_id)
    assert attempt["status_code"] is None and attempt["response"] == ""
    assert "Timeout" in attempt["error"] and "MINT_WEBHOOK_TIMEOUT_S" in attempt["error"], attempt
    assert not receiver.finished.is_set()
    assert network.received[("127.0.0.1", receiver.port)] < len(PADDING)


def test_a_receiver_trickling_its_body_after_answering_200_is_cut_off_at_the_deadline(
    lenient: Settings, tenant: Tenant, network: Network
) -> None:
    """The status is the answer: the body, read only for the log, is kept as far as it came
    when the deadline passed, and the connection is closed then."""
    with serve(trickling(head_first=True)) as receiver:
        delivery_id = new_delivery(lenient, tenant, f"http://127.0.0.1:{receiver.port}/hooks")
        assert webhook_delivery.deliver(lenient, delivery_id, None) == "succeeded"
        assert receiver.saw_close.wait(timeout=60)
    attempt = last_attempt(lenient, delivery_id)
    assert attempt["status_code"] == 200 and attempt["error"] is None
    assert 0 < len(attempt["response"]) < 400 and set(attempt["response"]) == {"a"}
    assert not receiver.finished.is_set()


def test_a_huge_answer_is_read_only_as_far_as_its_excerpt_and_then_closed(
    lenient: Settings, tenant: Tenant, network: Network
) -> None:
    """A 600 MiB answer: Mint reads a few KiB of it (the log keeps 500 characters), closes the
    connection, and the receiver's sending fails long before it has sent it all."""

    def huge(server: Server, connection: socket.socket) -> None:
        head = f"HTTP/1.1 200 OK\r\ncontent-length: {HUGE_BODY_BYTES}\r\n\r\n".encode()
        if not server.send(connection, head):
            return
        chunk = b"z" * 65536
        for _ in range(HUGE_BODY_BYTES // len(chunk)):
            if not server.send(connection, chunk):
                return
        server.finished.set()

    with serve(huge) as receiver:
        delivery_id = new_delivery(lenient, tenant, f"http://127.0.0.1:{receiver.port}/hooks")
        assert webhook_delivery.deliver(lenient, delivery_id, None) == "succeeded"
        assert receiver.saw_close.wait(timeout=60)
    attempt = last_attempt(lenient, delivery_id)
    assert attempt["status_code"] == 200 and attempt["response"] == "z" * webhook_delivery.RESPONSE_EXCERPT_CHARS
    received = network.received[("127.0.0.1", receiver.port)]
    assert received < 2 * webhook_delivery.RESPONSE_READ_BYTES + 1024, received  # reads of 4 KiB at most
    assert not receiver.finished.is_set() and receiver.bytes_sent < HUGE_BODY_BYTES

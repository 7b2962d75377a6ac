"""Serving nodes as they report themselves, and which one serves a request for a base.

A node registers at start, heartbeats while it runs, and unregisters when it stops; the API
picks among the live nodes of the request's base, preferring the one whose cache most
likely holds the adapter already (the same adapter always maps to the same node while the
set of nodes is unchanged: rendezvous hashing), so each adapter is fetched by one node.

A node's internal routes answer only callers that present its credential: the shared
MINT_NODE_TOKEN, or, where that is unset, a random token the node issues itself at start and
records in its row. A `NodeAddress` carries what a caller needs to reach one node: its id (the
name errors give it), its URL (for the server's log only) and that credential.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from mint.errors import ServiceUnavailable
from mint.storage.tables import ServingNode, as_utc, utcnow

LIVE_WITHIN_S = 60
HEARTBEAT_EVERY_S = 10.0
ISSUED_TOKEN_BYTES = 32


@dataclass(frozen=True)
class NodeAddress:
    """How to reach one serving node: `id` names it to clients; `url` is for the server's log
    only (clients never see where nodes are); `token` is the credential its routes require."""

    id: str
    url: str
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class NodeCredential:
    """The credential a node requires, and what it records in its row (only one it issued)."""

    token: str = field(repr=False)
    recorded: str | None = field(default=None, repr=False)


def node_credential(shared_token: str | None) -> NodeCredential:
    """The shared MINT_NODE_TOKEN where one is set, else a fresh random token to record."""
    if shared_token is not None:
        return NodeCredential(shared_token)
    issued = secrets.token_urlsafe(ISSUED_TOKEN_BYTES)
    return NodeCredential(issued, recorded=issued)


def register_node(
    session: Session, *, node_id: str, base_model: str, url: str, hostname: str, pid: int, token: str | None
) -> None:
    """Record a node as live; `token` is the credential it issued itself (None: it uses the shared one)."""
    now = utcnow()
    row = session.get(ServingNode, node_id) or ServingNode(id=node_id, started_at=now)
    row.base_model, row.url, row.hostname, row.pid, row.last_seen_at = base_model, url, hostname, pid, now
    row.token = token
    session.add(row)


def heartbeat(session: Session, node_id: str) -> None:
    row = session.get(ServingNode, node_id)
    if row is not None:
        row.last_seen_at = utcnow()


def unregister_node(session: Session, node_id: str) -> None:
    session.execute(delete(ServingNode).where(ServingNode.id == node_id))


def live_nodes(session: Session, base_model: str | None = None) -> list[ServingNode]:
    cutoff = utcnow() - timedelta(seconds=LIVE_WITHIN_S)
    query = select(ServingNode).order_by(ServingNode.id)
    if base_model is not None:
        query = query.where(ServingNode.base_model == base_model)
    return [node for node in session.execute(query).scalars() if as_utc(node.last_seen_at) >= cutoff]


def address_of(node: ServingNode, shared_token: str | None) -> NodeAddress:
    """How to reach `node`: with the token it issued, else with the shared MINT_NODE_TOKEN."""
    return NodeAddress(id=node.id, url=node.url, token=node.token or shared_token)


def live_addresses(session: Session, base_model: str | None, shared_token: str | None) -> list[NodeAddress]:
    return [address_of(node, shared_token) for node in live_nodes(session, base_model)]


def node_for(session: Session, base_model: str, affinity: str, shared_token: str | None) -> NodeAddress:
    """The live node of `base_model` that should serve `affinity` (an adapter hash, or the base)."""
    nodes = live_nodes(session, base_model)
    if not nodes:
        raise ServiceUnavailable(
            f"no serving node of base {base_model!r} is running; start one with `mint serve --base {base_model}`",
            param="model",
        )
    chosen = max(nodes, key=lambda node: hashlib.sha256(f"{node.id}|{affinity}".encode()).digest())
    return address_of(chosen, shared_token)

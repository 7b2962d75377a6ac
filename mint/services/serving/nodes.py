"""Serving nodes as they report themselves, and the order in which to try them for a request.

A node registers once it has loaded its base, heartbeats while it runs, and unregisters when
it stops. A base may have several nodes; the API orders the live nodes of the request's base
for each request (`nodes_for`) and tries them in that order, moving on from one that does not
answer (`mint.services.serving.node_client`). The order starts with the nodes whose caches most likely
hold the request's adapter already: rendezvous hashing ranks the nodes per adapter, the same
way while the set of nodes is unchanged, and the first `share` of them take that adapter's
requests, the least busy first, taking turns when equally busy. A base's own requests need no
cache and are shared by all its nodes; an adapter's by two (so a hot adapter is fetched by two
nodes, not all); a mixture's by one, whose router remembers tool calls for their continuations.
Nodes this process found dead go last, tried only when no other answers.

A node's internal routes answer only callers that present its credential: the shared
MINT_NODE_TOKEN, or, where that is unset, a random token the node issues itself at start and
records in its row. A `NodeAddress` carries what a caller needs to reach one node: its id (the
name errors give it), its URL (for the server's log only) and that credential.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from mint.errors import ServiceUnavailable
from mint.storage.tables import ServingNode, as_utc, utcnow

LIVE_WITHIN_S = 60
HEARTBEAT_EVERY_S = 10.0
ISSUED_TOKEN_BYTES = 32
# How many of a base's nodes share the requests of one adapter version: more than one, so a hot
# adapter is spread and a node's death finds the adapter warm elsewhere; few, so that each adapter
# is fetched into few caches.
ADAPTER_SHARE = 2


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
    """Record a node as live; `token` is the credential it issued itself (None: it uses the shared one).

    A row of another process of this machine at the same URL is one that died there without
    unregistering (a node restarted after SIGKILL): two processes cannot listen on one port, so
    it is removed, and the API never presents that process's credential to this one."""
    now = utcnow()
    session.execute(
        delete(ServingNode).where(ServingNode.url == url, ServingNode.hostname == hostname, ServingNode.id != node_id)
    )
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


def _rendezvous_rank(node_id: str, affinity: str) -> bytes:
    return hashlib.sha256(f"{node_id}|{affinity}".encode()).digest()


def serving_order(
    node_ids: list[str],
    affinity: str,
    *,
    share: int | None = 1,
    in_flight: Mapping[str, int] | None = None,
    down: Collection[str] = (),
    turn: int = 0,
) -> list[str]:
    """The order in which to try `node_ids` for a request of `affinity`.

    The nodes are ranked by rendezvous hashing on `affinity`; the first `share` of them (all,
    when None) take its requests: the one with the fewest requests `in_flight` first, and among
    equally busy ones a rotation by `turn` (a counter the caller advances per request), so that
    even one request at a time is spread. The other nodes follow in rank order, as fallbacks,
    and the nodes in `down` (this process found them dead) come last."""
    ranked = sorted(node_ids, key=lambda node_id: _rendezvous_rank(node_id, affinity), reverse=True)
    alive = [node_id for node_id in ranked if node_id not in down]
    sharing = alive[: len(alive) if share is None else max(1, share)]
    if sharing:
        start = turn % len(sharing)
        sharing = sharing[start:] + sharing[:start]
    busy = in_flight or {}
    sharing.sort(key=lambda node_id: busy.get(node_id, 0))  # stable: the rotation breaks ties
    return (
        sharing
        + [node_id for node_id in alive if node_id not in sharing]
        + [node_id for node_id in ranked if node_id in down]
    )


def nodes_for(
    session: Session,
    base_model: str,
    affinity: str,
    shared_token: str | None,
    *,
    share: int | None = 1,
    in_flight: Mapping[str, int] | None = None,
    down: Collection[str] = (),
    turn: int = 0,
) -> list[NodeAddress]:
    """Every live node of `base_model`, in the order to try them for `affinity` (`serving_order`).

    Raises ServiceUnavailable when the base has no live node."""
    nodes = {node.id: node for node in live_nodes(session, base_model)}
    if not nodes:
        raise ServiceUnavailable(
            f"no serving node of base {base_model!r} is running; start one with `mint serve --base {base_model}`",
            param="model",
        )
    order = serving_order(list(nodes), affinity, share=share, in_flight=in_flight, down=down, turn=turn)
    return [address_of(nodes[node_id], shared_token) for node_id in order]


def node_for(session: Session, base_model: str, affinity: str, shared_token: str | None) -> NodeAddress:
    """The live node of `base_model` that should serve `affinity` (an adapter hash, or the base):
    the first of its rendezvous ranking, the same node for the same affinity."""
    return nodes_for(session, base_model, affinity, shared_token)[0]

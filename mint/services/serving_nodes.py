"""Serving nodes as they report themselves, and which one serves a request for a base.

A node registers at start, heartbeats while it runs, and unregisters when it stops; the API
picks among the live nodes of the request's base, preferring the one whose cache most
likely holds the adapter already (the same adapter always maps to the same node while the
set of nodes is unchanged: rendezvous hashing), so each adapter is fetched by one node.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from mint.errors import ServiceUnavailable
from mint.storage.tables import ServingNode, as_utc, utcnow

LIVE_WITHIN_S = 60
HEARTBEAT_EVERY_S = 10.0


def register_node(session: Session, *, node_id: str, base_model: str, url: str, hostname: str, pid: int) -> None:
    now = utcnow()
    row = session.get(ServingNode, node_id) or ServingNode(id=node_id, started_at=now)
    row.base_model, row.url, row.hostname, row.pid, row.last_seen_at = base_model, url, hostname, pid, now
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


def node_for(session: Session, base_model: str, affinity: str) -> ServingNode:
    """The live node of `base_model` that should serve `affinity` (an adapter hash, or the base)."""
    nodes = live_nodes(session, base_model)
    if not nodes:
        raise ServiceUnavailable(
            f"no serving node of base {base_model!r} is running; start one with `mint serve --base {base_model}`",
            param="model",
        )
    return max(nodes, key=lambda node: hashlib.sha256(f"{node.id}|{affinity}".encode()).digest())

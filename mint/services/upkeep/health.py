"""Readiness: can this process reach the database, the broker and the object store, and can
the bases it must serve be served?

Each check is timed and reports its own failure, so `/readyz` says which service is down.
The probe is public, so it says so in a fixed sentence per service; the exception, which can
name hosts, users and paths, goes to the log.

A base can serve once a live serving node has loaded it (a node registers only then). The
bases named in MINT_READY_BASES (`mint up` names those it starts nodes for) must each have one
for the process to be ready; until then `/readyz` answers 503 and names them in `loading`.
Every base with a live node is listed too, with its count of nodes.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from kombu import Connection

from mint.config import Settings
from mint.schemas.health import BaseServing, CheckResult, Readiness
from mint.services.serving.nodes import live_nodes
from mint.storage import db
from mint.storage.db import session_scope
from mint.storage.objects import object_store_for

log = logging.getLogger(__name__)

BROKER_TIMEOUT_S = 3.0


def check_database(settings: Settings) -> None:
    db.ping(settings.database)


def check_broker(settings: Settings) -> None:
    with Connection(settings.broker, connect_timeout=BROKER_TIMEOUT_S) as connection:
        connection.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)


def check_object_store(settings: Settings) -> None:
    object_store_for(settings).check()


CHECKS: dict[str, Callable[[Settings], None]] = {
    "database": check_database,
    "broker": check_broker,
    "object_store": check_object_store,
}
FAILURE_DETAILS = {
    "database": "database unreachable; the API log has the error",
    "broker": "broker unreachable; the API log has the error",
    "object_store": "object store unreachable; the API log has the error",
}


def serving_readiness(settings: Settings, database_ok: bool) -> dict[str, BaseServing]:
    """Each base that must serve (MINT_READY_BASES) or has a live node: its live nodes, and
    whether it can serve. Nothing can be told of the bases without the database."""
    required = settings.ready_base_names
    if not database_ok:
        unknown = "database unreachable: cannot tell whether a serving node has loaded this base"
        return {base: BaseServing(ready=False, live_nodes=0, detail=unknown) for base in required}
    with session_scope(settings.database) as session:
        counts = Counter(node.base_model for node in live_nodes(session))
    return {
        base: BaseServing(
            ready=counts[base] > 0,
            live_nodes=counts[base],
            detail="" if counts[base] else f"loading: no live serving node has loaded {base} yet",
        )
        for base in [*required, *sorted(set(counts) - set(required))]
    }


def readiness(settings: Settings) -> Readiness:
    results: dict[str, CheckResult] = {}
    for name, check in CHECKS.items():
        started = time.perf_counter()
        try:
            check(settings)
            results[name] = CheckResult(ok=True, latency_ms=_ms_since(started))
        except Exception as exc:  # every failure is reported, none is fatal to the probe
            log.warning("readiness check %s failed: %s: %s", name, type(exc).__name__, exc)
            results[name] = CheckResult(ok=False, detail=FAILURE_DETAILS[name], latency_ms=_ms_since(started))
    failed = [name for name, result in results.items() if not result.ok]
    try:
        serving = serving_readiness(settings, database_ok=results["database"].ok)
    except Exception as exc:  # the database went away between the checks: the bases are unknown
        log.warning("readiness of the serving nodes failed: %s: %s", type(exc).__name__, exc)
        serving = serving_readiness(settings, database_ok=False)
    loading = [base for base, state in serving.items() if not state.ready]
    return Readiness(
        status="unavailable" if failed or loading else "ok",
        checks=results,
        failed=failed,
        serving=serving,
        loading=loading,
    )


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)

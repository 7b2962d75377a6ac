"""Readiness: can this process reach the database, the broker and the object store?

Each check is timed and reports its own failure, so `/readyz` says which service is down.
The probe is public, so it says so in a fixed sentence per service; the exception, which can
name hosts, users and paths, goes to the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kombu import Connection

from mint.config import Settings
from mint.schemas.health import CheckResult, Readiness
from mint.storage import db
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
    return Readiness(status="unavailable" if failed else "ok", checks=results, failed=failed)


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)

"""Trace export of a Tinker session (`tinker session export-trace`): every request of its models
and samplers on a timeline, in the Chrome trace-event JSON that https://ui.perfetto.dev opens.

One track (thread) per model or sampler, named by its id; one slice per request (a future),
from when the API recorded it to when its result was written (a request still running ends
now), named by its operation, with its seq_id, status and error category as arguments. The
file is built from the futures table on each call and stored by its content
(`tinker/traces/<session>-<digest>.json`), so an unchanged session is not stored twice; the
answer is a download URL that needs no key (`signed_urls.download_url`). Old traces are
objects no row names: `mint admin gc` collects them after its grace period.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.schemas import tinker as wire
from mint.services.tinker import signed_urls
from mint.services.tinker.sessions import get_tinker_session
from mint.storage.keys import tinker_trace_key
from mint.storage.objects import ObjectStore
from mint.storage.tables import Future, TrainingSession, as_utc, utcnow


def trace_events(members: list[TrainingSession], futures: list[Future], now: datetime) -> dict[str, Any]:
    """The Chrome trace-event document of these models' and samplers' requests (times in µs from the first)."""
    start = min([as_utc(row.created_at) for row in members] or [now])
    track = {row.id: index + 1 for index, row in enumerate(members)}

    def micros(moment: datetime) -> int:
        return int((as_utc(moment) - start).total_seconds() * 1e6)

    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": track[row.id], "args": {"name": f"{row.kind} {row.id}"}}
        for row in members
    ]
    for future in futures:
        begin, end = micros(future.created_at), micros(future.finished_at or now)
        events.append(
            {
                "ph": "X",
                "name": future.operation,
                "pid": 1,
                "tid": track[future.session_id],
                "ts": begin,
                "dur": max(end - begin, 1),
                "args": {
                    "request_id": future.id,
                    "seq_id": future.seq_id,
                    "status": future.status,
                    "error_category": future.error_category,
                },
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def export_session_trace(
    session: Session,
    settings: Settings,
    store: ObjectStore,
    organization_id: str,
    session_id: str,
    grant: signed_urls.Grant,
) -> wire.TraceExportResponse:
    """Build the session's trace now and answer a download URL for it, standing on `grant`."""
    row = get_tinker_session(session, organization_id, session_id)
    members = list(
        session.execute(
            select(TrainingSession)
            .where(TrainingSession.tinker_session_id == row.id)
            .order_by(TrainingSession.created_at)
        ).scalars()
    )
    futures = list(
        session.execute(
            select(Future).where(Future.session_id.in_([member.id for member in members])).order_by(Future.created_at)
        ).scalars()
    )
    data = json.dumps(trace_events(members, futures, utcnow()), separators=(",", ":")).encode()
    key = tinker_trace_key(row.id, hashlib.sha256(data).hexdigest())
    if not store.exists(key):
        store.put_bytes(key, data)
    url, _ = signed_urls.download_url(settings, store, key, grant)
    return wire.TraceExportResponse(status="ready", url=url)

"""Idle Tinker sessions expire: a session whose SDK stopped heartbeating is ended by the periodic
sweep, its waiting requests fail saying why, every later request on it is a 410 that says to
create a new session, and the LoRA slot its model held on a worker serves another organization.

The worker here holds ONE LoRA session (`MINT_WORKER_MAX_SESSIONS=1`) of a base no other test
of the package trains, so the slot is plainly either taken or free."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest

from mint.config import Settings
from mint.services.tinker import sessions as tinker_service
from mint.storage.db import session_scope
from mint.storage.tables import TinkerSession, utcnow
from mint.worker.dispatch import CeleryDispatch
from tests.conftest import LiveServer, Tenant
from tests.tinker_compat.conftest import TinkerWorker, api, post_forward_backward
from tests.tinker_compat.test_order import result

pytestmark = pytest.mark.torch

ONE_SLOT_BASE = "tiny-qwen3-moe"


@pytest.fixture
def one_slot_worker(prepared: Settings) -> Iterator[TinkerWorker]:
    """A worker of one LoRA slot, on a base whose queue earlier tests left messages in (requests
    sent where no worker listened): those are purged first, or the new worker would run them and
    give the one slot to a stranger before the test begins."""
    from mint.worker.app import celery_for
    from mint.worker.queues import training_queue

    with celery_for(prepared).connection_for_write() as connection:
        connection.default_channel.queue_purge(training_queue(ONE_SLOT_BASE))
    worker = TinkerWorker(prepared, name="one-slot", base=ONE_SLOT_BASE, env={"MINT_WORKER_MAX_SESSIONS": "1"})
    try:
        yield worker
    finally:
        worker.stop()


def _create_model(http: httpx.Client, session_id: str, model_seq_id: int) -> dict[str, str]:
    body = {"session_id": session_id, "model_seq_id": model_seq_id, "base_model": ONE_SLOT_BASE}
    response = http.post("/api/v1/create_model", json={**body, "lora_config": {"rank": 4}})
    assert response.status_code == 200, response.text
    return dict(response.json())


def _new_session(http: httpx.Client) -> str:
    return str(http.post("/api/v1/create_session", json={"tags": ["expiry"]}).json()["session_id"])


def test_a_silent_session_expires_and_its_slot_serves_another_organization(
    live_server: LiveServer, alice: Tenant, bob: Tenant, one_slot_worker: TinkerWorker, prepared: Settings
) -> None:
    idle_s = prepared.tinker_session_idle_s
    with api(live_server, alice) as alice_http, api(live_server, bob) as bob_http:
        alice_session = _new_session(alice_http)
        created = _create_model(alice_http, alice_session, 0)
        alice_model = created["model_id"]
        first = result(alice_http, created["request_id"]).json()
        assert first.get("type") == "create_model", first
        # seq 1 never comes: seq 2 waits for it, as a request in flight when the SDK went away.
        waiting = post_forward_backward(alice_http, alice_model, 2, [1, 2, 3])
        assert waiting.status_code == 200, waiting.text

        # The worker's one slot is Alice's: Bob's model cannot be created.
        bob_session = _new_session(bob_http)
        refused = result(bob_http, _create_model(bob_http, bob_session, 0)["request_id"]).json()
        assert "already holds 1 sessions" in refused["error"], refused

        # Alice's SDK is gone: no heartbeat for longer than the idle limit. Bob's is alive.
        with session_scope(prepared.database) as db:
            row = db.get(TinkerSession, alice_session)
            assert row is not None
            row.last_heartbeat_at = utcnow() - timedelta(seconds=idle_s + 1)
        with session_scope(prepared.database) as db:
            expired = tinker_service.expire_idle_sessions(db, idle_s=idle_s, send=CeleryDispatch(prepared))
        assert alice_session in expired and bob_session not in expired
        with session_scope(prepared.database) as db:
            row = db.get(TinkerSession, alice_session)
            assert row is not None and row.status == "finished" and row.finish_reason == "expired"

        # Her request in flight failed, saying why; everything she sends now is a 410 that says what to do.
        failed = result(alice_http, waiting.json()["request_id"]).json()
        assert f"expired after {idle_s:g} s without a heartbeat" in failed["error"], failed
        for response in (
            post_forward_backward(alice_http, alice_model, 1, [1, 2, 3]),
            alice_http.post("/api/v1/session_heartbeat", json={"session_id": alice_session}),
            alice_http.post(
                "/api/v1/create_model",
                json={"session_id": alice_session, "model_seq_id": 1, "base_model": ONE_SLOT_BASE},
            ),
        ):
            assert response.status_code == 410, response.text
            message = response.json()["error"]["message"]
            assert f"expired after {idle_s:g} s without a heartbeat" in message and "create a new session" in message

        # The slot is free again: Bob's next model is created on the same worker.
        created = _create_model(bob_http, bob_session, 1)
        assert result(bob_http, created["request_id"]).json() == {
            "model_id": created["model_id"],
            "type": "create_model",
        }
        bob_http.post(f"/api/v1/sessions/{bob_session}/finish", json={})

"""Signed webhooks, end to end: a real HTTP receiver on loopback verifies every delivery with
the `standardwebhooks` library, as a customer's endpoint would.

A job run by a real worker delivers `fine_tuning.job.succeeded`; a receiver that answers 500
is retried with backoff (MINT_WEBHOOK_RETRY_S=0 in the worker, so no test waits) and the log
keeps every attempt; a tampered body and a rotated-away secret fail verification; events are
written in the transaction of the change they report (the outbox), and the resend sweep sends
a delivery whose message was lost. Endpoints are per organization; viewers only read.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from standardwebhooks.webhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

from mint.config import Settings
from mint.sdk import BadRequestError, Mint
from mint.services.webhooks import delivery as webhook_delivery
from mint.services.webhooks import events as webhooks
from mint.storage.db import session_scope
from mint.storage.tables import TrainingJob, WebhookDelivery, utcnow
from tests.conftest import LiveServer, Tenant, Workers, reconcile_after, register_versions, wait_for
from tests.jobs.conftest import BASE, chat_rows, upload
from tests.test_cli import mint

# Retries at once, and few of them, so a failing receiver is given up within the test.
FAST_RETRIES = {"MINT_WEBHOOK_RETRY_S": "0", "MINT_WEBHOOK_MAX_ATTEMPTS": "3"}


@dataclass
class Received:
    body: bytes
    headers: dict[str, str]

    def event(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


@dataclass
class Receiver:
    """An HTTP endpoint on 127.0.0.1 that records what it gets and answers `statuses` in turn
    (then 200)."""

    url: str
    statuses: list[int] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def got(self, count: int) -> list[Received]:
        with self.lock:
            return list(self.received) if len(self.received) >= count else []


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    box: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            target = box[0]
            body = self.rfile.read(int(self.headers["content-length"]))
            with target.lock:
                target.received.append(Received(body, {k.lower(): v for k, v in self.headers.items()}))
                status = target.statuses.pop(0) if target.statuses else 200
            answer = b"thanks" if status < 300 else b"receiver broke"
            self.send_response(status)
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box.append(Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/hooks"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield box[0]
    server.shutdown()
    thread.join(timeout=10)


def _create(client: TestClient, tenant: Tenant, url: str, events: list[str], role: str = "developer") -> Any:
    return client.post("/v1/webhooks", headers=tenant.headers(role), json={"url": url, "events": events})


def _deliveries(client: TestClient, tenant: Tenant, webhook_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/webhooks/{webhook_id}/deliveries", headers=tenant.headers("viewer"))
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


def _verified(secret: str, received: Received) -> dict[str, Any]:
    return dict(Verifier(secret).verify(received.body, received.headers))


def _deliver_here(settings: Settings, delivery_id: str) -> str:
    """One attempt made in this process, as a worker's task would make it."""
    return webhook_delivery.deliver(settings, delivery_id, send=None)


@pytest.mark.torch
def test_a_succeeded_job_delivers_a_signed_event(
    client: TestClient, tenant: Tenant, workers: Workers, receiver: Receiver
) -> None:
    workers.start("webhooks-job", env=FAST_RETRIES)
    created = _create(client, tenant, receiver.url, ["fine_tuning.job.succeeded", "fine_tuning.job.failed"])
    assert created.status_code == 201, created.text
    webhook = created.json()
    assert webhook["secret"].startswith("whsec_") and webhook["events"] == [
        "fine_tuning.job.failed",
        "fine_tuning.job.succeeded",
    ]
    file = upload(client, tenant, chat_rows(8))
    body = {"model": BASE, "training_file": file["id"], "suffix": "hooked", "steps": 2, "seed": 3}
    job = client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body).json()

    (received,) = wait_for(lambda: receiver.got(1), "the job's webhook")
    event = _verified(webhook["secret"], received)
    assert event["type"] == "fine_tuning.job.succeeded" and received.headers["webhook-id"] == event["id"]
    data = event["data"]
    assert data["id"] == job["id"] and data["status"] == "succeeded" and data["fine_tuned_model"] == "hooked@1"
    assert data["trained_tokens"] > 0 and data["model"] == BASE

    tampered = received.body.replace(b'"succeeded"', b'"failed"', 1)
    assert tampered != received.body
    with pytest.raises(WebhookVerificationError):
        Verifier(webhook["secret"]).verify(tampered, received.headers)

    def delivered() -> list[dict[str, Any]]:
        rows = _deliveries(client, tenant, webhook["id"])
        return rows if rows and rows[0]["status"] == "succeeded" else []

    (delivery,) = wait_for(delivered, "the delivery to be logged")
    assert delivery["event_id"] == event["id"] and delivery["attempts"] == 1
    assert [a["status_code"] for a in delivery["attempt_log"]] == [200]
    assert delivery["attempt_log"][0]["response"] == "thanks" and delivery["attempt_log"][0]["error"] is None


def test_a_failing_receiver_is_retried_and_each_attempt_is_logged(
    client: TestClient, tenant: Tenant, workers: Workers, receiver: Receiver
) -> None:
    workers.start("webhooks-retry", env=FAST_RETRIES)
    webhook = _create(client, tenant, receiver.url, ["eval.run.completed"]).json()
    receiver.statuses = [500, 503]
    sent = client.post(f"/v1/webhooks/{webhook['id']}/test", headers=tenant.headers("developer"))
    assert sent.status_code == 201, sent.text
    assert sent.json()["event_type"] == "webhook.test" and sent.json()["status"] == "pending"

    def finished() -> dict[str, Any] | None:
        rows = _deliveries(client, tenant, webhook["id"])
        return rows[0] if rows and rows[0]["status"] != "pending" else None

    delivery = wait_for(finished, "the retried delivery")
    assert delivery["status"] == "succeeded" and delivery["attempts"] == 3
    log = delivery["attempt_log"]
    assert [(a["attempt"], a["status_code"]) for a in log] == [(1, 500), (2, 503), (3, 200)]
    assert log[0]["error"] == "the receiver answered HTTP 500" and log[0]["response"] == "receiver broke"
    received = receiver.got(3)
    assert len(received) == 3 and len({r.headers["webhook-id"] for r in received}) == 1  # one event, three tries
    assert all(_verified(webhook["secret"], r)["type"] == "webhook.test" for r in received)

    # A receiver that never recovers: the delivery fails after MINT_WEBHOOK_MAX_ATTEMPTS, and a
    # redelivery (same event id, a new delivery) succeeds once it answers again.
    receiver.statuses = [500, 500, 500]
    client.post(f"/v1/webhooks/{webhook['id']}/test", headers=tenant.headers("developer"))
    delivery = wait_for(finished, "the delivery to give up")
    assert delivery["status"] == "failed" and [a["status_code"] for a in delivery["attempt_log"]] == [500] * 3
    path = f"/v1/webhooks/{webhook['id']}/deliveries/{delivery['id']}/redeliver"
    again = client.post(path, headers=tenant.headers("developer"))
    assert again.status_code == 201, again.text
    assert again.json()["event_id"] == delivery["event_id"] and again.json()["id"] != delivery["id"]
    redelivered = wait_for(finished, "the redelivery")
    assert redelivered["id"] == again.json()["id"] and redelivered["status"] == "succeeded"


def test_rotating_the_secret_makes_the_old_one_fail_verification(
    client: TestClient, tenant: Tenant, receiver: Receiver, prepared: Settings
) -> None:
    webhook = _create(client, tenant, receiver.url, ["deployment.promoted"]).json()
    rotated = client.post(f"/v1/webhooks/{webhook['id']}/rotate_secret", headers=tenant.headers("developer"))
    assert rotated.status_code == 200, rotated.text
    new_secret = rotated.json()["secret"]
    assert new_secret.startswith("whsec_") and new_secret != webhook["secret"]
    assert "secret" not in client.get(f"/v1/webhooks/{webhook['id']}", headers=tenant.headers()).json()

    delivery = client.post(f"/v1/webhooks/{webhook['id']}/test", headers=tenant.headers("developer")).json()
    assert _deliver_here(prepared, delivery["id"]) == "succeeded"
    assert _deliver_here(prepared, delivery["id"]) == "not-due"  # a duplicate message does nothing
    (received,) = receiver.got(1)
    assert _verified(new_secret, received)["id"] == delivery["event_id"]
    with pytest.raises(WebhookVerificationError):
        Verifier(webhook["secret"]).verify(received.body, received.headers)

    audit = client.get("/v1/audit_log?limit=50", headers=tenant.headers("admin")).json()["data"]
    actions = [entry["action"] for entry in audit if entry["resource_id"] == webhook["id"]]
    assert actions == ["webhook.rotate_secret", "webhook.create"]


def test_a_deployment_change_writes_its_event_in_the_same_transaction(
    client: TestClient, tenant: Tenant, receiver: Receiver, prepared: Settings
) -> None:
    (v1, v2) = register_versions(prepared, tenant, "hooked-support", 2)
    subscribed = _create(client, tenant, receiver.url, ["deployment.promoted", "deployment.withdrawn"]).json()
    disabled = _create(client, tenant, receiver.url, ["deployment.promoted"]).json()
    client.post(f"/v1/webhooks/{disabled['id']}", headers=tenant.headers(), json={"enabled": False})
    elsewhere = _create(client, tenant, receiver.url, ["eval.run.completed"]).json()
    deployment = client.post(
        "/v1/deployments", headers=tenant.headers("developer"), json={"name": "hooked-prod", "model": v1}
    ).json()
    path = f"/v1/deployments/{deployment['id']}"
    assert client.post(f"{path}/promote", headers=tenant.headers(), json={"model": v2}).status_code == 200
    # A refused change writes no event: it rolled back with the change.
    assert client.post(f"{path}/rollback", headers=tenant.headers(), json={"to_revision": 9}).status_code == 409
    assert client.post(f"{path}/withdraw", headers=tenant.headers(), json={"reason": "incident"}).status_code == 200

    rows = _deliveries(client, tenant, subscribed["id"])
    assert [row["event_type"] for row in rows] == ["deployment.withdrawn", "deployment.promoted"]
    assert _deliveries(client, tenant, disabled["id"]) == [] and _deliveries(client, tenant, elsewhere["id"]) == []
    for row in reversed(rows):
        assert _deliver_here(prepared, row["id"]) == "succeeded"
    events = [_verified(subscribed["secret"], received) for received in receiver.got(2)]
    assert [(e["type"], e["data"]["revision"], e["data"]["status"]) for e in events] == [
        ("deployment.promoted", 2, "active"),
        ("deployment.withdrawn", 3, "withdrawn"),
    ]
    assert events[0]["data"]["id"] == deployment["id"] and events[1]["data"]["reason"] == "incident"


def test_the_resend_sweep_sends_deliveries_whose_message_was_lost(
    client: TestClient, tenant: Tenant, receiver: Receiver, prepared: Settings
) -> None:
    webhook = _create(client, tenant, receiver.url, ["eval.run.failed"]).json()
    lost = client.post(f"/v1/webhooks/{webhook['id']}/test", headers=tenant.headers("developer")).json()
    crashed = client.post(f"/v1/webhooks/{webhook['id']}/test", headers=tenant.headers("developer")).json()
    later = client.post(f"/v1/webhooks/{webhook['id']}/test", headers=tenant.headers("developer")).json()
    long_ago = utcnow() - timedelta(hours=1)
    changes = {
        lost["id"]: {"next_attempt_at": long_ago},
        # A worker claimed its attempt and died: its claim ran out an hour ago.
        crashed["id"]: {"attempts": 1, "next_attempt_at": long_ago},
        later["id"]: {"next_attempt_at": utcnow() + timedelta(hours=1)},
    }
    with session_scope(prepared.database) as session:
        for delivery_id, values in changes.items():
            session.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(**values))
    sent: list[tuple[str, list[str]]] = []
    due = webhook_delivery.resend_due(
        prepared, lambda task, **message: sent.append((task, message["args"])), grace_s=60
    )
    ours = {lost["id"], crashed["id"], later["id"]}
    assert {delivery_id for delivery_id in due if delivery_id in ours} == {lost["id"], crashed["id"]}
    assert ("mint.webhooks.deliver", [crashed["id"]]) in sent
    assert _deliver_here(prepared, crashed["id"]) == "succeeded"
    with session_scope(prepared.database) as session:
        row = session.execute(select(WebhookDelivery).where(WebhookDelivery.id == crashed["id"])).scalar_one()
        assert row.attempts == 2 and [entry["attempt"] for entry in row.attempt_log] == [2]
    assert _deliver_here(prepared, later["id"]) == "not-due"


def test_backoff_doubles_up_to_its_cap(prepared: Settings) -> None:
    settings = prepared.model_copy(update={"webhook_retry_s": 30.0, "webhook_retry_max_s": 200.0})
    assert [webhook_delivery.retry_delay_s(settings, n) for n in range(1, 6)] == [30, 60, 120, 200, 200]


def test_webhooks_belong_to_one_organization_and_viewers_only_read(
    client: TestClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    url = "https://example.com/mint"
    assert _create(client, tenant, url, ["eval.run.completed"], role="viewer").status_code == 403
    created = _create(client, tenant, url, ["eval.run.completed"], role="admin")
    assert created.status_code == 201, created.text
    webhook = created.json()
    path = f"/v1/webhooks/{webhook['id']}"

    listed = client.get("/v1/webhooks", headers=tenant.headers("viewer")).json()
    assert [w["id"] for w in listed["data"]] == [webhook["id"]] and "secret" not in listed["data"][0]
    assert client.get(path, headers=tenant.headers("viewer")).json()["url"] == url
    assert client.post(f"{path}/test", headers=tenant.headers("viewer")).status_code == 403
    assert client.post(f"{path}/rotate_secret", headers=tenant.headers("viewer")).status_code == 403
    assert client.delete(path, headers=tenant.headers("viewer")).status_code == 403

    for request in (
        lambda: client.get(path, headers=other_tenant.headers()),
        lambda: client.get(f"{path}/deliveries", headers=other_tenant.headers()),
        lambda: client.post(f"{path}/test", headers=other_tenant.headers()),
        lambda: client.post(f"{path}/rotate_secret", headers=other_tenant.headers()),
        lambda: client.delete(path, headers=other_tenant.headers()),
    ):
        response = request()
        assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
    assert client.get("/v1/webhooks", headers=other_tenant.headers()).json()["data"] == []

    change = {"enabled": False, "events": ["eval.run.failed"]}
    updated = client.post(path, headers=tenant.headers("developer"), json=change)
    assert updated.status_code == 200, updated.text
    assert updated.json()["enabled"] is False and updated.json()["events"] == ["eval.run.failed"]
    assert updated.json()["url"] == url
    assert client.delete(path, headers=tenant.headers("developer")).status_code == 200
    assert client.get(path, headers=tenant.headers()).status_code == 404


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"url": "ftp://example.com/hook", "events": ["eval.run.failed"]}, "url"),
        ({"url": "file:///etc/passwd", "events": ["eval.run.failed"]}, "url"),
        ({"url": "https://", "events": ["eval.run.failed"]}, "url"),
        ({"url": "https://example.com", "events": ["fine_tuning.job.exploded"]}, "events.0"),
        ({"url": "https://example.com", "events": []}, "events"),
    ],
)
def test_bad_webhooks_name_the_field(client: TestClient, tenant: Tenant, body: dict[str, Any], param: str) -> None:
    response = client.post("/v1/webhooks", headers=tenant.headers("developer"), json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    if param == "url":
        assert "http:// or https://" in error["message"]


@pytest.mark.client_surface
def test_the_sdk_and_the_cli_manage_webhooks_and_read_their_deliveries(
    live_server: LiveServer, tenant: Tenant, receiver: Receiver, prepared: Settings
) -> None:
    with Mint(live_server.url, tenant.keys["developer"]) as sdk:
        hook = sdk.webhooks.create(receiver.url, events=["eval.run.completed"], description="ci")
        assert hook.secret.startswith("whsec_") and hook.events == ["eval.run.completed"]
        assert [w.id for w in sdk.webhooks.list()] == [hook.id]
        assert sdk.webhooks.update(hook.id, events=["eval.run.failed"]).events == ["eval.run.failed"]
        delivery = sdk.webhooks.test(hook.id)
        assert _deliver_here(prepared, delivery.id) == "succeeded"
        (logged,) = list(sdk.webhooks.deliveries(hook.id))
        assert logged.status == "succeeded" and logged.attempt_log[0].status_code == 200
        again = sdk.webhooks.redeliver(hook.id, logged.id)
        assert again.event_id == logged.event_id
        with pytest.raises(BadRequestError) as refused:  # checked before sending, with the server's schema
            sdk.webhooks.create("ftp://example.com", events=["eval.run.failed"])
        assert refused.value.param == "url"

    environment = {**os.environ, "MINT_BASE_URL": live_server.url, "MINT_API_KEY": tenant.keys["developer"]}
    created = json.loads(
        mint(
            "webhooks",
            "create",
            "https://example.com/hook",
            "--event",
            "deployment.promoted",
            "--json",
            env=environment,
        ).stdout
    )
    assert created["secret"].startswith("whsec_") and created["events"] == ["deployment.promoted"]
    listed = json.loads(mint("webhooks", "list", "--json", env=environment).stdout)
    assert [w["id"] for w in listed] == [created["id"], hook.id]
    deliveries = json.loads(mint("webhooks", "deliveries", hook.id, "--json", env=environment).stdout)
    assert [d["id"] for d in deliveries] == [again.id, logged.id]
    table = mint("webhooks", "deliveries", hook.id, env=environment).stdout
    assert "webhook.test" in table and "HTTP 200" in table
    mint("webhooks", "delete", created["id"], "--json", env=environment)
    assert [w["id"] for w in json.loads(mint("webhooks", "list", "--json", env=environment).stdout)] == [hook.id]


def test_events_are_sent_only_after_their_transaction_commits(
    client: TestClient, tenant: Tenant, receiver: Receiver, prepared: Settings
) -> None:
    webhook = _create(client, tenant, receiver.url, ["autotune.run.completed"]).json()
    sent: list[list[str]] = []

    def send(task: str, **message: Any) -> None:
        sent.append(message["args"])

    run = {"id": "autotune_x", "status": "succeeded"}
    with session_scope(prepared.database) as session:
        webhooks.autotune_event(session, organization_id=tenant.organization_id, data=run, completed=True, send=send)
        webhooks.autotune_event(session, organization_id=tenant.organization_id, data=run, completed=False, send=send)
        assert sent == []  # not before the commit: a worker would not find the row yet
    (delivery,) = _deliveries(client, tenant, webhook["id"])  # `failed` has no subscriber
    assert sent == [[delivery["id"]]] and delivery["payload"]["data"] == run

    with pytest.raises(RuntimeError), session_scope(prepared.database) as session:
        webhooks.autotune_event(session, organization_id=tenant.organization_id, data=run, completed=True, send=send)
        raise RuntimeError("the change fails")
    assert len(_deliveries(client, tenant, webhook["id"])) == 1 and len(sent) == 1  # rolled back with it


def test_a_job_the_reconciler_gives_up_and_one_cancelled_report_their_end(
    client: TestClient, tenant: Tenant, receiver: Receiver, prepared: Settings
) -> None:
    events = ["fine_tuning.job.failed", "fine_tuning.job.cancelled"]
    webhook = _create(client, tenant, receiver.url, events).json()
    file = upload(client, tenant, chat_rows(6))
    body = {"model": "tiny-qwen3-moe", "training_file": file["id"], "steps": 2}  # no worker here runs it
    poison, cancelled = (
        client.post("/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json=body).json()["id"]
        for _ in range(2)
    )
    assert client.post(f"/v1/fine_tuning/jobs/{cancelled}/cancel", headers=tenant.headers()).status_code == 200
    lost = {poison: {"attempts": 500, "enqueued_at": utcnow() - timedelta(hours=1)}}
    report, sent = reconcile_after(prepared, TrainingJob, lost)
    assert poison in report.gave_up

    rows = _deliveries(client, tenant, webhook["id"])
    by_type = {row["event_type"]: row for row in rows}
    assert sorted(by_type) == sorted(events) and len(rows) == 2
    failed = by_type["fine_tuning.job.failed"]["payload"]["data"]
    assert failed["id"] == poison and failed["error"]["code"] == "max_attempts_exceeded"
    assert by_type["fine_tuning.job.cancelled"]["payload"]["data"]["id"] == cancelled
    assert ("mint.webhooks.deliver", [by_type["fine_tuning.job.failed"]["id"]]) in sent  # sent once committed


def test_endpoints_on_private_networks_are_refused_unless_the_operator_allows_them(
    prepared: Settings, tenant: Tenant, receiver: Receiver
) -> None:
    """With the default settings a URL whose host is loopback, private, link-local (the cloud
    metadata service) or an IPv4-mapped private address is a 400 at create and at update, the
    stored URL unchanged; a delivery whose host has come to resolve to such an address (its URL
    changed under it here, as a DNS change would) is a failed attempt that never reaches it."""
    from mint.api.app import create_app

    strict = prepared.model_copy(update={"webhook_allow_private_networks": False})
    headers = tenant.headers("developer")
    # Deliveries are made by calling `deliver` here, not by a worker: the app's dispatch drops them.
    with TestClient(create_app(strict, dispatch=lambda task, **kw: None), raise_server_exceptions=False) as client:
        for url in (
            receiver.url,
            "http://169.254.169.254/latest/meta-data",
            "http://10.1.2.3/hooks",
            "http://[::1]:8000/hooks",
            "http://[::ffff:192.168.0.7]/hooks",
            "http://100.64.0.1/hooks",
            "http://localhost:5432/",
        ):
            refused = _create(client, tenant, url, ["eval.run.completed"])
            assert refused.status_code == 400, (url, refused.text)
            error = refused.json()["error"]
            assert error["param"] == "url" and "not a public address" in error["message"], error
            assert "MINT_WEBHOOK_ALLOW_PRIVATE_NETWORKS" in error["message"]
        public = _create(client, tenant, "https://93.184.216.34/hooks", ["eval.run.completed"])
        assert public.status_code == 201, public.text
        webhook_id = public.json()["id"]
        moved = client.post(f"/v1/webhooks/{webhook_id}", headers=headers, json={"url": receiver.url})
        assert moved.status_code == 400 and moved.json()["error"]["param"] == "url", moved.text
        assert client.get(f"/v1/webhooks/{webhook_id}", headers=headers).json()["url"] == "https://93.184.216.34/hooks"
        tested = client.post(f"/v1/webhooks/{webhook_id}/test", headers=headers)
        assert tested.status_code == 201, tested.text
        delivery_id = tested.json()["id"]
    with session_scope(prepared.database) as session:
        from mint.storage.tables import Webhook

        stored = session.get(Webhook, webhook_id)
        assert stored is not None
        stored.url = receiver.url
    assert webhook_delivery.deliver(strict, delivery_id, None) == "retrying"
    assert receiver.received == []
    with session_scope(prepared.database) as session:
        delivery = session.get(WebhookDelivery, delivery_id)
        assert delivery is not None and "not a public address" in delivery.attempt_log[-1]["error"]

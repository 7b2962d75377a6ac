"""Feedback on captured completions is bounded like every write a key can make, viewers' included:
one feedback is at most 64 KiB of JSON (400 naming the limit), a capture keeps at most 20 of them
(409), and captures and feedback count against the organization's capture storage quota
(`capture_storage_mib`: feedback past it is a 429, captures past it are dropped by the writer).
A record the writer cannot write drops only itself, not the records batched with it. A
completion that was not captured is a 404 that says so, and why.

Captures are recorded as the API's capture writer records them (this file runs no serving node;
tests/serving/test_inference_api.py captures real traffic); every feedback goes through the
HTTP API.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.schemas.captures import MAX_FEEDBACK_BYTES, MAX_FEEDBACK_PER_CAPTURE
from mint.services import auth
from mint.services.billing.quotas import STORAGE_RETRY_AFTER_S, QuotaDefaults, set_quotas
from mint.services.principal import operator
from mint.services.serving.captures import CaptureRecord, CaptureTarget, CaptureWriter
from mint.storage.db import session_scope
from mint.storage.tables import Capture, Feedback, utcnow
from tests.conftest import Tenant, record_capture, register_versions

KiB = 1024
MiB = 1024 * KiB


def deployment(client: TestClient, settings: Settings, tenant: Tenant, *, rate: float | None = None) -> str:
    """A deployment of a registered adapter version; with `rate`, capturing that share of requests."""
    (ref,) = register_versions(settings, tenant, f"captured-{secrets.token_hex(3)}", 1)
    body = {"name": f"prod-{secrets.token_hex(3)}", "model": ref}
    created = client.post("/v1/deployments", headers=tenant.headers("developer"), json=body)
    assert created.status_code == 201, created.text
    if rate is not None:
        patched = client.patch(
            f"/v1/deployments/{created.json()['id']}/capture", headers=tenant.headers("developer"), json={"rate": rate}
        )
        assert patched.status_code == 200, patched.text
    return str(created.json()["id"])


def feedback(client: TestClient, tenant: Tenant, completion_id: str, **fields: Any) -> Any:
    return client.post(f"/v1/captures/{completion_id}/feedback", headers=tenant.headers("viewer"), json=fields)


def correction_of(size_bytes: int) -> dict[str, Any]:
    """A chat correction whose feedback body (`{"correction": ...}`) is about `size_bytes` of JSON."""
    return {"message": {"role": "assistant", "content": "x" * max(0, size_bytes - 100)}}


def feedback_rows(settings: Settings, completion_id: str) -> int:
    with session_scope(settings.database) as session:
        query = select(func.count()).select_from(Feedback).where(Feedback.capture_id == completion_id)
        return int(session.execute(query).scalar_one())


def set_storage_quota(settings: Settings, tenant: Tenant, mib: int | None) -> None:
    with session_scope(settings.database) as session:
        organization = auth.find_organization(session, tenant.organization_id)
        set_quotas(session, operator(organization.id), organization, {"capture_storage_mib": mib})


def test_a_viewer_cannot_store_megabytes_through_feedback_and_the_limit_is_named(
    client: TestClient, prepared: Settings, tenant: Tenant
) -> None:
    """The report: three 12 MiB corrections by a viewer key were each answered 201, and the
    capture then read back as 38 MB. Now each is a 400 that names the limit, and nothing is kept."""
    completion_id = record_capture(tenant, deployment(client, prepared, tenant), asked="2+3?", answered="6")
    for _ in range(3):
        refused = feedback(client, tenant, completion_id, score=0.0, correction=correction_of(12 * MiB))
        assert refused.status_code == 400, refused.text[:500]
        error = refused.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "correction"
        assert "at most 64 KiB (65536 bytes) of JSON" in error["message"], error["message"][:500]
    assert feedback_rows(prepared, completion_id) == 0
    read = client.get(f"/v1/captures/{completion_id}", headers=tenant.headers("viewer"))
    assert read.status_code == 200 and len(read.content) < 4 * KiB and read.json()["feedback"] == []

    # A comment counts too: the limit is on the feedback as a whole.
    long_comment = feedback(client, tenant, completion_id, comment="y" * 9_000, correction=correction_of(60 * KiB))
    assert long_comment.status_code == 400 and "64 KiB" in long_comment.text

    # Just under the limit is one message's worth, and is kept.
    fits = feedback(client, tenant, completion_id, correction=correction_of(MAX_FEEDBACK_BYTES - 200))
    assert fits.status_code == 201, fits.text[:500]
    assert feedback_rows(prepared, completion_id) == 1


def test_a_capture_keeps_at_most_20_feedback_entries(client: TestClient, prepared: Settings, tenant: Tenant) -> None:
    completion_id = record_capture(tenant, deployment(client, prepared, tenant), asked="2+3?", answered="6")
    for index in range(MAX_FEEDBACK_PER_CAPTURE):
        given = feedback(client, tenant, completion_id, score=0.0, label=f"wrong-{index}")
        assert given.status_code == 201, given.text
    refused = feedback(client, tenant, completion_id, score=1.0)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["type"] == "conflict_error"
    assert f"already has {MAX_FEEDBACK_PER_CAPTURE} feedback entries, the most one capture keeps" in error["message"]
    assert feedback_rows(prepared, completion_id) == MAX_FEEDBACK_PER_CAPTURE
    # Another capture of the organization takes feedback as before.
    other = record_capture(tenant, deployment(client, prepared, tenant), asked="1+1?", answered="2")
    assert feedback(client, tenant, other, score=1.0).status_code == 201


def test_captures_and_feedback_count_against_the_organizations_capture_storage_quota(
    client: TestClient, prepared: Settings, tenant: Tenant, other_tenant: Tenant
) -> None:
    set_storage_quota(prepared, tenant, 1)  # 1 MiB
    deployment_id = deployment(client, prepared, tenant)
    big = record_capture(tenant, deployment_id, asked="q" * (950 * KiB), answered="a")
    first = feedback(client, tenant, big, correction=correction_of(60 * KiB))
    assert first.status_code == 201, first.text[:500]
    refused = feedback(client, tenant, big, correction=correction_of(60 * KiB))
    assert refused.status_code == 429, refused.text[:500]
    assert refused.headers["Retry-After"] == str(STORAGE_RETRY_AFTER_S)
    error = refused.json()["error"]
    assert error["type"] == "quota_exceeded_error" and error["param"] == "capture_storage_mib"
    assert "its capture_storage_mib quota of 1 MiB" in error["message"], error["message"]
    assert f"mint admin orgs quota {tenant.name} --capture-storage-mib N" in error["message"], error["message"]
    assert feedback_rows(prepared, big) == 1
    quotas = client.get("/v1/organization/quotas", headers=tenant.headers("viewer")).json()["data"]
    line = next(line for line in quotas if line["kind"] == "capture_storage_mib")
    assert (line["limit"], line["used"], line["is_default"]) == (1, 1, False)

    # The capture writer drops what would take the organization past its quota (and says so in
    # the receipt), and writes another organization's captures as before.
    writer = CaptureWriter(prepared.database, quotas=QuotaDefaults.of(prepared))
    over = writer.offer(capture_record(tenant, deployment_id, 200 * KiB))
    other_deployment = deployment(client, prepared, other_tenant)
    within = writer.offer(capture_record(other_tenant, other_deployment, 200 * KiB))
    writer.flush()
    assert (over.result(), within.result()) == (False, True)
    assert (writer.written, writer.dropped) == (1, 1)
    with session_scope(prepared.database) as session:
        stored = session.execute(select(Capture.stored_bytes).where(Capture.id == big)).scalar_one()
    assert 950 * KiB < stored < 951 * KiB

    # An operator raising the quota lets feedback in again.
    set_storage_quota(prepared, tenant, 2)
    assert feedback(client, tenant, big, correction=correction_of(60 * KiB)).status_code == 201


@dataclasses.dataclass
class HeldRecord:
    """A capture whose write waits for `release`: the writer's thread is held inside one batch
    while the test queues the next records, which are then written as one batch."""

    record: CaptureRecord
    release: threading.Event = dataclasses.field(default_factory=threading.Event)

    @property
    def organization_id(self) -> str:
        return self.record.organization_id

    @property
    def stored_bytes(self) -> int:
        return self.record.stored_bytes

    def write(self, session: Session) -> None:
        self.release.wait()
        self.record.write(session)


def test_a_capture_that_cannot_be_written_drops_only_itself(
    client: TestClient, prepared: Settings, tenant: Tenant
) -> None:
    deployment_id = deployment(client, prepared, tenant)
    writer = CaptureWriter(prepared.database)
    held = HeldRecord(capture_record(tenant, deployment_id, 10))
    first = writer.offer(held)
    # Queued behind it, so batched together: a capture whose id is already taken (its insert
    # fails at commit) between two good ones.
    before, after = capture_record(tenant, deployment_id, 10), capture_record(tenant, deployment_id, 10)
    taken = dataclasses.replace(capture_record(tenant, deployment_id, 10), id=held.record.id)
    receipts = [writer.offer(before), writer.offer(taken), writer.offer(after)]
    held.release.set()
    writer.flush()
    assert first.result() and [receipt.result() for receipt in receipts] == [True, False, True]
    assert (writer.written, writer.dropped) == (3, 1)
    with session_scope(prepared.database) as session:
        stored = session.scalars(select(Capture.id).where(Capture.deployment_id == deployment_id)).all()
    assert sorted(stored) == sorted([held.record.id, before.id, after.id])


def capture_record(tenant: Tenant, deployment_id: str, size_bytes: int) -> CaptureRecord:
    return CaptureRecord(
        id=f"chatcmpl-{secrets.token_hex(16)}",
        organization_id=tenant.organization_id,
        target=CaptureTarget(deployment_id, rate=1.0, retention_days=30),
        revision=1,
        model_ref="captured@1",
        kind="chat",
        request={"messages": [{"role": "user", "content": "q" * size_bytes}]},
        response={"choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}}]},
        prompt_tokens=1,
        completion_tokens=1,
        latency_ms=1.0,
        created_at=utcnow(),
    )


def test_a_completion_that_was_not_captured_says_so_and_why(
    client: TestClient, prepared: Settings, tenant: Tenant
) -> None:
    missing = f"chatcmpl-{secrets.token_hex(16)}"
    deployment_id = deployment(client, prepared, tenant)  # capture off
    off = feedback(client, tenant, missing, score=0.0)
    assert off.status_code == 404, off.text
    message = off.json()["error"]["message"]
    assert f"completion {missing!r} was not captured: capture is off on every deployment" in message, message

    client.patch(f"/v1/deployments/{deployment_id}/capture", headers=tenant.headers("developer"), json={"rate": 0.25})
    sampled = client.get(f"/v1/captures/{missing}", headers=tenant.headers("viewer"))
    assert sampled.status_code == 404, sampled.text
    message = sampled.json()["error"]["message"]
    assert f"completion {missing!r} was not captured: only completions of a deployment with capture on" in message
    assert "a share of 0.25" in message and "one its deployment's rate did not choose" in message, message

    not_an_answer = client.get("/v1/captures/fb_123", headers=tenant.headers("viewer"))
    assert not_an_answer.status_code == 404 and "that is not a completion's id" in not_an_answer.text


def test_a_feedback_correction_with_a_non_finite_number_is_refused(
    client: TestClient, prepared: Settings, tenant: Tenant
) -> None:
    """PostgreSQL's JSON refuses NaN: the wire refuses it first, naming where it is."""
    completion_id = record_capture(tenant, deployment(client, prepared, tenant), asked="2+3?", answered="6")
    body = '{"correction": {"message": {"role": "assistant", "content": "5", "weight": NaN}}}'
    refused = client.post(
        f"/v1/captures/{completion_id}/feedback",
        headers={**tenant.headers("viewer"), "Content-Type": "application/json"},
        content=body,
    )
    assert refused.status_code == 422 and "NaN or infinite" in refused.text, refused.text
    assert json.loads(refused.text)["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/datasets/from-captures", {"kind": "chat", "deployment": "\u0000"}, "deployment"),
        ("/v1/datasets/from-captures", {"kind": "chat", "label": "bad\u0000label"}, "label"),
        ("/v1/benchmarks/bench_x/versions/from-captures", {"split": "\u0000"}, "split"),
    ],
)
def test_a_nul_in_a_capture_filter_is_a_422_naming_the_field(
    client: TestClient, tenant: Tenant, path: str, body: dict[str, Any], param: str
) -> None:
    # PostgreSQL refuses NUL in text: the request is refused before any query.
    response = client.post(path, headers=tenant.headers("developer"), json=body)
    assert response.status_code == 422, response.text
    assert param in response.text, response.text

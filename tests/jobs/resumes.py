"""Reading a fine-tuning job and its adapter through the API, for the tests that kill a worker
mid-job and check what the resumed job made against the same job never interrupted."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import safetensors.torch
import torch
from fastapi.testclient import TestClient

from tests.conftest import Tenant, wait_for


def job_of(client: TestClient, tenant: Tenant, job_id: str) -> dict[str, Any]:
    return client.get(f"/v1/fine_tuning/jobs/{job_id}", headers=tenant.headers("viewer")).json()


def succeeded(client: TestClient, tenant: Tenant, job_id: str) -> dict[str, Any]:
    job = wait_for(
        lambda: (j := job_of(client, tenant, job_id))["status"] in ("succeeded", "failed", "cancelled") and j,
        f"job {job_id} to finish",
    )
    assert job["status"] == "succeeded", job
    return job


def adapter_weights(client: TestClient, tenant: Tenant, job: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of the job's version: its adapter, or a full-parameter job's whole model."""
    name, version = job["fine_tuned_model"].split("@")
    adapter = next(
        a for a in client.get("/v1/adapters?limit=100", headers=tenant.headers()).json()["data"] if a["name"] == name
    )
    download = client.get(f"/v1/adapters/{adapter['id']}/versions/{version}/download", headers=tenant.headers())
    with tarfile.open(fileobj=io.BytesIO(download.content)) as archive:
        names = archive.getnames()
        member = archive.extractfile(
            "model.safetensors" if "model.safetensors" in names else "adapter_model.safetensors"
        )
        assert member is not None
        return safetensors.torch.load(member.read())


def assert_same_adapter(resumed: dict[str, torch.Tensor], uninterrupted: dict[str, torch.Tensor]) -> None:
    """Bit-identical as a rule (the same steps on the same data from the same state). Across two
    processes a CPU kernel may still sum in another order (one intra-op thread against two gives
    differences of 1.5e-5 on this job), and Adam turns a last-bit difference on a near-zero
    gradient into a full-size update of that element; the adapters are then compared as a whole.
    A step lost or done twice moves them by about 5% of their norm here (15 steps against 16),
    fifty times the bound."""
    assert resumed.keys() == uninterrupted.keys()
    if all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed):
        return
    moved = sum(float((resumed[k] - uninterrupted[k]).norm() ** 2) for k in resumed) ** 0.5
    size = sum(float(uninterrupted[k].norm() ** 2) for k in resumed) ** 0.5
    assert moved <= 1e-3 * size, f"the resumed adapter differs from the uninterrupted one by {moved / size:.2e}"


def event_messages(client: TestClient, tenant: Tenant, job_id: str) -> list[str]:
    events = client.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=tenant.headers()).json()["data"]
    return [event["message"] for event in events]

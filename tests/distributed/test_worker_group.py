"""A worker group of real processes: `mint worker --base tiny-glm-moe --nproc 2` on the gloo
backend, the base sharded with FSDP2 over the two ranks.

A REST fine-tuning job runs on the group unchanged; one rank is killed in the middle of it; the
group goes down as a whole (its agent exits) without failing the job; the reconciler queues
the job again and a single-process worker resumes it from the group's last checkpoint. The
steps the group ran have the losses of the same job on one process, and the adapter the
resumed job ends with is the one the same job makes on one process, never interrupted.
"""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Tenant, Workers, wait_for
from tests.jobs.conftest import BASE, chat_rows, upload
from tests.jobs.resumes import adapter_weights, assert_same_adapter, event_messages, job_of, succeeded

pytestmark = pytest.mark.torch


def ranks_of(agent_pid: int) -> dict[int, int]:
    """The pids of the ranks torchrun's agent (`agent_pid`) started, by rank."""
    ranks = {}
    children = Path(f"/proc/{agent_pid}/task/{agent_pid}/children").read_text().split()
    for pid in children:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        variables = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        if b"RANK" in variables:
            ranks[int(variables[b"RANK"])] = int(pid)
    return ranks


def running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie waiting to be reaped does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def losses_by_step(client: TestClient, tenant: Tenant, job_id: str) -> dict[int, float]:
    """Each step's loss as first reported (a step redone after a resume reports again)."""
    events = client.get(f"/v1/fine_tuning/jobs/{job_id}/events?limit=100", headers=tenant.headers()).json()["data"]
    losses: dict[int, float] = {}
    for event in sorted(events, key=lambda e: e["created_at"]):
        data = event.get("data") or {}
        if event["type"] == "metrics" and "loss" in data:
            losses.setdefault(int(data["step"]), float(data["loss"]))
    return losses


@pytest.mark.long_run
def test_a_job_on_a_two_rank_group_survives_a_killed_rank_and_matches_one_process(
    client: TestClient, tenant: Tenant, workers: Workers
) -> None:
    file = upload(client, tenant, chat_rows(12))
    body: dict[str, Any] = {
        "model": BASE,
        "training_file": file["id"],
        "seed": 5,
        "steps": 24,
        "checkpoint_interval": 4,
        "learning_rate": 5e-3,
        "method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 4}}},
    }
    group = workers.start("group", nproc=2)
    workers.beat()
    job = client.post(
        "/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json={**body, "suffix": "grouped"}
    ).json()
    wait_for(lambda: job_of(client, tenant, job["id"])["completed_steps"] >= 5, "five steps on the group")
    ranks = ranks_of(group.pid)
    assert sorted(ranks) == [0, 1], ranks
    os.kill(ranks[1], signal.SIGKILL)

    # The whole group goes down: rank 0 leaves its job to the lease, the agent exits failed.
    assert group.wait(timeout=120) != 0
    assert not any(running(pid) for pid in ranks.values())
    at_kill = job_of(client, tenant, job["id"])
    assert at_kill["status"] == "running" and 5 <= at_kill["completed_steps"] < 24, at_kill

    workers.start("single")
    resumed = succeeded(client, tenant, job["id"])
    assert resumed["attempts"] == 2 and resumed["completed_steps"] == 24
    from_step = at_kill["completed_steps"] - at_kill["completed_steps"] % 4
    assert any(f"Resuming from checkpoint at step {from_step}" in m for m in event_messages(client, tenant, job["id"]))

    control = client.post(
        "/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json={**body, "suffix": "one-process"}
    ).json()
    uninterrupted = succeeded(client, tenant, control["id"])
    assert uninterrupted["attempts"] == 1
    on_group = losses_by_step(client, tenant, job["id"])
    on_one = losses_by_step(client, tenant, control["id"])
    assert set(range(1, from_step + 1)) <= set(on_group)
    for step in range(1, from_step + 1):
        assert math.isclose(on_group[step], on_one[step], rel_tol=1e-4), (step, on_group[step], on_one[step])
    assert_same_adapter(adapter_weights(client, tenant, resumed), adapter_weights(client, tenant, uninterrupted))

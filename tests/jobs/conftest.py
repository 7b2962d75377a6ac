"""Fixtures for the jobs service: data files, an upload helper, and real worker processes.

Workers are `python -m mint worker` subprocesses on the session's database and broker, with
short leases so the reconciler acts within seconds. Each test's workers are stopped after it
(SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Tenant

BASE = "tiny-glm-moe"
# Short leases and a fast reconciler: a killed worker's job is requeued within seconds.
FAST_RECOVERY = {"MINT_JOB_LEASE_S": "3", "MINT_RECONCILE_EVERY_S": "1", "MINT_REQUEUE_GRACE_S": "2"}


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def chat_rows(n: int = 12) -> list[dict[str, Any]]:
    """A format task a random tiny model can learn quickly: always answer `OK <n>`."""
    return [
        {"messages": [{"role": "user", "content": f"Ping {i}"}, {"role": "assistant", "content": f"OK {i % 3}"}]}
        for i in range(n)
    ]


def preference_rows(n: int = 8) -> list[dict[str, Any]]:
    return [
        {
            "input": {"messages": [{"role": "user", "content": f"Say yes {i}"}]},
            "preferred_output": [{"role": "assistant", "content": "yes"}],
            "non_preferred_output": [{"role": "assistant", "content": "no"}],
        }
        for i in range(n)
    ]


def prompt_rows(n: int = 4) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": f"Say a {i}"}], "reference": "a"} for i in range(n)]


def upload(
    client: TestClient, tenant: Tenant, rows: list[dict[str, Any]], name: str = "train.jsonl", **form: str
) -> dict[str, Any]:
    response = client.post(
        "/v1/datasets",
        headers=tenant.headers("developer"),
        files={"file": (name, jsonl(rows), "application/jsonl")},
        data=form,
    )
    assert response.status_code == 201, response.text
    return response.json()


class Workers:
    """Starts and stops worker subprocesses for one test."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, env: dict[str, str] | None = None, base: str = BASE) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "mint", "worker", "--base", base, "--name", f"{name}@%h"],
            env={**os.environ, **FAST_RECOVERY, **(env or {})},
        )
        self.processes.append(process)
        return process

    def beat(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "mint", "beat"], env={**os.environ, **FAST_RECOVERY, **(env or {})}
        )
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def workers() -> Iterator[Workers]:
    running = Workers()
    try:
        yield running
    finally:
        running.stop_all()

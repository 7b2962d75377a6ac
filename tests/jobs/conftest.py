"""Fixtures for the jobs service: data files, an upload helper, and real worker processes.

Workers are `python -m mint worker` subprocesses on the session's database and broker, with
short leases so the reconciler acts within seconds. Each test's workers are stopped after it
(SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import Tenant

BASE = "tiny-glm-moe"


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

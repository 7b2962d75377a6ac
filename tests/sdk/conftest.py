"""Fixtures for the SDK and the user commands: the API on a real socket, one training worker and
one serving node of the tiny base for the whole package, and adapter versions trained by
real jobs through the SDK.

The worker and the node are real processes (`python -m mint worker|serve --base
tiny-glm-moe`) on the session's database, broker and object store; starting them once for
the package keeps the suite's time down on small machines.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from mint.config import Settings
from mint.sdk import Job, Mint
from tests.conftest import LiveServer, Tenant, Workers, make_tenant, serving_node

BASE = "tiny-glm-moe"
# Only so that a hung process cannot hang the suite; everything here takes seconds.
HANG_S = 600.0


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def chat_rows(n: int = 8, tag: str = "") -> list[dict[str, Any]]:
    """SFT rows a random tiny model learns quickly: always answer `OK`."""
    return [
        {"messages": [{"role": "user", "content": f"Ping {tag}{i}"}, {"role": "assistant", "content": "OK"}]}
        for i in range(n)
    ]


ACK_TASKS = [
    {"id": f"ack-{i}", "messages": [{"role": "user", "content": text}], "reference": "OK"}
    for i, text in enumerate(["Ready?", "Status check.", "Are we good?", "Still there?"])
]


@pytest.fixture(scope="package")
def owner(prepared: Settings) -> Tenant:
    """The organization whose keys the SDK and CLI tests use."""
    return make_tenant(prepared)


@pytest.fixture(scope="package")
def sdk(live_server: LiveServer, owner: Tenant) -> Iterator[Mint]:
    with Mint(live_server.url, owner.keys["developer"]) as client:
        yield client


@pytest.fixture(scope="package")
def worker(prepared: Settings) -> Iterator[subprocess.Popen[bytes]]:
    """One training worker of the tiny base; it also runs the eval runs of that base."""
    running = Workers()
    try:
        yield running.start("sdk")
    finally:
        running.stop_all()


@pytest.fixture(scope="package")
def node(prepared: Settings) -> Iterator[subprocess.Popen[bytes]]:
    """A serving node of the tiny base, registered in the session's database."""
    yield from serving_node(prepared, BASE, timeout=HANG_S)


@pytest.fixture(scope="package")
def trained(sdk: Mint, worker: subprocess.Popen[bytes]) -> list[Job]:
    """Two versions of adapter `sdk-bot`, each made by a 3-step SFT job and awaited with `wait()`."""
    dataset = sdk.datasets.upload(jsonl(chat_rows(8, "sdk")), filename="sdk-train.jsonl")
    jobs = [
        sdk.jobs.create(BASE, dataset.id, suffix="sdk-bot", steps=3, seed=seed, learning_rate=1e-2) for seed in (1, 2)
    ]
    return [job.wait(poll_interval_s=0.2) for job in jobs]

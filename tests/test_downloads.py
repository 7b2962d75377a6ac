"""Downloads stream from the object store: the API holds a chunk of an object, never all of it.

A 64 MiB object is written to the store (folder or S3, by backend) and downloaded over a real
socket by a client that hashes what arrives. tracemalloc measures every allocation of this
process meanwhile: the API (uvicorn in a thread), its object store client, and the client's
own chunks. Reading the object whole, as these routes once did, peaks above 64 MiB.
"""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from collections.abc import Iterator

import httpx
import pytest

from mint.config import Settings
from mint.services.models import adapters
from mint.storage.db import session_scope
from mint.storage.objects import ObjectInfo, object_store_for
from mint.storage.tables import AdapterVersion, Dataset, new_id
from tests.conftest import TRAINING_BASE, LiveServer, Tenant

MiB = 1024 * 1024
OBJECT_BYTES = 64 * MiB
# What one download may allocate in this process: a few 1 MiB chunks in flight (store read,
# response body, socket buffers, the client's reads), nowhere near the object.
PEAK_LIMIT_BYTES = 12 * MiB


def random_chunks(size_bytes: int) -> Iterator[bytes]:
    for start in range(0, size_bytes, MiB):
        yield os.urandom(min(MiB, size_bytes - start))


def jsonl_chunks(size_bytes: int) -> Iterator[bytes]:
    line = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
    block = line * (MiB // len(line))
    for _ in range(size_bytes // len(block)):
        yield block


def put(settings: Settings, key: str, chunks: Iterator[bytes]) -> ObjectInfo:
    return object_store_for(settings).put(key, chunks)


def add_adapter_version(settings: Settings, tenant: Tenant, info: ObjectInfo) -> str:
    """An adapter whose version 1 is the object `info` (as a finished job would record it)."""
    with session_scope(settings.database) as session:
        adapter = adapters.ensure_adapter(
            session, organization_id=tenant.organization_id, name=f"big-{new_id('a')[-8:]}", base_model=TRAINING_BASE
        )
        session.add(
            AdapterVersion(
                id=new_id("adv"),
                adapter_id=adapter.id,
                version=1,
                object_key=info.key,
                sha256=info.sha256,
                size_bytes=info.size_bytes,
                base_model=TRAINING_BASE,
                rank=8,
                alpha=16.0,
            )
        )
        return adapter.id


def add_dataset(settings: Settings, tenant: Tenant, info: ObjectInfo) -> str:
    with session_scope(settings.database) as session:
        dataset = Dataset(
            id=new_id("file"),
            organization_id=tenant.organization_id,
            filename="big.jsonl",
            kind="chat",
            status="ready",
            object_key=info.key,
            sha256=info.sha256,
            size_bytes=info.size_bytes,
            row_count=1,
            validation_report={},
        )
        session.add(dataset)
        return dataset.id


def download(live_server: LiveServer, tenant: Tenant, path: str) -> tuple[httpx.Headers, str, int, int]:
    """(headers, sha256 of the body, its length, peak bytes this process allocated meanwhile)."""
    with httpx.Client(base_url=live_server.url, headers=tenant.headers("viewer"), timeout=120) as http:
        http.get("/healthz")  # connect before measuring
        digest, size = hashlib.sha256(), 0
        tracemalloc.start()
        try:
            with http.stream("GET", path) as response:
                assert response.status_code == 200, response.read()
                for chunk in response.iter_raw():
                    digest.update(chunk)
                    size += len(chunk)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    return response.headers, digest.hexdigest(), size, peak


def test_adapter_download_streams(prepared: Settings, tenant: Tenant, live_server: LiveServer) -> None:
    info = put(prepared, f"adapters/sha256/test-{new_id('x')[-12:]}.tar", random_chunks(OBJECT_BYTES))
    adapter_id = add_adapter_version(prepared, tenant, info)
    headers, sha256, size, peak = download(live_server, tenant, f"/v1/adapters/{adapter_id}/versions/1/download")
    assert (sha256, size) == (info.sha256, OBJECT_BYTES)
    assert headers["content-length"] == str(OBJECT_BYTES)
    assert headers["content-type"] == "application/x-tar"
    assert headers["x-mint-sha256"] == info.sha256
    assert peak < PEAK_LIMIT_BYTES, f"the API allocated {peak / MiB:.1f} MiB to send a 64 MiB adapter"


@pytest.mark.parametrize("route", ["/v1/files/{id}/content", "/v1/datasets/{id}/content"])
def test_dataset_content_streams(prepared: Settings, tenant: Tenant, live_server: LiveServer, route: str) -> None:
    info = put(prepared, f"datasets/sha256/test-{new_id('x')[-12:]}.jsonl", jsonl_chunks(OBJECT_BYTES))
    dataset_id = add_dataset(prepared, tenant, info)
    headers, sha256, size, peak = download(live_server, tenant, route.format(id=dataset_id))
    assert (sha256, size) == (info.sha256, info.size_bytes)
    assert info.size_bytes > 60 * MiB
    assert headers["content-length"] == str(info.size_bytes)
    assert headers["content-type"] == "application/jsonl"
    assert peak < PEAK_LIMIT_BYTES, f"the API allocated {peak / MiB:.1f} MiB to send a 64 MiB dataset"


def test_missing_object_is_a_404_before_streaming(prepared: Settings, tenant: Tenant, live_server: LiveServer) -> None:
    info = ObjectInfo(key="adapters/sha256/never-written.tar", size_bytes=1, sha256="0" * 64)
    adapter_id = add_adapter_version(prepared, tenant, info)
    with httpx.Client(base_url=live_server.url, headers=tenant.headers("viewer"), timeout=60) as http:
        response = http.get(f"/v1/adapters/{adapter_id}/versions/1/download")
    assert response.status_code == 404, response.text

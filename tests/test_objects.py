"""Contract tests for the object store, run against both backends.

The local store runs on `tmp_path`; the S3 store runs over real HTTP against moto's
server on loopback, a fresh bucket per test, so boto3's managed multipart upload, the
temp-key copy and the error translation all run as they would against S3 or MinIO.
"""

from __future__ import annotations

import hashlib
import io
import random
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, BinaryIO

import boto3
import pytest
from moto.server import ThreadedMotoServer

from mint.errors import ConfigurationError, Conflict, InvalidRequest, NotFound, PayloadTooLarge, ServiceUnavailable
from mint.storage import objects
from mint.storage.objects import (
    LocalObjectStore,
    ObjectStore,
    S3ObjectStore,
    open_object_store,
    validate_key,
)

pytestmark = pytest.mark.backend_free

MiB = 1024 * 1024
PART = 5 * MiB  # the S3 store's part size in the contract tests: S3's minimum, to keep objects small
PREFIX = "org-1/objects"  # the S3 store runs under a prefix, as production deployments do


def payload(size_bytes: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size_bytes)


def chunked(data: bytes, chunk_bytes: int) -> Iterator[bytes]:
    for start in range(0, len(data), chunk_bytes):
        yield data[start : start + chunk_bytes]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Backend:
    """A store plus two views behind its back, for checks the protocol cannot express."""

    store: ObjectStore
    leftovers: Callable[[], list[str]]  # temp objects (and open multipart uploads) still present
    plant: Callable[[str, bytes], None]  # write bytes under a key without Mint's metadata


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on a free loopback port, with dummy credentials in the environment."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        env.setenv("AWS_CONFIG_FILE", "/nonexistent")  # keep a developer's own AWS setup out
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        env.delenv("AWS_PROFILE", raising=False)
        env.delenv("AWS_SESSION_TOKEN", raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
        server.stop()


@pytest.fixture(scope="module")
def s3_client(s3_endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")


@pytest.fixture
def bucket(s3_client: Any) -> str:
    name = f"mint-test-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


def local_backend(root: Path) -> Backend:
    store = open_object_store(f"file://{root}")

    def leftovers() -> list[str]:
        return sorted(path.name for path in (root / ".incoming").iterdir())

    def plant(key: str, data: bytes) -> None:
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)

    return Backend(store, leftovers, plant)


def s3_backend(endpoint: str, client: Any, bucket: str) -> Backend:
    store = S3ObjectStore(bucket, PREFIX, endpoint_url=endpoint, part_size_bytes=PART)

    def leftovers() -> list[str]:
        temps = client.list_objects_v2(Bucket=bucket, Prefix=f"{PREFIX}/.incoming/").get("Contents", [])
        uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        return sorted(item["Key"] for item in [*temps, *uploads])

    def plant(key: str, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key=f"{PREFIX}/{key}", Body=data)

    return Backend(store, leftovers, plant)


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        return local_backend(tmp_path / "objects")
    endpoint = request.getfixturevalue("s3_endpoint")
    client = request.getfixturevalue("s3_client")
    return s3_backend(endpoint, client, request.getfixturevalue("bucket"))


# Contract: both backends.


def test_round_trip_reports_sha256_and_size(backend: Backend) -> None:
    store = backend.store
    small, large = b"hello mint", payload(2 * MiB + 123)  # a file is read in 1 MiB chunks
    cases: list[tuple[str, bytes, Iterable[bytes] | BinaryIO]] = [
        ("a/small", small, [small]),
        ("a/empty", b"", []),
        ("a/file", large, io.BytesIO(large)),
    ]
    for key, data, source in cases:
        info = store.put(key, source)
        assert (info.key, info.size_bytes, info.sha256) == (key, len(data), sha256(data))
        assert store.stat(key) == info
        assert store.get_bytes(key) == data
    assert store.put_bytes("b", small) == store.stat("b")
    with store.open("a/file") as stream:
        assert stream.read(10) == large[:10]
        assert stream.read() == large[10:]


def test_content_is_stored_once_under_its_hash_and_hashed_once(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`put_content` names the object by its sha256 and records that same digest, hashing the
    bytes once (on the helper thread, while they are written); the same content again keeps the
    object there and leaves no temp object behind."""
    store, data = backend.store, payload(MiB + 7)
    hashed: list[tuple[int, bool]] = []  # (bytes, on the helper thread)

    class CountedSha256:
        def __init__(self) -> None:
            self._digest = hashlib.sha256()

        def update(self, chunk: bytes) -> None:
            hashed.append((len(chunk), threading.current_thread().name.startswith("object-hash")))
            self._digest.update(chunk)

        def hexdigest(self) -> str:
            return self._digest.hexdigest()

    monkeypatch.setattr(objects, "hashlib", SimpleNamespace(sha256=CountedSha256))
    info = store.put_content(data, lambda digest: f"content/{digest}.bin")
    assert (info.key, info.size_bytes, info.sha256) == (f"content/{sha256(data)}.bin", len(data), sha256(data))
    assert store.stat(info.key) == info and store.get_bytes(info.key) == data
    assert hashed == [(len(data), True)]
    written = store.stat(info.key).modified_at
    assert store.put_content(data, lambda digest: f"content/{digest}.bin") == info
    assert store.stat(info.key).modified_at == written and backend.leftovers() == []


def test_stream_reads_in_bounded_chunks(backend: Backend) -> None:
    store = backend.store
    data = payload(PART + 2 * MiB + 5, seed=4)  # more than a part, and not a whole number of chunks
    info = store.put("big/streamed.bin", chunked(data, 3 * MiB))
    with store.stream("big/streamed.bin", chunk_bytes=MiB) as stream:
        assert stream.info == info
        sizes, digest = [], hashlib.sha256()
        for chunk in stream:
            sizes.append(len(chunk))
            digest.update(chunk)
    assert max(sizes) == MiB and sum(sizes) == len(data)
    assert digest.hexdigest() == info.sha256
    store.put_bytes("empty", b"")
    assert list(store.stream("empty")) == []
    assert store.stream("empty").info.size_bytes == 0


def test_stream_opens_at_once(backend: Backend) -> None:
    """A missing or foreign object is refused when the stream is made, before any byte is sent."""
    backend.plant("foreign", b"no sha256 recorded")
    for key in ("missing", "foreign"):
        with pytest.raises(NotFound):
            backend.store.stream(key)


def test_abandoned_stream_releases_its_file(tmp_path: Path) -> None:
    store = open_object_store(f"file://{tmp_path}")
    store.put_bytes("a", payload(3 * MiB))
    stream = store.stream("a", chunk_bytes=MiB)
    chunks = iter(stream)
    next(chunks)
    chunks.close()  # the client went away mid-download
    assert stream.closed


def test_streaming_put_from_iterator_larger_than_a_part(backend: Backend) -> None:
    data = payload(PART + 2 * MiB)  # more than a part: a multipart upload on S3
    info = backend.store.put("big/object.bin", chunked(data, 3 * MiB))
    assert (info.size_bytes, info.sha256) == (len(data), sha256(data))
    assert backend.store.stat("big/object.bin").sha256 == sha256(data)
    assert backend.store.get_bytes("big/object.bin") == data
    assert backend.leftovers() == []


def test_max_bytes_exceeded_leaves_nothing_and_keeps_previous(backend: Backend) -> None:
    store = backend.store
    store.put_bytes("kept", b"version 1")
    for size_bytes, limit in [(3 * MiB, 2 * MiB + 1), (PART + 2 * MiB, PART + MiB)]:  # within a part, past one
        with pytest.raises(PayloadTooLarge, match=str(limit)):
            store.put("new", chunked(payload(size_bytes), MiB), max_bytes=limit)
        with pytest.raises(PayloadTooLarge):
            store.put("kept", chunked(payload(size_bytes), MiB), max_bytes=limit)
    assert not store.exists("new")
    assert store.get_bytes("kept") == b"version 1"
    assert backend.leftovers() == []


def test_max_bytes_is_inclusive(backend: Backend) -> None:
    info = backend.store.put("exact", [b"x" * 100], max_bytes=100)
    assert info.size_bytes == 100


def test_failing_source_publishes_nothing(backend: Backend) -> None:
    store = backend.store
    store.put_bytes("kept", b"version 1")

    def broken() -> Iterator[bytes]:
        yield from chunked(payload(PART + MiB), 3 * MiB)  # past the first part on S3
        raise RuntimeError("client went away")

    for key in ("new", "kept"):
        with pytest.raises(RuntimeError, match="client went away"):
            store.put(key, broken())
    assert not store.exists("new")
    assert store.get_bytes("kept") == b"version 1"
    assert backend.leftovers() == []


def test_overwrite_is_invisible_until_complete(backend: Backend) -> None:
    store = backend.store
    old, new = payload(MiB, seed=1), payload(3 * MiB, seed=2)
    store.put_bytes("fresh-check", b"-")

    def watched(key: str, data: bytes, before: bytes | None) -> Iterator[bytes]:
        yield data[:MiB]
        # Halfway through the write, readers still see the previous state of the key.
        if before is None:
            assert not store.exists(key)
        else:
            assert store.get_bytes(key) == before and store.stat(key).sha256 == sha256(before)
        yield data[MiB:]

    store.put("k", watched("k", old, None))
    store.put("k", watched("k", new, old))
    assert store.get_bytes("k") == new
    assert store.stat("k").sha256 == sha256(new)


def test_stat_exists_delete(backend: Backend) -> None:
    store = backend.store
    with pytest.raises(NotFound):
        store.stat("missing")
    with pytest.raises(NotFound):
        store.get_bytes("missing")
    with pytest.raises(NotFound), store.open("missing"):
        pass
    assert not store.exists("missing")
    store.delete("missing")  # idempotent
    store.put_bytes("x/y", b"data")
    assert store.exists("x/y")
    store.delete("x/y")
    store.delete("x/y")
    assert not store.exists("x/y")
    with pytest.raises(NotFound):
        store.stat("x/y")


def test_list_sorted_by_key_with_prefix(backend: Backend) -> None:
    store = backend.store
    keys = ["z/y", "a/c", "a/b/2", "ab", "a/b-c", "a/b/1"]
    infos = {key: store.put_bytes(key, key.encode()) for key in keys}

    def listed(prefix: str = "") -> list[str]:
        return [info.key for info in store.list(prefix)]

    # '-' sorts before '/', so "a/b-c" comes before the keys under "a/b/".
    assert listed() == ["a/b-c", "a/b/1", "a/b/2", "a/c", "ab", "z/y"]
    assert listed("a/") == ["a/b-c", "a/b/1", "a/b/2", "a/c"]
    assert listed("a/b") == ["a/b-c", "a/b/1", "a/b/2"]
    assert listed("a/b/") == ["a/b/1", "a/b/2"]
    assert listed("a") == ["a/b-c", "a/b/1", "a/b/2", "a/c", "ab"]
    assert listed("nothing/") == []
    assert list(store.list("a/b/")) == [infos["a/b/1"], infos["a/b/2"]]
    with pytest.raises(InvalidRequest):
        listed("../")


def test_stat_and_list_report_when_the_object_was_written(backend: Backend) -> None:
    """Garbage collection tells an object in flight from an orphan by this time."""
    store = backend.store
    before = datetime.now(UTC) - timedelta(seconds=2)  # S3 keeps whole seconds; clocks differ a little
    written = store.put_bytes("when/a", b"a")
    after = datetime.now(UTC) + timedelta(seconds=2)
    stated = store.stat("when/a")
    (listed,) = store.list("when/")
    assert written.modified_at is None and stated == written == listed  # equality is by content
    for info in (stated, listed):
        assert info.modified_at is not None and before <= info.modified_at <= after


def test_objects_not_written_by_mint_are_invisible(backend: Backend) -> None:
    backend.plant("foreign", b"no sha256 recorded")
    backend.store.put_bytes("mine", b"ok")
    assert not backend.store.exists("foreign")
    with pytest.raises(NotFound), backend.store.open("foreign"):
        pass
    assert [info.key for info in backend.store.list()] == ["mine"]


BAD_KEYS = ["", "../x", "a/../b", "/abs", "a//b", "a/./b", "a/", ".", "a b", "tab\there", "ü", "a\\b",
            ".incoming/x", ".meta/x", "x" * 1025]  # fmt: skip


@pytest.mark.parametrize("key", BAD_KEYS)
def test_validate_key_rejects(key: str) -> None:
    with pytest.raises(InvalidRequest):
        validate_key(key)


@pytest.mark.parametrize("key", ["a", "a/b.c_d-E9", ".hidden/x", "a/.incoming", "x" * 1024])
def test_validate_key_accepts(key: str) -> None:
    assert validate_key(key) == key


def test_every_operation_validates_keys(backend: Backend, tmp_path: Path) -> None:
    store = backend.store
    operations: list[Callable[[str], object]] = [
        lambda key: store.put(key, [b"x"]),
        lambda key: store.put_bytes(key, b"x"),
        store.get_bytes,
        store.stream,
        lambda key: store.open(key).__enter__(),
        store.stat,
        store.exists,
        store.delete,
        lambda key: list(store.list(key)),  # as a prefix
    ]
    for operation in operations:
        for key in ["../escape", "/abs", "a//b"]:
            with pytest.raises(InvalidRequest):
                operation(key)
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize(
    "url",
    ["http://example.com/x", "ftp://host/x", "/plain/path", "objects", "file://relative/path",
     "file:///tmp/x?y=1", "s3://", "s3:///prefix", "s3://Bad_Bucket/x", "s3://bucket/../x"],
)  # fmt: skip
def test_unsupported_url_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="file:///absolute/path or s3://") as caught:
        open_object_store(url)
    if url == "s3://bucket/../x":
        assert "prefix" in str(caught.value)


def test_open_object_store_picks_the_backend(tmp_path: Path) -> None:
    local = open_object_store(f"file://{tmp_path}/new/folder")
    assert isinstance(local, LocalObjectStore) and (tmp_path / "new" / "folder").is_dir()
    assert local.url == f"file://{tmp_path}/new/folder"
    s3 = open_object_store("s3://bucket-1/some/prefix/", s3_endpoint_url="http://127.0.0.1:1")
    assert isinstance(s3, S3ObjectStore) and s3.url == "s3://bucket-1/some/prefix"


def test_check_passes_on_a_live_store(backend: Backend) -> None:
    backend.store.check()


# Backend-specific behaviour.


def test_local_check_fails_when_the_folder_is_gone(tmp_path: Path) -> None:
    store = open_object_store(f"file://{tmp_path}/objects")
    (tmp_path / "objects" / ".meta").rmdir()
    with pytest.raises(ServiceUnavailable, match="missing or not writable"):
        store.check()


def test_local_stat_and_list_read_sidecars_not_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_object_store(f"file://{tmp_path}")
    info = store.put_bytes("a/b", b"content")

    def no_hashing(*args: object) -> None:
        raise AssertionError("stat and list must not re-hash objects")

    monkeypatch.setattr(objects.hashlib, "sha256", no_hashing)
    assert store.stat("a/b") == info
    assert list(store.list()) == [info]


def test_local_keys_cannot_be_file_and_folder(tmp_path: Path) -> None:
    backend = local_backend(tmp_path)
    backend.store.put_bytes("a", b"file")
    backend.store.put_bytes("x/y", b"file")
    with pytest.raises(Conflict):
        backend.store.put_bytes("a/b", b"under a file")
    with pytest.raises(Conflict):
        backend.store.put_bytes("x", b"over a folder")
    assert backend.store.get_bytes("a") == b"file"
    assert backend.leftovers() == []


def test_s3_multipart_upload_and_multipart_copy(s3_endpoint: str, bucket: str) -> None:
    """Small part and copy thresholds send an 11 MiB object through UploadPart and UploadPartCopy."""
    store = S3ObjectStore(bucket, "p", endpoint_url=s3_endpoint, part_size_bytes=PART, copy_threshold_bytes=PART)
    calls: list[str] = []
    for operation in ("UploadPart", "UploadPartCopy", "CopyObject"):
        # The client is private; counting its requests is the only way to see which path ran.
        store._client.meta.events.register(f"before-call.s3.{operation}", lambda op=operation, **_: calls.append(op))
    data = payload(2 * PART + MiB, seed=3)
    info = store.put("model/adapter.safetensors", chunked(data, MiB))
    assert sorted(calls) == ["UploadPart"] * 3 + ["UploadPartCopy"] * 3
    assert store.stat("model/adapter.safetensors") == info
    assert info.sha256 == sha256(data)
    assert store.get_bytes("model/adapter.safetensors") == data


def test_s3_check_reports_a_missing_bucket(s3_endpoint: str) -> None:
    store = S3ObjectStore("no-such-bucket", endpoint_url=s3_endpoint)
    with pytest.raises(ServiceUnavailable, match="create the bucket 'no-such-bucket'"):
        store.check()


def test_s3_check_reports_an_endpoint_that_is_down(s3_endpoint: str) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago refuses connections
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = S3ObjectStore("bucket-1", endpoint_url=f"http://127.0.0.1:{port}")
    with pytest.raises(ServiceUnavailable, match=f"127.0.0.1:{port}"):
        store.check()


# Signed download URLs (mint.services.tinker.signed_urls) and presigned ones.


def test_signed_urls_name_one_object_until_they_expire(backend: Backend, tmp_path: Path) -> None:
    from datetime import timedelta

    from pydantic import SecretStr

    from mint.config import Settings
    from mint.errors import NotFound
    from mint.services.tinker import signed_urls
    from mint.storage.tables import utcnow

    def query(url: str) -> tuple[int, str]:
        params = dict(item.split("=") for item in url.split("?", 1)[1].split("&"))
        return int(params["expires"]), params["signature"]

    settings = Settings(home=tmp_path / "home")
    expires, signature = query(signed_urls.sign(settings, backend.store, "u", "ckpt/a.json", utcnow() + timedelta(1)))
    signed_urls.verify(settings, backend.store, "ckpt/a.json", expires, signature)  # the store's key, kept
    for resource, until in (("ckpt/b.json", expires), ("ckpt/a.json", expires + 1)):
        with pytest.raises(NotFound, match="expired"):
            signed_urls.verify(settings, backend.store, resource, until, signature)
    past, old = query(signed_urls.sign(settings, backend.store, "u", "ckpt/a.json", utcnow() - timedelta(seconds=1)))
    with pytest.raises(NotFound):
        signed_urls.verify(settings, backend.store, "ckpt/a.json", past, old)
    # An operator's key replaces the stored one: URLs signed before no longer verify.
    keyed = Settings(home=tmp_path / "home", url_signing_key=SecretStr("k" * 32))
    with pytest.raises(NotFound):
        signed_urls.verify(keyed, backend.store, "ckpt/a.json", expires, signature)
    expires, signature = query(signed_urls.sign(keyed, backend.store, "u", "ckpt/a.json", utcnow() + timedelta(1)))
    signed_urls.verify(keyed, backend.store, "ckpt/a.json", expires, signature)


def test_presigned_urls_read_an_object_without_credentials(backend: Backend) -> None:
    import httpx

    backend.store.put_bytes("tinker/external/x/adapter_config.json", b'{"r": 4}')
    url = backend.store.presigned_url("tinker/external/x/adapter_config.json", 60)
    if url is None:  # a folder: the API serves the file itself (signed_urls)
        assert isinstance(backend.store, LocalObjectStore)
        return
    # moto does not check signatures, so only the read is shown; S3 checks its own.
    assert "Signature=" in url and httpx.get(url).content == b'{"r": 4}'

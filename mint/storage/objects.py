"""The object store: named blobs (datasets, adapters, checkpoints) on a local folder or S3.

Two backends behind one small protocol, chosen by URL (`open_object_store`):

    file:///var/lib/mint/objects   LocalObjectStore, the default, also what tests run on
    s3://bucket/optional/prefix    S3ObjectStore, any S3-compatible service (AWS, MinIO)

Both stream writes in bounded chunks, hashing as they go (on a helper thread, while the
chunk is written), enforce an optional size limit,
and stream reads (`stream`: the object's size and sha256, then its bytes a chunk at a time),
so a process that serves an 8 GiB adapter never holds more than a chunk of it. Writes publish
atomically: an object is either absent or complete under its key, never half written. Every
object carries its sha256, so `stat` and `list` never re-read the bytes; they also report when
the object was last written, which garbage collection needs.
Keys come from Mint services, never from user file names, and are validated all the same
(`validate_key`), since nothing a user sends may reach a file path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, closing, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from stat import S_ISREG
from typing import Any, BinaryIO, Protocol, cast
from urllib.parse import urlsplit

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from mint.config import Settings
from mint.errors import ConfigurationError, Conflict, InvalidRequest, NotFound, PayloadTooLarge, ServiceUnavailable

MiB = 1024 * 1024
CHUNK_BYTES = 1 * MiB  # read size for file-like sources
MAX_KEY_CHARS = 1024
Source = BinaryIO | Iterable[bytes]  # what `put` streams: a file, or chunks
KeyOf = Callable[[str], str]  # a content-addressed key from a sha256 hex digest
INCOMING = ".incoming"  # temp objects being written; never listed
META = ".meta"  # local sidecars holding each object's size and sha256; never listed
SHA256_METADATA = "sha256"  # S3 user-metadata field (sent as x-amz-meta-sha256)
S3_MAX_PARTS = 10_000  # S3's limit on parts per multipart upload
S3_MAX_COPY_BYTES = 5 * 1024 * MiB  # the largest object a single CopyObject may copy

_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_PARTIAL_SEGMENT = re.compile(r"[A-Za-z0-9._-]*")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_RESERVED = frozenset({INCOMING, META})
_URL_HELP = "use file:///absolute/path or s3://bucket/optional/prefix"


@dataclass(frozen=True)
class ObjectInfo:
    """What the store knows about one object without reading it."""

    key: str
    size_bytes: int
    sha256: str  # hex digest of the content
    # When the object was last written, by the store's clock: set by `stat` and `list`, None in
    # what `put` returns. Not part of equality: two infos of the same content are equal.
    modified_at: datetime | None = field(default=None, compare=False)


class ObjectStream:
    """An object opened for reading: its `info`, then its bytes as an iterator of chunks.

    The object is opened when the stream is made, so a missing one raises NotFound before
    anything is sent. Iterating reads one chunk at a time (at most `chunk_bytes`); the file
    or connection is released when the iteration ends, fails or is abandoned, or on
    `close()`. `info.size_bytes` is the length of exactly the bytes that iteration yields.
    """

    def __init__(self, info: ObjectInfo, chunks: Iterator[bytes], close: Callable[[], None]) -> None:
        self.info = info
        self._chunks = chunks
        self._close = close
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._chunks
        finally:
            self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> ObjectStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ObjectStore(Protocol):
    """Named blobs. Keys are checked by `validate_key`; a missing object raises NotFound.

    `put` streams `source` to `key` and replaces any previous object atomically; `stream`
    reads an object a chunk at a time (what serves downloads: `get_bytes` holds the whole
    object, for small ones only); `list` is sorted by key; `delete` is idempotent; `check` is
    a cheap readiness probe that raises ServiceUnavailable saying what to fix;
    `presigned_url` is a URL that reads one object without credentials for `expires_s`
    seconds, where the store can make one (None: the API serves the download itself).

    `put_content` stores bytes under the key their sha256 names (`key_of(hex digest)`: adapter
    versions, benchmarks, samplers' snapshots), once per content: an object already under that
    key holds the same bytes and is kept. The digest is the one taken while the bytes are
    written, so they are hashed once, for the key and the recorded sha256 alike.
    """

    url: str

    def put(self, key: str, source: BinaryIO | Iterable[bytes], *, max_bytes: int | None = None) -> ObjectInfo: ...
    def put_bytes(self, key: str, data: bytes) -> ObjectInfo: ...
    def put_content(self, data: bytes, key_of: KeyOf) -> ObjectInfo: ...
    def open(self, key: str) -> AbstractContextManager[BinaryIO]: ...
    def stream(self, key: str, *, chunk_bytes: int = CHUNK_BYTES) -> ObjectStream: ...
    def get_bytes(self, key: str) -> bytes: ...
    def stat(self, key: str) -> ObjectInfo: ...
    def exists(self, key: str) -> bool: ...
    def delete(self, key: str) -> None: ...
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]: ...
    def check(self) -> None: ...
    def presigned_url(self, key: str, expires_s: int) -> str | None: ...


def validate_key(key: str) -> str:
    """Return `key` if it is a safe relative object key, else raise InvalidRequest.

    Segments are `[A-Za-z0-9._-]+` joined by `/`, never `.` or `..`; the first segment may
    not be one of the store's own folders (`.incoming`, `.meta`).
    """
    problem = _key_problem(key)
    if problem:
        raise InvalidRequest(f"invalid object key {key[:100]!r}: {problem}", param="key")
    return key


def _key_problem(key: str) -> str | None:
    if not key:
        return "it is empty"
    if len(key) > MAX_KEY_CHARS:
        return f"it is longer than {MAX_KEY_CHARS} characters"
    if key.startswith("/"):
        return "it must be relative (no leading '/')"
    segments = key.split("/")
    if segments[0] in _RESERVED:
        return f"{segments[0]!r} is reserved for the store's own use"
    for segment in segments:
        if segment in ("", ".", ".."):
            return "segments may not be empty, '.' or '..'"
        if not _SEGMENT.fullmatch(segment):
            return "segments may contain only letters, digits, '.', '_' and '-'"
    return None


def _check_prefix(prefix: str) -> str:
    """Validate a listing prefix and return its folder part ("a/b" of "a/b/c")."""
    folder, _, partial = prefix.rpartition("/")
    if prefix.startswith("/") or (folder and _key_problem(folder)) or not _PARTIAL_SEGMENT.fullmatch(partial):
        raise InvalidRequest(f"invalid listing prefix {prefix[:100]!r}: use the start of a valid key", param="prefix")
    return folder


def _not_found(key: str, url: str) -> NotFound:
    return NotFound(f"no object {key!r} in {url}")


def _exists(store: ObjectStore, key: str) -> bool:
    try:
        store.stat(key)
    except NotFound:
        return False
    return True


class _Meter:
    """Counts and hashes the bytes flowing through `chunks`, stopping at `max_bytes`.

    Each chunk is hashed on a helper thread while its consumer writes it (hashlib lets go of
    the GIL): sha256 runs at about 1 GB/s on one core, as slow as the write it would otherwise
    follow, and a trained version's handoff to serving waits on both. One chunk is hashed at a
    time, in order, so at most two chunks are held.
    """

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self._sha256 = hashlib.sha256()
        self._done = False

    def chunks(self, source: BinaryIO | Iterable[bytes]) -> Iterator[bytes]:
        read = getattr(source, "read", None)
        # Files are iterable too, but by lines; read them in fixed chunks instead.
        chunks = iter(lambda: cast(bytes, read(CHUNK_BYTES)), b"") if read else iter(source)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="object-hash") as hasher:
            hashing: Future[None] | None = None
            for chunk in chunks:
                self.size_bytes += len(chunk)
                if self.max_bytes is not None and self.size_bytes > self.max_bytes:
                    raise PayloadTooLarge(f"the object exceeds the limit of {self.max_bytes} bytes; send a smaller one")
                if hashing is not None:
                    hashing.result()
                hashing = hasher.submit(self._sha256.update, chunk)
                yield chunk
        self._done = True  # the executor's exit waited for the last chunk's hash

    @property
    def sha256(self) -> str:
        """The hex digest of every chunk, once `chunks` is exhausted."""
        assert self._done, "the digest is known once every chunk went through"
        return self._sha256.hexdigest()

    def info(self, key: str) -> ObjectInfo:
        return ObjectInfo(key=key, size_bytes=self.size_bytes, sha256=self.sha256)


class _Writes:
    """The writes both stores make of their own `put` and `_put` (a temp copy, published
    under `key_of(its sha256)`, unless `keep_existing` and an object is already there)."""

    def put(self, key: str, source: BinaryIO | Iterable[bytes], *, max_bytes: int | None = None) -> ObjectInfo:
        raise NotImplementedError

    def _put(self, source: Source, meter: _Meter, key_of: KeyOf, *, keep_existing: bool = False) -> ObjectInfo:
        raise NotImplementedError

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        return self.put(key, [data])

    def put_content(self, data: bytes, key_of: KeyOf) -> ObjectInfo:
        return self._put([data], _Meter(None), key_of, keep_existing=True)


def _fsync_replace(temp: Path, path: Path) -> None:
    """Make `temp`'s bytes durable, then move it over `path` in one step."""
    with temp.open("rb") as file:
        os.fsync(file.fileno())
    os.replace(temp, path)


class LocalObjectStore(_Writes):
    """Objects as files under one folder.

    `<root>/<key>` holds the bytes and `<root>/.meta/<key>.json` their size and sha256. A
    write goes to a temp file in `<root>/.incoming/` (same filesystem, so `os.replace` is
    atomic), then the sidecar is published, then the object: a visible object always has
    its metadata. A file without a sidecar (not written by Mint) is not an object. On disk
    a key cannot be both an object and a folder, so `a` and `a/b` cannot coexist here.

    Two files cannot change in one step: while a key is overwritten, `stat` may report the
    new sha256 an instant before `open` reads the new bytes, and two concurrent writers of
    one key may leave one's sidecar with the other's bytes. Give each key one writer.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f"file://{root}"
        self._incoming = root / INCOMING
        self._meta = root / META
        try:
            for folder in (root, self._incoming, self._meta):
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(f"cannot create the object store folder {root}: {exc}") from exc

    def put(self, key: str, source: BinaryIO | Iterable[bytes], *, max_bytes: int | None = None) -> ObjectInfo:
        """Stream `source` to `key` through a temp file; raises PayloadTooLarge past `max_bytes`."""
        self._make_room(validate_key(key))
        return self._put(source, _Meter(max_bytes), lambda _sha256: key)

    def _put(self, source: Source, meter: _Meter, key_of: KeyOf, *, keep_existing: bool = False) -> ObjectInfo:
        """Write `source` to a temp file, then publish it (sidecar first) under `key_of(its sha256)`,
        unless `keep_existing` and an object is already there."""
        fd, temp_name = tempfile.mkstemp(dir=self._incoming, prefix="object-")
        temp = Path(temp_name)
        try:
            with os.fdopen(fd, "wb") as file:
                for chunk in meter.chunks(source):
                    file.write(chunk)
            key = validate_key(key_of(meter.sha256))
            existing = self._info(key) if keep_existing else None
            if existing is not None:
                return existing
            self._make_room(key)
            info = meter.info(key)
            self._write_sidecar(info)
            _fsync_replace(temp, self.root / key)
        finally:
            temp.unlink(missing_ok=True)  # already gone after a successful publish
        return info

    @contextmanager
    def open(self, key: str) -> Iterator[BinaryIO]:
        """Yield the object's file, opened for reading."""
        if not self._meta_path(validate_key(key)).is_file():
            raise _not_found(key, self.url)
        try:
            file = (self.root / key).open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise _not_found(key, self.url) from exc
        with file:
            yield file

    def stream(self, key: str, *, chunk_bytes: int = CHUNK_BYTES) -> ObjectStream:
        """The object's file, read `chunk_bytes` at a time; its size is that of the open file."""
        info = self._info(validate_key(key))
        if info is None:
            raise _not_found(key, self.url)
        try:
            file = (self.root / key).open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise _not_found(key, self.url) from exc
        # The open file is what is sent: a concurrent overwrite replaces the path, not these bytes.
        size_bytes = os.fstat(file.fileno()).st_size
        chunks = iter(lambda: file.read(chunk_bytes), b"")
        return ObjectStream(ObjectInfo(key, size_bytes, info.sha256), chunks, file.close)

    def get_bytes(self, key: str) -> bytes:
        with self.open(key) as file:
            return file.read()

    def stat(self, key: str) -> ObjectInfo:
        info = self._info(validate_key(key))
        if info is None:
            raise _not_found(key, self.url)
        return info

    def exists(self, key: str) -> bool:
        return _exists(self, key)

    def delete(self, key: str) -> None:
        """Remove the object, then its sidecar; a missing object is not an error."""
        path = self.root / validate_key(key)
        if path.is_file():
            path.unlink(missing_ok=True)
        with suppress(FileNotFoundError, NotADirectoryError):
            self._meta_path(key).unlink()

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects whose key starts with `prefix`, sorted by key, read from their sidecars."""
        folder = _check_prefix(prefix)
        for key in self._walk(self.root / folder, folder, prefix):
            info = self._info(key)
            if info is not None:  # None: deleted since the walk saw it
                yield info

    def presigned_url(self, key: str, expires_s: int) -> str | None:
        """A folder has no URLs of its own: the API serves its downloads."""
        return None

    def check(self) -> None:
        for folder in (self.root, self._incoming, self._meta):
            if not folder.is_dir() or not os.access(folder, os.W_OK):
                raise ServiceUnavailable(
                    f"object store folder {folder} is missing or not writable; "
                    "create it, fix its permissions or fix MINT_OBJECT_STORE_URL"
                )

    def _walk(self, folder: Path, base: str, prefix: str) -> Iterator[str]:
        """Keys of the files under `folder` that start with `prefix`, in key order."""
        try:
            entries = [(entry.name + "/" if entry.is_dir() else entry.name, entry) for entry in os.scandir(folder)]
        except (FileNotFoundError, NotADirectoryError):
            return
        # A folder sorts as "name/" because every key inside it starts so; siblings then
        # interleave exactly as whole keys would ("a-b" < "a/c" since '-' < '/').
        for _, entry in sorted(entries, key=lambda pair: pair[0]):
            key = f"{base}/{entry.name}" if base else entry.name
            if not base and entry.name in _RESERVED:
                continue
            if entry.is_dir():
                if (key + "/").startswith(prefix):
                    yield from self._walk(Path(entry.path), key, prefix)
            elif entry.is_file() and key.startswith(prefix) and not _key_problem(key):
                yield key

    def _make_room(self, key: str) -> None:
        """Create the folders `key` needs, or raise Conflict if a file or folder is in the way."""
        path = self.root / key
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._meta_path(key).parent.mkdir(parents=True, exist_ok=True)
            clash = path.is_dir()
        except (FileExistsError, NotADirectoryError):
            clash = True
        if clash:
            raise Conflict(
                f"object key {key!r} clashes with an existing key in {self.url}: a local store "
                "cannot hold both 'a' and 'a/b'; choose keys that are not prefixes of one another"
            )

    def _meta_path(self, key: str) -> Path:
        return self._meta / f"{key}.json"

    def _write_sidecar(self, info: ObjectInfo) -> None:
        fd, temp_name = tempfile.mkstemp(dir=self._incoming, prefix="meta-")
        temp = Path(temp_name)
        try:
            with os.fdopen(fd, "w") as file:
                json.dump({"size_bytes": info.size_bytes, "sha256": info.sha256}, file)
            _fsync_replace(temp, self._meta_path(info.key))
        finally:
            temp.unlink(missing_ok=True)

    def _info(self, key: str) -> ObjectInfo | None:
        """The object's sidecar with the file's modification time; None unless both exist."""
        try:
            record = json.loads(self._meta_path(key).read_bytes())
            status = (self.root / key).stat()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        if not S_ISREG(status.st_mode):
            return None
        return ObjectInfo(
            key=key,
            size_bytes=int(record["size_bytes"]),
            sha256=str(record["sha256"]),
            modified_at=datetime.fromtimestamp(status.st_mtime, UTC),
        )


class S3ObjectStore(_Writes):
    """Objects in an S3 bucket under an optional prefix, through boto3.

    A write streams to `<prefix>/.incoming/<uuid>` with boto3's managed (multipart) upload,
    then is copied to its key with the `sha256` metadata, then the temp key is deleted: the
    final key only ever receives a complete object. Objects without that metadata were not
    written by Mint and are not listed. Temp keys left by a crash are never listed; a
    bucket lifecycle rule expiring `<prefix>/.incoming/` after a day reclaims them.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        part_size_bytes: int = 8 * MiB,
        copy_threshold_bytes: int = S3_MAX_COPY_BYTES,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._part_size_bytes = part_size_bytes  # also the size above which uploads go multipart
        self._copy_threshold_bytes = copy_threshold_bytes
        self._endpoint_url = endpoint_url
        self._session = boto3.Session(region_name=region)  # not thread-safe: made and used here only
        self._client = self._new_client(attempts=5, timeout_s=10)
        self._probe = self._new_client(attempts=1, timeout_s=2)  # readiness must answer fast: no retries

    def put(self, key: str, source: BinaryIO | Iterable[bytes], *, max_bytes: int | None = None) -> ObjectInfo:
        """Stream `source` to `key` through a temp key; raises PayloadTooLarge past `max_bytes`.

        boto3 reads `source` on one of its worker threads, a part at a time, and holds about
        fifteen parts in memory at most (120 MiB at the default part size).
        """
        validate_key(key)
        return self._put(source, _Meter(max_bytes), lambda _sha256: key)

    def _put(self, source: Source, meter: _Meter, key_of: KeyOf, *, keep_existing: bool = False) -> ObjectInfo:
        """Upload `source` to a temp key, then copy it to `key_of(its sha256)`, unless
        `keep_existing` and an object is already there."""
        temp = self._key(f"{INCOMING}/{uuid.uuid4().hex}")
        try:
            with self._translated():
                self._client.upload_fileobj(
                    _ChunkReader(meter.chunks(source)), self.bucket, temp, Config=self._transfer_config(meter.max_bytes)
                )
                key = validate_key(key_of(meter.sha256))
                if keep_existing and self.exists(key):
                    return self.stat(key)
                info = meter.info(key)
                self._publish(temp, self._key(key), info)
        finally:
            # A temp key that survives a failed delete is harmless: it is never listed.
            with suppress(ClientError, BotoCoreError):
                self._client.delete_object(Bucket=self.bucket, Key=temp)
        return info

    @contextmanager
    def open(self, key: str) -> Iterator[BinaryIO]:
        """Yield the object's body, a stream to `read(n)` from."""
        target = self._key(validate_key(key))
        with self._translated(key):
            response = self._client.get_object(Bucket=self.bucket, Key=target)
            with closing(response["Body"]) as body:
                self._info(key, response)  # refuses objects not written by Mint
                yield cast(BinaryIO, body)

    def stream(self, key: str, *, chunk_bytes: int = CHUNK_BYTES) -> ObjectStream:
        """The object's body (one GET), read `chunk_bytes` at a time as it arrives."""
        target = self._key(validate_key(key))
        with self._translated(key):
            response = self._client.get_object(Bucket=self.bucket, Key=target)
        body = response["Body"]
        try:
            info = self._info(key, response)  # refuses objects not written by Mint
        except NotFound:
            body.close()
            raise
        return ObjectStream(info, self._chunks(key, body, chunk_bytes), body.close)

    def _chunks(self, key: str, body: Any, chunk_bytes: int) -> Iterator[bytes]:
        with self._translated(key):
            yield from body.iter_chunks(chunk_bytes)

    def get_bytes(self, key: str) -> bytes:
        with self.open(key) as body:
            return body.read()

    def stat(self, key: str) -> ObjectInfo:
        target = self._key(validate_key(key))
        with self._translated(key):
            return self._info(key, self._client.head_object(Bucket=self.bucket, Key=target))

    def exists(self, key: str) -> bool:
        return _exists(self, key)

    def delete(self, key: str) -> None:
        target = self._key(validate_key(key))
        with self._translated():
            self._client.delete_object(Bucket=self.bucket, Key=target)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects whose key starts with `prefix`, sorted by key (S3 lists in key order)."""
        _check_prefix(prefix)
        base = f"{self.prefix}/" if self.prefix else ""
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + prefix)
        with self._translated():
            for page in pages:
                for item in page.get("Contents", []):
                    key = item["Key"][len(base) :]
                    if _key_problem(key):  # temp keys and foreign names
                        continue
                    # Listings carry no user metadata, so each sha256 costs one HEAD request.
                    try:
                        info = self.stat(key)
                    except NotFound:  # deleted since the listing, or not written by Mint
                        continue
                    yield info

    def presigned_url(self, key: str, expires_s: int) -> str | None:
        """A GET URL of the bucket itself, signed with this store's credentials for `expires_s`."""
        return self._client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self._key(validate_key(key))},
            ExpiresIn=expires_s,
        )

    def check(self) -> None:
        try:
            self._probe.head_bucket(Bucket=self.bucket)
        except (ClientError, BotoCoreError) as exc:
            raise self._unavailable(exc) from exc

    def _new_client(self, *, attempts: int, timeout_s: int) -> Any:
        compatible: dict[str, Any] = {}
        if self._endpoint_url:
            # Self-hosted S3 (MinIO, Ceph, moto) seldom serves bucket subdomains, and often
            # mishandles the CRC checksums that boto3 sends and checks by default since 1.36.
            compatible = {
                "s3": {"addressing_style": "path"},
                "request_checksum_calculation": "when_required",
                "response_checksum_validation": "when_required",
            }
        retries = {"mode": "standard", "max_attempts": attempts}
        config = Config(retries=retries, connect_timeout=timeout_s, read_timeout=6 * timeout_s, **compatible)
        return self._session.client("s3", endpoint_url=self._endpoint_url, config=config)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _transfer_config(self, size_bytes: int | None) -> TransferConfig:
        """Parts of `part_size_bytes`, larger when needed to stay under S3's part limit.

        Without a known size an upload can reach 10,000 parts, 78 GiB at the default 8 MiB.
        The classic transfer manager is pinned: with awscrt installed, boto3 would pick the
        CRT one on some (GPU) instance types, and that one may ignore these settings.
        """
        part_bytes = max(self._part_size_bytes, -(-(size_bytes or 0) // S3_MAX_PARTS))
        return TransferConfig(
            multipart_threshold=self._part_size_bytes,
            multipart_chunksize=part_bytes,
            preferred_transfer_client="classic",
        )

    def _publish(self, temp: str, target: str, info: ObjectInfo) -> None:
        """Copy the complete temp object to its key, recording its sha256 as metadata."""
        source = {"Bucket": self.bucket, "Key": temp}
        extra = {"Metadata": {SHA256_METADATA: info.sha256}, "MetadataDirective": "REPLACE"}
        if info.size_bytes <= self._copy_threshold_bytes:
            self._client.copy_object(CopySource=source, Bucket=self.bucket, Key=target, **extra)
        else:  # CopyObject stops at 5 GiB; the managed copy copies larger objects by parts
            config = self._transfer_config(info.size_bytes)
            self._client.copy(source, self.bucket, target, ExtraArgs=extra, Config=config)

    def _info(self, key: str, head: dict[str, Any]) -> ObjectInfo:
        sha256 = head.get("Metadata", {}).get(SHA256_METADATA)
        if sha256 is None:
            raise _not_found(key, self.url)
        modified_at = head.get("LastModified")  # an aware datetime, parsed by botocore
        return ObjectInfo(key=key, size_bytes=int(head["ContentLength"]), sha256=str(sha256), modified_at=modified_at)

    @contextmanager
    def _translated(self, key: str | None = None) -> Iterator[None]:
        """Turn boto errors into Mint's: NotFound for a missing `key`, else ServiceUnavailable."""
        try:
            yield
        except (ClientError, BotoCoreError) as exc:
            if key is not None and _error_code(exc) in ("404", "NoSuchKey"):
                raise _not_found(key, self.url) from exc
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: Exception) -> ServiceUnavailable:
        code = _error_code(exc)
        if code in ("404", "NoSuchBucket"):
            hint = f"create the bucket {self.bucket!r} or fix MINT_OBJECT_STORE_URL"
        elif code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            hint = "check the S3 credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the instance role)"
        else:
            hint = "check that the service is up, MINT_S3_ENDPOINT_URL and the S3 credentials"
        return ServiceUnavailable(f"object store {self.url} at {self._endpoint_url or 'AWS'} failed: {exc}; {hint}")


def _error_code(exc: Exception) -> str:
    return str(exc.response.get("Error", {}).get("Code", "")) if isinstance(exc, ClientError) else ""


class _ChunkReader:
    """The least file-like object boto3 uploads from: `read(size)` over an iterator of chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = bytearray()

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)  # not b"": a source may yield empty chunks mid-stream
            if chunk is None:
                break
            self._buffer += chunk
        size = len(self._buffer) if size < 0 else size
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data


def open_object_store(url: str, *, s3_endpoint_url: str | None = None, s3_region: str = "us-east-1") -> ObjectStore:
    """The store that `url` names; raises ConfigurationError for any other kind of URL.

    Nothing is contacted here, so a process starts while S3 is down; `check()` probes it.
    The path of a file URL is taken literally, not percent-decoded (as `mint.config` writes it).
    """
    parts = urlsplit(url)
    plain = not (parts.query or parts.fragment)
    if parts.scheme == "file" and plain and parts.netloc in ("", "localhost") and Path(parts.path).is_absolute():
        return LocalObjectStore(Path(parts.path))
    if parts.scheme == "s3" and plain and _BUCKET.fullmatch(parts.netloc):
        prefix = parts.path.strip("/")
        problem = _key_problem(prefix) if prefix else None
        if problem:
            raise ConfigurationError(f"invalid prefix in {url!r}: {problem}; {_URL_HELP}", param="object_store_url")
        return S3ObjectStore(parts.netloc, prefix, endpoint_url=s3_endpoint_url, region=s3_region)
    raise ConfigurationError(f"unsupported object store URL {url!r}; {_URL_HELP}", param="object_store_url")


@lru_cache(maxsize=8)
def _cached_store(url: str, s3_endpoint_url: str | None, s3_region: str) -> ObjectStore:
    return open_object_store(url, s3_endpoint_url=s3_endpoint_url, s3_region=s3_region)


def object_store_for(settings: Settings) -> ObjectStore:
    """The object store a process's settings name, opened once per process (clients are reusable)."""
    return _cached_store(settings.object_store, settings.s3_endpoint_url, settings.s3_region)

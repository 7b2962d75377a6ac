"""The real tiers of the adapter cache: engine slots, CPU RAM, a local SSD folder, the object store.

Each implements `mint.serving.cache.Tier` (or `Origin`, for the object store) and stores what
it is told: budgets, admission and eviction are the cache's (`mint.serving.cache`). A payload
is an adapter version's bytes and its key is their sha256, so the tiers that read bytes back
(the SSD and the object store) check them against the key, and a wrong or torn copy is
never served. Keys are validated as hex digests before they name anything, so nothing a user
sends becomes a file path.

The engine tier drives an engine through `AdapterSlots`, the two methods of
`mint.serving.engine.Engine` it needs, so any engine plugs in; `decode` turns the cached bytes
into what the engine loads. Nothing here imports torch.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any, Protocol

from mint.errors import ConfigurationError, Conflict, InvalidRequest, NotFound
from mint.serving.content_keys import checked_content, validate_content_hash
from mint.storage.objects import ObjectStore

log = logging.getLogger(__name__)

INCOMING = ".incoming"  # the disk tier's temp files, on the same filesystem as its copies
SUFFIX = ".bin"


class AdapterSlots(Protocol):
    """The part of an engine the cache drives: load an adapter under an id, unload it."""

    def add_adapter(self, adapter_id: str, source: Any) -> None: ...
    def remove_adapter(self, adapter_id: str) -> None: ...


class EngineTier:
    """The engine's adapter slots: `put` loads an adapter, `delete` unloads it.

    An engine cannot hand its adapters back (`readable` is False), so the cache reads lower
    tiers instead. `decode` turns the payload into the engine's source type (for example the
    tensors of a safetensors file); by default the engine gets the bytes.
    """

    readable = False

    def __init__(
        self,
        engine: AdapterSlots,
        *,
        max_entries: int,
        capacity_bytes: int | None = None,
        decode: Callable[[bytes], Any] = lambda payload: payload,
        name: str = "engine",
    ) -> None:
        self.name = name
        self.max_entries: int | None = max_entries
        self.capacity_bytes = capacity_bytes
        self._engine = engine
        self._decode = decode
        self._lock = threading.Lock()
        self._loaded: set[str] = set()

    def get(self, key: str) -> bytes:
        raise NotImplementedError("an engine cannot hand back its adapters; the cache reads a lower tier")

    def put(self, key: str, payload: bytes) -> None:
        self._engine.add_adapter(validate_content_hash(key), self._decode(payload))
        with self._lock:
            self._loaded.add(key)

    def delete(self, key: str) -> None:
        with self._lock:
            if key not in self._loaded:
                return
            self._loaded.discard(key)
        with suppress(NotFound):  # unloaded already: deleting is idempotent
            self._engine.remove_adapter(key)

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._loaded


class CpuTier:
    """Payloads in process memory, in a dict."""

    readable = True

    def __init__(self, *, capacity_bytes: int, max_entries: int | None = None, name: str = "cpu") -> None:
        self.name = name
        self.capacity_bytes: int | None = capacity_bytes
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._payloads: dict[str, bytes] = {}

    def get(self, key: str) -> bytes:
        with self._lock:
            payload = self._payloads.get(key)
        if payload is None:
            raise NotFound(f"no copy of {key} in the {self.name} tier")
        return payload

    def put(self, key: str, payload: bytes) -> None:
        validate_content_hash(key)
        with self._lock:
            self._payloads[key] = bytes(payload)

    def delete(self, key: str) -> None:
        with self._lock:
            self._payloads.pop(key, None)

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._payloads

    def resident_bytes(self) -> int:
        with self._lock:
            return sum(len(payload) for payload in self._payloads.values())


class LocalDiskTier:
    """Payloads as files under one folder on a local disk: `<root>/<2 hex digits>/<key>.bin`.

    A write goes to a temp file in `<root>/.incoming/`, is flushed to the disk, then moved into
    place with `os.replace`: a copy is either absent or complete under its name, even after a
    crash. Reads check the bytes against the key (`verify`) and remove a bad copy, so the
    cache reads the next tier instead. Temp files a crash left behind are removed at start;
    `stored()` lists the copies a previous process left, for `TieredCache.adopt`.

    Writes are behind by default (`write_behind`): `put` hands the payload to one writer thread
    and returns, so a promotion into the engine does not wait for the disk, and the copy is
    served from memory until its file is in place. Pending payloads are bounded
    (`max_pending_bytes`; past it, `put` waits for the writer). A write that fails, or that
    a crash interrupts, leaves no copy; the cache reads the next tier when it finds the copy
    missing, since the object store is the truth.
    """

    readable = True

    def __init__(
        self,
        root: Path,
        *,
        capacity_bytes: int,
        max_entries: int | None = None,
        verify: bool = True,
        write_behind: bool = True,
        max_pending_bytes: int = 256 * 2**20,
        name: str = "ssd",
    ) -> None:
        self.name = name
        self.capacity_bytes: int | None = capacity_bytes
        self.max_entries = max_entries
        self.root = root
        self._verify = verify
        self._incoming = root / INCOMING
        self._write_behind = write_behind
        self._max_pending_bytes = max_pending_bytes
        self._changed = threading.Condition()  # guards the pending writes and every rename or removal
        self._pending: dict[str, bytes] = {}
        self._pending_bytes = 0
        self._queue: deque[str] = deque()
        self._writer: threading.Thread | None = None
        try:
            self._incoming.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(f"cannot create the adapter cache folder {root}: {exc}") from exc
        for leftover in self._incoming.iterdir():
            leftover.unlink(missing_ok=True)

    def path(self, key: str) -> Path:
        """Where the copy of `key` lives; raises InvalidRequest unless `key` is a sha256 hex digest."""
        validate_content_hash(key)
        return self.root / key[:2] / f"{key}{SUFFIX}"

    def get(self, key: str) -> bytes:
        path = self.path(key)
        with self._changed:
            pending = self._pending.get(key)
        if pending is not None:
            return pending  # checked by whoever put it; its file is not written yet
        try:
            payload = path.read_bytes()
        except FileNotFoundError as exc:
            raise NotFound(f"no copy of {key} in the {self.name} tier") from exc
        if self._verify:
            try:
                checked_content(key, payload, str(path))
            except Conflict as exc:
                path.unlink(missing_ok=True)
                raise NotFound(f"the {self.name} tier's copy of {key} was damaged and is removed") from exc
        return payload

    def put(self, key: str, payload: bytes) -> None:
        validate_content_hash(key)
        if not self._write_behind:
            self._publish(self._write_temp(key, payload), key, raise_errors=True)
            return
        with self._changed:
            while self._pending and self._pending_bytes + len(payload) > self._max_pending_bytes:
                self._changed.wait()
            self._forget_pending(key)
            self._pending[key] = payload
            self._pending_bytes += len(payload)
            self._queue.append(key)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name=f"{self.name}-writer", daemon=True)
                self._writer.start()
            self._changed.notify_all()

    def delete(self, key: str) -> None:
        path = self.path(key)
        with self._changed:
            self._forget_pending(key)
            path.unlink(missing_ok=True)

    def contains(self, key: str) -> bool:
        path = self.path(key)
        with self._changed:
            return key in self._pending or path.is_file()

    def flush(self) -> None:
        """Wait until every pending write is on the disk (or has failed)."""
        with self._changed:
            while self._pending:
                self._changed.wait()

    def stored(self) -> Iterator[tuple[str, int]]:
        """(key, size in bytes) of every copy in the folder; files with other names are ignored."""
        for folder in sorted(self.root.iterdir()):
            if folder.name == INCOMING or not folder.is_dir():
                continue
            for file in sorted(folder.iterdir()):
                key = file.name.removesuffix(SUFFIX)
                if file.name.endswith(SUFFIX) and _is_hash(key) and key[:2] == folder.name and file.is_file():
                    yield key, file.stat().st_size

    def _write_temp(self, key: str, payload: bytes) -> str:
        """Write `payload` to a new temp file, flushed to the disk; its name (removed if it fails)."""
        self.path(key).parent.mkdir(exist_ok=True)
        fd, temp_name = tempfile.mkstemp(dir=self._incoming, prefix=f"{key[:12]}-")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(payload)
                file.flush()
                os.fsync(file.fileno())
        except BaseException:
            Path(temp_name).unlink(missing_ok=True)
            raise
        return temp_name

    def _publish(self, temp_name: str, key: str, *, raise_errors: bool = False) -> None:
        """Move a written temp file into place as the copy of `key`; the temp file is gone after."""
        try:
            os.replace(temp_name, self.path(key))
        except OSError as error:
            Path(temp_name).unlink(missing_ok=True)
            if raise_errors:
                raise
            log.warning("adapter cache: publishing %s in the %s tier failed: %s", key, self.name, error)

    def _forget_pending(self, key: str) -> None:
        """Drop a pending write of `key` (under the condition): its writer will discard its file."""
        payload = self._pending.pop(key, None)
        if payload is not None:
            self._pending_bytes -= len(payload)
            self._changed.notify_all()

    def _write_loop(self) -> None:
        while True:
            with self._changed:
                while not self._queue:
                    self._changed.wait()
                key = self._queue.popleft()
                payload = self._pending.get(key)
            if payload is None:
                continue  # deleted, or replaced by a later put queued after this one
            try:
                temp_name: str | None = self._write_temp(key, payload)
            except Exception as error:  # noqa: BLE001 - a cache copy that cannot be written is simply absent
                log.warning("adapter cache: writing %s to the %s tier failed: %s", key, self.name, error)
                temp_name = None
            with self._changed:
                if self._pending.get(key) is payload:
                    if temp_name is not None:
                        self._publish(temp_name, key)
                        temp_name = None
                    self._forget_pending(key)
            if temp_name is not None:
                Path(temp_name).unlink(missing_ok=True)


def _is_hash(key: str) -> bool:
    try:
        validate_content_hash(key)
    except InvalidRequest:
        return False
    return True


class ObjectStoreTier:
    """The origin: adapter versions in Mint's object store, read by content hash.

    Object keys are the storage layer's (`adapters/<id>/<version>/...`), not content hashes,
    so `resolve` maps a content hash to its object key, raising NotFound for an unknown one
    (a serving node resolves through its deployments' adapter versions). The bytes read are
    checked against the hash, so an object overwritten since is refused, never served.
    """

    def __init__(
        self,
        store: ObjectStore,
        resolve: Callable[[str], str],
        *,
        verify: bool = True,
        name: str = "object_store",
    ) -> None:
        self.name = name
        self._store = store
        self._resolve = resolve
        self._verify = verify

    def get(self, key: str) -> bytes:
        object_key = self._resolve(validate_content_hash(key))
        payload = self._store.get_bytes(object_key)
        return checked_content(key, payload, f"object {object_key!r} in {self._store.url}") if self._verify else payload

    def contains(self, key: str) -> bool:
        try:
            object_key = self._resolve(validate_content_hash(key))
        except NotFound:
            return False
        return self._store.exists(object_key)

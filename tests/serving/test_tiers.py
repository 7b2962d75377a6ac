"""The real tiers of the adapter cache (`mint.serving.tiers`), on temp folders and a local object store."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mint.errors import Conflict, InvalidRequest, NotFound
from mint.serving.cache import Tier, TieredCache
from mint.serving.content_keys import content_hash
from mint.serving.tiers import CpuTier, EngineTier, LocalDiskTier, ObjectStoreTier
from mint.storage.objects import LocalObjectStore

pytestmark = pytest.mark.backend_free

PAYLOADS = [f"safetensors bytes of adapter version {number}".encode() * 20 for number in range(6)]
KEYS = [content_hash(payload) for payload in PAYLOADS]
BAD_KEYS = ["../../etc/passwd", KEYS[0].upper(), KEYS[0][:40], "x" * 64, f"{KEYS[0][:62]}/a"]


class RecordingEngine:
    """An engine's adapter slots, as `mint.serving.engine.Engine` exposes them."""

    def __init__(self) -> None:
        self.loaded: dict[str, object] = {}
        self.calls: list[tuple[str, str]] = []

    def add_adapter(self, adapter_id: str, source: object) -> None:
        self.loaded[adapter_id] = source
        self.calls.append(("add", adapter_id))

    def remove_adapter(self, adapter_id: str) -> None:
        if adapter_id not in self.loaded:
            raise NotFound(f"adapter {adapter_id} is not loaded")
        del self.loaded[adapter_id]
        self.calls.append(("remove", adapter_id))


# ---- CPU -------------------------------------------------------------------------------------


def test_cpu_tier_round_trip() -> None:
    tier = CpuTier(capacity_bytes=10_000)
    tier.put(KEYS[0], PAYLOADS[0])
    assert tier.contains(KEYS[0]) and tier.get(KEYS[0]) == PAYLOADS[0]
    assert tier.resident_bytes() == len(PAYLOADS[0])

    tier.delete(KEYS[0])
    tier.delete(KEYS[0])  # idempotent
    assert not tier.contains(KEYS[0])
    with pytest.raises(NotFound):
        tier.get(KEYS[0])
    with pytest.raises(InvalidRequest):
        tier.put("not a hash", PAYLOADS[0])


# ---- local disk ------------------------------------------------------------------------------


def test_disk_tier_round_trip(tmp_path: Path) -> None:
    tier = LocalDiskTier(tmp_path / "ssd", capacity_bytes=10_000)
    for key, payload in zip(KEYS[:3], PAYLOADS[:3], strict=True):
        tier.put(key, payload)
    tier.flush()
    assert tier.get(KEYS[1]) == PAYLOADS[1] and tier.contains(KEYS[2])
    assert tier.path(KEYS[1]) == tmp_path / "ssd" / KEYS[1][:2] / f"{KEYS[1]}.bin"

    tier.delete(KEYS[1])
    tier.delete(KEYS[1])
    assert not tier.contains(KEYS[1])
    with pytest.raises(NotFound):
        tier.get(KEYS[1])
    assert sorted(tier.stored()) == sorted([(KEYS[0], len(PAYLOADS[0])), (KEYS[2], len(PAYLOADS[2]))])


def test_disk_tier_publishes_complete_files_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tier = LocalDiskTier(tmp_path, capacity_bytes=10_000)
    final = tier.path(KEYS[0])
    seen: list[tuple[bytes, bool]] = []
    real_replace = os.replace

    def checking_replace(source: str, target: Path) -> None:
        seen.append((Path(source).read_bytes(), final.exists()))  # what is about to appear, and whether early
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", checking_replace)
    tier.put(KEYS[0], PAYLOADS[0])
    tier.flush()
    assert seen == [(PAYLOADS[0], False)]
    assert final.read_bytes() == PAYLOADS[0]
    assert list((tmp_path / ".incoming").iterdir()) == []


def test_disk_tier_leaves_nothing_when_a_write_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    behind = LocalDiskTier(tmp_path / "behind", capacity_bytes=10_000)
    behind.put(KEYS[0], PAYLOADS[0])  # accepted; the copy is served from memory until written
    behind.flush()
    assert not behind.contains(KEYS[0])
    with pytest.raises(NotFound):
        behind.get(KEYS[0])  # the cache then reads the next tier
    through = LocalDiskTier(tmp_path / "through", capacity_bytes=10_000, write_behind=False)
    with pytest.raises(OSError, match="No space"):
        through.put(KEYS[0], PAYLOADS[0])
    assert not through.contains(KEYS[0])
    for tier in (behind, through):
        assert list((tier.root / ".incoming").iterdir()) == []


def test_disk_tier_serves_a_copy_before_its_file_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tier = LocalDiskTier(tmp_path, capacity_bytes=10_000)
    disk_free = threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        disk_free.wait()
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    tier.put(KEYS[0], PAYLOADS[0])
    tier.put(KEYS[1], PAYLOADS[1])
    assert tier.get(KEYS[0]) == PAYLOADS[0] and tier.contains(KEYS[1])
    assert not tier.path(KEYS[0]).exists()
    tier.delete(KEYS[1])  # deleted while pending: its file never appears
    disk_free.set()
    tier.flush()
    assert tier.path(KEYS[0]).read_bytes() == PAYLOADS[0]
    assert not tier.contains(KEYS[1]) and not tier.path(KEYS[1]).exists()
    assert list(tier.stored()) == [(KEYS[0], len(PAYLOADS[0]))]
    assert list((tmp_path / ".incoming").iterdir()) == []


def test_disk_tier_bounds_its_pending_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    size = len(PAYLOADS[0])
    tier = LocalDiskTier(tmp_path, capacity_bytes=10_000, max_pending_bytes=size)
    written: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        real_fsync(fd)
        written.append(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    for key, payload in zip(KEYS[:3], PAYLOADS[:3], strict=True):
        tier.put(key, payload)  # waits for the previous write: one payload's bytes may be pending
        assert len(written) >= KEYS.index(key)
    tier.flush()
    assert sorted(tier.stored()) == sorted((key, len(PAYLOADS[0])) for key in KEYS[:3])


def test_disk_tier_removes_temp_files_a_crash_left(tmp_path: Path) -> None:
    (tmp_path / ".incoming").mkdir()
    (tmp_path / ".incoming" / "half-written").write_bytes(b"\0" * 10)
    LocalDiskTier(tmp_path, capacity_bytes=10_000)
    assert list((tmp_path / ".incoming").iterdir()) == []


def test_disk_tier_refuses_a_damaged_copy_and_removes_it(tmp_path: Path) -> None:
    tier = LocalDiskTier(tmp_path, capacity_bytes=10_000)
    tier.put(KEYS[0], PAYLOADS[0])
    tier.flush()
    tier.path(KEYS[0]).write_bytes(PAYLOADS[0][:-1])  # torn
    with pytest.raises(NotFound, match="damaged"):
        tier.get(KEYS[0])
    assert not tier.contains(KEYS[0])


@pytest.mark.parametrize("key", BAD_KEYS)
def test_disk_tier_refuses_keys_that_are_not_hashes(tmp_path: Path, key: str) -> None:
    root = tmp_path / "ssd"
    tier = LocalDiskTier(root, capacity_bytes=10_000)
    for call in (tier.get, tier.delete, tier.contains, lambda key: tier.put(key, b"x")):
        with pytest.raises(InvalidRequest, match="content hash"):
            call(key)
    assert [path.relative_to(tmp_path).as_posix() for path in sorted(tmp_path.rglob("*"))] == [
        "ssd",
        "ssd/.incoming",
    ]


def test_disk_tier_lists_only_its_own_files(tmp_path: Path) -> None:
    tier = LocalDiskTier(tmp_path, capacity_bytes=10_000)
    tier.put(KEYS[0], PAYLOADS[0])
    tier.flush()
    (tmp_path / KEYS[0][:2] / "notes.txt").write_text("not a copy")
    (tmp_path / "zz").mkdir()
    (tmp_path / "zz" / f"{KEYS[1]}.bin").write_bytes(PAYLOADS[1])  # in the wrong folder
    assert list(tier.stored()) == [(KEYS[0], len(PAYLOADS[0]))]


# ---- object store ----------------------------------------------------------------------------


def object_store_tier(tmp_path: Path) -> tuple[ObjectStoreTier, LocalObjectStore, dict[str, str]]:
    store = LocalObjectStore(tmp_path / "objects")
    object_keys: dict[str, str] = {}
    for number, (key, payload) in enumerate(zip(KEYS[:3], PAYLOADS[:3], strict=True)):
        object_keys[key] = f"adapters/adapter-{number}/v1/adapter.safetensors"
        store.put_bytes(object_keys[key], payload)

    def resolve(key: str) -> str:
        if key not in object_keys:
            raise NotFound(f"no adapter version has sha256 {key}")
        return object_keys[key]

    return ObjectStoreTier(store, resolve), store, object_keys


def test_object_store_tier_reads_versions_by_content_hash(tmp_path: Path) -> None:
    tier, store, object_keys = object_store_tier(tmp_path)
    assert tier.get(KEYS[1]) == PAYLOADS[1]
    assert tier.contains(KEYS[1]) and not tier.contains(KEYS[5])
    with pytest.raises(NotFound):
        tier.get(KEYS[5])
    with pytest.raises(InvalidRequest):
        tier.get("adapters/adapter-1/v1/adapter.safetensors")


def test_object_store_tier_refuses_an_object_overwritten_since(tmp_path: Path) -> None:
    tier, store, object_keys = object_store_tier(tmp_path)
    store.put_bytes(object_keys[KEYS[0]], PAYLOADS[4])
    with pytest.raises(Conflict, match=KEYS[4]):
        tier.get(KEYS[0])


# ---- engine ----------------------------------------------------------------------------------


def test_engine_tier_loads_and_unloads_through_the_engine() -> None:
    engine = RecordingEngine()
    tier = EngineTier(engine, max_entries=2, decode=lambda payload: ("decoded", len(payload)))
    tier.put(KEYS[0], PAYLOADS[0])
    assert tier.contains(KEYS[0]) and engine.loaded[KEYS[0]] == ("decoded", len(PAYLOADS[0]))

    tier.delete(KEYS[0])
    tier.delete(KEYS[0])
    assert engine.calls == [("add", KEYS[0]), ("remove", KEYS[0])]
    assert not tier.readable
    with pytest.raises(NotImplementedError):
        tier.get(KEYS[0])


# ---- all together ----------------------------------------------------------------------------


def test_a_cache_over_the_real_tiers(tmp_path: Path) -> None:
    origin, store, object_keys = object_store_tier(tmp_path)
    size = len(PAYLOADS[0])

    def build() -> tuple[TieredCache, RecordingEngine, LocalDiskTier]:
        engine, disk = RecordingEngine(), LocalDiskTier(tmp_path / "ssd", capacity_bytes=3 * size)
        tiers: list[Tier] = [EngineTier(engine, max_entries=1), CpuTier(capacity_bytes=size), disk]
        return TieredCache(tiers, origin), engine, disk

    cache, engine, disk = build()
    for key in KEYS[:3]:
        with cache.acquire(key) as lease:
            assert engine.loaded[lease.key] == PAYLOADS[KEYS.index(key)]
    assert list(engine.loaded) == [KEYS[2]]
    with cache.acquire(KEYS[0]) as lease:
        assert lease.source == "ssd"

    # A new process finds the SSD's copies, adopts them and serves from them.
    disk.flush()
    restarted, engine, disk = build()
    adopted = [key for key, size_bytes in disk.stored() if restarted.adopt("ssd", key, size_bytes)]
    assert sorted(adopted) == sorted(KEYS[:3])
    store.delete(object_keys[KEYS[1]])  # the origin is not needed for an adopted copy
    with restarted.acquire(KEYS[1]) as lease:
        assert lease.source == "ssd"
    assert list(engine.loaded) == [KEYS[1]]

"""The adapter cache's policy (`mint.serving.cache`) over in-memory tiers.

The fake tiers store real bytes and check their own budgets on every write, so a policy that
over-commits a tier, even for an instant between two threads, fails the test that caused it.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from mint.errors import Conflict, InvalidRequest, NotFound, ServiceUnavailable
from mint.serving.cache import CacheFull, Lease, TieredCache
from mint.serving.cache_stats import register_metrics
from mint.serving.content_keys import content_hash

pytestmark = pytest.mark.backend_free


class FakeTier:
    """A tier in memory that records what the cache asks of it and every budget overflow."""

    def __init__(
        self, name: str, *, capacity_bytes: int | None = None, max_entries: int | None = None, readable: bool = True
    ) -> None:
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.max_entries = max_entries
        self.readable = readable
        self.copies: dict[str, bytes] = {}
        self.reads: Counter[str] = Counter()
        self.puts: list[str] = []
        self.deletes: list[str] = []
        self.overflows: list[str] = []
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes:
        assert self.readable, f"the cache read the unreadable tier {self.name}"
        with self._lock:
            self.reads[key] += 1
            payload = self.copies.get(key)
        if payload is None:
            raise NotFound(f"no {key} in {self.name}")
        return payload

    def put(self, key: str, payload: bytes) -> None:
        with self._lock:
            self.copies[key] = payload
            self.puts.append(key)
            size = sum(len(copy) for copy in self.copies.values())
            if (self.capacity_bytes is not None and size > self.capacity_bytes) or (
                self.max_entries is not None and len(self.copies) > self.max_entries
            ):
                self.overflows.append(f"{self.name}: {len(self.copies)} copies, {size} bytes")

    def delete(self, key: str) -> None:
        with self._lock:
            self.copies.pop(key, None)
            self.deletes.append(key)

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self.copies

    def resident_bytes(self) -> int:
        with self._lock:
            return sum(len(copy) for copy in self.copies.values())


class FakeOrigin:
    """The object store: every payload it was given; `gate` makes reads wait until it is set."""

    name = "object_store"

    def __init__(self, payloads: list[bytes], *, advance: list[float] | None = None) -> None:
        self.payloads = {content_hash(payload): payload for payload in payloads}
        self.reads: Counter[str] = Counter()
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self._advance = advance  # a fake clock, moved 2 s by every read
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes:
        with self._lock:
            self.reads[key] += 1
        self.entered.set()
        self.gate.wait()
        if self._advance is not None:
            self._advance[0] += 2.0
        if key not in self.payloads:
            raise NotFound(f"no adapter version {key}")
        return self.payloads[key]


def adapter(number: int, size_bytes: int = 100) -> bytes:
    return f"adapter {number} ".encode().ljust(size_bytes, b".")


PAYLOADS = [adapter(number) for number in range(40)]
KEYS = [content_hash(payload) for payload in PAYLOADS]
A, B, C, D = KEYS[:4]


def three_tiers(
    *, engine_slots: int = 2, cpu_entries: int = 4, ssd_entries: int = 40, window_fraction: float = 0.01
) -> tuple[TieredCache, FakeTier, FakeTier, FakeTier, FakeOrigin]:
    engine = FakeTier("engine", max_entries=engine_slots, readable=False)
    cpu = FakeTier("cpu", capacity_bytes=100 * cpu_entries)
    ssd = FakeTier("ssd", capacity_bytes=100 * ssd_entries)
    origin = FakeOrigin(PAYLOADS)
    cache = TieredCache([engine, cpu, ssd], origin, window_fraction=window_fraction)
    return cache, engine, cpu, ssd, origin


def touch(cache: TieredCache, *keys: str) -> None:
    for key in keys:
        cache.acquire(key).release()


def wait_until(condition: Callable[[], bool]) -> None:
    """Poll `condition` with short Event-based waits, to build contention in a known shape."""
    idle = threading.Event()
    while not condition():
        idle.wait(0.001)


# ---- promotion -------------------------------------------------------------------------------


def test_a_promotion_from_the_origin_fills_every_tier_and_the_next_acquire_hits() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()

    with cache.acquire(A) as lease:
        assert (lease.key, lease.source, lease.size_bytes) == (A, "object_store", 100)
    assert engine.copies[A] == cpu.copies[A] == ssd.copies[A] == PAYLOADS[0]

    with cache.acquire(A) as lease:
        assert lease.source == "engine"
    assert origin.reads[A] == 1
    assert engine.puts == [A]


def test_a_promotion_reads_the_nearest_copy() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(engine_slots=1, cpu_entries=2)
    touch(cache, A, B)  # the engine's one slot now holds B; the CPU holds both

    with cache.acquire(A) as lease:
        assert lease.source == "cpu"
    touch(cache, C, D)  # the CPU (2 entries) gives A up; the SSD keeps it
    assert not cpu.contains(A)

    with cache.acquire(A) as lease:
        assert lease.source == "ssd"
    assert origin.reads[A] == 1
    assert cpu.contains(A)  # filled again on the way up


def test_a_copy_lost_behind_the_cache_is_skipped() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(engine_slots=1)
    touch(cache, A, B)
    cpu.delete(A)
    ssd.delete(A)

    with cache.acquire(A) as lease:
        assert lease.source == "object_store"
    assert origin.reads[A] == 2
    assert cpu.contains(A) and ssd.contains(A)


def test_a_new_version_is_a_new_entry_never_the_old_copy() -> None:
    old, new = b"weights of version 1", b"weights of version 2"
    engine = FakeTier("engine", max_entries=4, readable=False)
    cpu = FakeTier("cpu", capacity_bytes=1000)
    cache = TieredCache([engine, cpu], FakeOrigin([old, new]))

    touch(cache, content_hash(old))
    with cache.acquire(content_hash(new)) as lease:
        assert (lease.key, lease.source) == (content_hash(new), "object_store")
    assert engine.copies == {content_hash(old): old, content_hash(new): new}


@pytest.mark.parametrize("key", ["../../etc/passwd", A.upper(), A[:63], A + "0", "", "g" * 64])
def test_keys_that_are_not_content_hashes_are_refused(key: str) -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    for call in (cache.acquire, cache.pin, lambda key: cache.prefetch([key])):
        with pytest.raises(InvalidRequest, match="content hash"):
            call(key)
    assert not origin.reads and not engine.puts


def test_checked_origin_bytes_are_hashed_while_the_engine_takes_them_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `check_origin`, the payload's sha256 is taken on a helper thread while the engine
    loads it: the hash here waits for the engine's put to begin (a check made before the put
    would wait out its 10 s and be recorded first), and the lease comes once both are done."""
    engine = FakeTier("engine", max_entries=2, readable=False)
    cpu = FakeTier("cpu", capacity_bytes=1000)
    cache = TieredCache([engine, cpu], FakeOrigin(PAYLOADS), check_origin=True)
    putting, order = threading.Event(), []
    engine_put = engine.put

    def put(key: str, payload: bytes) -> None:
        putting.set()
        engine_put(key, payload)
        order.append("engine put")

    def hashed(payload: bytes) -> str:
        putting.wait(10)
        order.append(f"hashed on {threading.current_thread().name}")
        return content_hash(payload)

    monkeypatch.setattr(engine, "put", put)
    monkeypatch.setattr("mint.serving.content_keys.content_hash", hashed)
    with cache.acquire(A) as lease:
        assert lease.source == "object_store" and sorted(order) == ["engine put", "hashed on origin-check"]
    assert order[0] == "engine put" and cpu.copies == {A: PAYLOADS[0]}


def test_an_origin_payload_that_is_not_its_version_is_never_leased() -> None:
    """An object overwritten in the store behind Mint's back: the engine's copy is taken out,
    no lower tier gets one, every waiter hears Conflict, and the version is served once the
    store holds its bytes again."""
    engine = FakeTier("engine", max_entries=2, readable=False)
    cpu = FakeTier("cpu", capacity_bytes=1000)
    origin = FakeOrigin(PAYLOADS)
    origin.payloads[A] = PAYLOADS[5]
    cache = TieredCache([engine, cpu], origin, check_origin=True)

    with pytest.raises(
        Conflict, match=f"object_store holds content with sha256 {KEYS[5]}, not the adapter version {A}"
    ):
        cache.acquire(A)
    assert engine.puts == [A] and engine.deletes == [A] and not engine.copies and not cpu.puts
    with pytest.raises(Conflict):
        cache.prefetch([A])
    assert not cpu.copies
    stats = cache.stats()
    assert stats.leases == 0 and stats.tier("engine").resident_entries == 0 and stats.tier("cpu").resident_entries == 0

    origin.payloads[A] = PAYLOADS[0]
    with cache.acquire(A) as lease:
        assert lease.source == "object_store" and engine.copies == {A: PAYLOADS[0]}
    assert cpu.copies == {A: PAYLOADS[0]}


def test_an_unknown_version_is_not_found_and_leaves_nothing_behind() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    with pytest.raises(NotFound):
        cache.acquire(content_hash(b"never uploaded"))
    assert cache.stats().tier("engine").resident_entries == 0
    assert not engine.puts


def test_a_failed_write_into_the_engine_fails_the_acquire_and_holds_nothing() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    plain_put = engine.put

    def failing_put(key: str, payload: bytes) -> None:
        raise ServiceUnavailable("the engine ran out of GPU memory")

    engine.put = failing_put  # type: ignore[method-assign]
    with pytest.raises(ServiceUnavailable, match="GPU memory"):
        cache.acquire(A)
    stats = cache.stats()
    assert (stats.leases, stats.tier("engine").resident_entries) == (0, 0)
    assert cpu.contains(A) and ssd.contains(A)  # the lower tiers kept their copies

    engine.put = plain_put  # type: ignore[method-assign]
    with cache.acquire(A) as lease:
        assert lease.source == "cpu"


# ---- single flight ---------------------------------------------------------------------------


def test_many_threads_waiting_for_one_adapter_cause_one_fetch() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    threads_n = 8
    leases: list[Lease] = []
    origin.gate.clear()

    def request() -> None:
        leases.append(cache.acquire(A))

    threads = [threading.Thread(target=request) for _ in range(threads_n)]
    threads[0].start()
    origin.entered.wait()  # the first is fetching; the others must join its flight
    for thread in threads[1:]:
        thread.start()
    wait_until(lambda: cache.stats().tier("engine").misses == threads_n)
    origin.gate.set()
    for thread in threads:
        thread.join()

    assert origin.reads[A] == 1
    assert engine.puts == [A]
    assert sorted(lease.source for lease in leases) == ["object_store"] * threads_n
    assert cache.stats().leases == threads_n
    for lease in leases:
        lease.release()
    assert cache.stats().leases == 0


def test_a_failed_fetch_fails_every_waiter_once_and_is_retried_next_time() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    missing = content_hash(b"never uploaded")
    errors: list[BaseException] = []
    origin.gate.clear()

    def request() -> None:
        try:
            cache.acquire(missing)
        except NotFound as error:
            errors.append(error)

    threads = [threading.Thread(target=request) for _ in range(4)]
    threads[0].start()
    origin.entered.wait()
    for thread in threads[1:]:
        thread.start()
    wait_until(lambda: cache.stats().tier("engine").misses == 4)
    origin.gate.set()
    for thread in threads:
        thread.join()

    assert len(errors) == 4 and origin.reads[missing] == 1
    with pytest.raises(NotFound):
        cache.acquire(missing)
    assert origin.reads[missing] == 2


# ---- holds -----------------------------------------------------------------------------------


def test_a_leased_adapter_is_never_evicted_from_the_engine() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(engine_slots=2)
    lease = cache.acquire(A)
    touch(cache, *KEYS[1:10])
    assert engine.contains(A) and A not in engine.deletes

    lease.release()
    touch(cache, *KEYS[10:14], *KEYS[10:14])  # more frequent than A now
    assert not engine.contains(A)


def test_a_pinned_adapter_keeps_every_copy_until_unpinned() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(engine_slots=2, cpu_entries=1)
    cache.pin(A)
    touch(cache, *KEYS[1:10])
    assert engine.contains(A) and cpu.contains(A)  # the CPU's one entry stays A's
    assert cache.stats().pinned == 1

    cache.unpin(A)
    touch(cache, *KEYS[10:14])
    assert not engine.contains(A) and cache.stats().pinned == 0
    with pytest.raises(InvalidRequest, match="not pinned"):
        cache.unpin(A)


def test_pins_count_up() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(engine_slots=1)
    cache.pin(A)
    cache.pin(A)
    cache.unpin(A)
    with pytest.raises(CacheFull):
        cache.acquire(B)
    cache.unpin(A)
    touch(cache, B)


def test_cache_full_when_everything_in_the_engine_is_pinned() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(engine_slots=2)
    cache.pin(A)
    cache.pin(B)
    with pytest.raises(CacheFull, match="unpin") as raised:
        cache.acquire(C)
    assert isinstance(raised.value, ServiceUnavailable)
    assert set(engine.copies) == {A, B} and not engine.overflows

    cache.unpin(B)
    touch(cache, C)
    assert set(engine.copies) == {A, C}


def test_cache_full_when_everything_in_the_engine_is_in_use() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(engine_slots=2)
    first, second = cache.acquire(A), cache.acquire(B)
    with pytest.raises(CacheFull):
        cache.acquire(C)
    first.release()
    with cache.acquire(C) as lease:
        assert lease.source in ("cpu", "ssd", "object_store")
    second.release()
    assert not engine.overflows


def test_room_taken_only_by_moves_in_flight_is_waited_for_not_refused() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(engine_slots=2)
    touch(cache, A, D)  # the engine is full, and nothing in it is in use
    gate, writing = threading.Event(), threading.Event()
    plain_put = engine.put

    def slow_put(key: str, payload: bytes) -> None:
        if key == B:
            writing.set()
            gate.wait()
        plain_put(key, payload)

    engine.put = slow_put  # type: ignore[method-assign]
    outcomes: list[str] = []

    def request(key: str) -> None:
        try:
            with cache.acquire(key) as lease:
                outcomes.append(lease.source)
                gate.wait()
        except CacheFull:
            outcomes.append("full")

    first = threading.Thread(target=request, args=(B,))
    first.start()
    writing.wait()  # B's promotion has evicted one of A, D and reserved its slot
    second = threading.Thread(target=request, args=(C,))
    second.start()
    wait_until(lambda: origin.reads[C] == 1)
    threading.Event().wait(0.05)  # let C's promotion find the engine's room taken by B's move
    gate.set()
    first.join()
    second.join()

    assert sorted(outcomes) == ["object_store", "object_store"]
    assert not engine.overflows


def test_an_adapter_larger_than_the_engine_budget_is_refused() -> None:
    big = adapter(99, size_bytes=500)
    engine = FakeTier("engine", capacity_bytes=400, max_entries=4, readable=False)
    cache = TieredCache([engine], FakeOrigin([big]))
    with pytest.raises(CacheFull, match="400 bytes"):
        cache.acquire(content_hash(big))


def test_a_lease_is_a_context_manager_and_releasing_twice_is_harmless() -> None:
    cache, *_ = three_tiers()
    with cache.acquire(A) as lease:
        assert cache.stats().leases == 1
    assert cache.stats().leases == 0
    lease.release()
    cache.release(lease)
    assert cache.stats().leases == 0


# ---- eviction by an operator ----------------------------------------------------------------


def assert_consistent(cache: TieredCache, *tiers: FakeTier) -> None:
    """The stats match what each tier holds, and every copy is accounted for by the counters."""
    stats = cache.stats()
    for tier in tiers:
        counted = stats.tier(tier.name)
        assert counted.resident_entries == len(tier.copies)
        assert counted.resident_bytes == tier.resident_bytes()
        assert counted.promotions + counted.demotions - counted.evictions == counted.resident_entries
        assert not tier.overflows


def test_evict_from_one_tier_removes_that_copy_only() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    touch(cache, A, B)

    assert cache.evict(A, tier="cpu") == ["cpu"]
    assert not cpu.contains(A) and engine.contains(A) and ssd.contains(A)
    assert cpu.contains(B)
    stats = cache.stats()
    assert [stats.tier(name).evictions for name in ("engine", "cpu", "ssd")] == [0, 1, 0]
    assert (stats.tier("cpu").resident_entries, stats.tier("cpu").resident_bytes) == (1, 100)
    assert_consistent(cache, engine, cpu, ssd)

    assert cache.evict(A, tier="cpu") == []  # no copy there any more
    with cache.acquire(A) as lease:
        assert lease.source == "engine"


def test_evict_from_every_tier_leaves_only_the_origin() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    touch(cache, A, B)

    assert cache.evict(A) == ["engine", "cpu", "ssd"]
    assert A not in engine.copies and A not in cpu.copies and A not in ssd.copies
    assert ssd.reads[A] == 0  # deleted, never demoted
    stats = cache.stats()
    assert [stats.tier(name).evictions for name in ("engine", "cpu", "ssd")] == [1, 1, 1]
    assert [stats.tier(name).demotions for name in ("engine", "cpu", "ssd")] == [0, 0, 0]
    assert [stats.tier(name).resident_entries for name in ("engine", "cpu", "ssd")] == [1, 1, 1]
    assert_consistent(cache, engine, cpu, ssd)

    assert cache.evict(A) == []
    with cache.acquire(A) as lease:
        assert lease.source == "object_store"
    assert origin.reads[A] == 2


def test_an_evicted_adapter_comes_back_from_the_next_tier_that_has_it() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    touch(cache, A)

    assert cache.evict(A, tier="engine") == ["engine"]
    with cache.acquire(A) as lease:
        assert lease.source == "cpu"
    assert cache.evict(A, tier="engine") == ["engine"]
    assert cache.evict(A, tier="cpu") == ["cpu"]
    with cache.acquire(A) as lease:
        assert lease.source == "ssd"
    assert origin.reads[A] == 1 and cpu.contains(A)  # filled again on the way up
    stats = cache.stats()
    assert (stats.tier("engine").hits, stats.tier("cpu").hits, stats.tier("ssd").hits) == (0, 1, 1)
    assert_consistent(cache, engine, cpu, ssd)


def test_an_evicted_slot_is_free_for_the_next_adapter() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(engine_slots=2)
    touch(cache, A, B)
    cache.evict(B, tier="engine")

    touch(cache, C)  # takes B's slot: nothing else has to go
    assert set(engine.copies) == {A, C}
    assert cache.stats().tier("engine").evictions == 1
    assert_consistent(cache, engine, cpu, ssd)


def test_evicting_an_adapter_in_use_from_the_engine_is_a_conflict() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    lease = cache.acquire(A)
    for tier in ("engine", None):
        with pytest.raises(Conflict, match="in use.*retry the eviction after those requests finish"):
            cache.evict(A, tier=tier)
    assert engine.contains(A) and cpu.contains(A) and ssd.contains(A)
    assert cache.evict(A, tier="cpu") == ["cpu"]  # a lease holds the engine's copy only

    lease.release()
    assert cache.evict(A) == ["engine", "ssd"]
    assert_consistent(cache, engine, cpu, ssd)
    assert cache.stats().leases == 0


def test_evicting_a_pinned_adapter_is_a_conflict_until_unpinned() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    cache.pin(A)
    for tier in ("engine", "cpu", "ssd", None):
        with pytest.raises(Conflict, match="pinned.*unpin it first"):
            cache.evict(A, tier=tier)
    assert engine.contains(A) and cpu.contains(A) and ssd.contains(A)

    cache.unpin(A)
    assert cache.evict(A) == ["engine", "cpu", "ssd"]
    assert_consistent(cache, engine, cpu, ssd)


def test_evict_checks_its_key_and_tier() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    touch(cache, A)
    with pytest.raises(InvalidRequest, match="content hash"):
        cache.evict(A.upper())
    for tier in ("gpu", "object_store"):
        with pytest.raises(InvalidRequest, match=r"no cache tier named .*\['engine', 'cpu', 'ssd'\]"):
            cache.evict(A, tier=tier)
    assert cache.evict(content_hash(b"never uploaded")) == []
    assert cache.evict(B, tier="cpu") == []
    assert not engine.deletes and not cpu.deletes and not ssd.deletes


def test_a_failed_delete_keeps_that_copy_counted_and_raises() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    touch(cache, A)

    def failing_delete(key: str) -> None:
        raise ServiceUnavailable("the disk is read-only")

    ssd.delete = failing_delete  # type: ignore[method-assign]
    with pytest.raises(ServiceUnavailable, match="read-only"):
        cache.evict(A)
    assert not engine.contains(A) and not cpu.contains(A) and ssd.contains(A)
    stats = cache.stats()
    assert [stats.tier(name).evictions for name in ("engine", "cpu", "ssd")] == [1, 1, 0]
    assert_consistent(cache, engine, cpu, ssd)
    with cache.acquire(A) as lease:
        assert lease.source == "ssd"


def test_evict_waits_for_a_promotion_in_flight_and_then_finds_it_in_use() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    origin.gate.clear()
    leases: list[Lease] = []
    outcomes: list[str] = []

    def evict() -> None:
        try:
            outcomes.append(",".join(cache.evict(A)))
        except Conflict:
            outcomes.append("in use")

    acquiring = threading.Thread(target=lambda: leases.append(cache.acquire(A)))
    acquiring.start()
    origin.entered.wait()  # A's promotion is fetching it
    evicting = threading.Thread(target=evict)
    evicting.start()
    threading.Event().wait(0.05)  # let the eviction find the flight and wait for it
    assert outcomes == []
    origin.gate.set()
    acquiring.join()
    evicting.join()

    assert outcomes == ["in use"]
    assert engine.contains(A) and leases[0].source == "object_store"
    leases[0].release()
    assert_consistent(cache, engine, cpu, ssd)


def test_an_acquire_during_an_eviction_waits_and_fetches_from_the_next_tier() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    touch(cache, A)
    deleting, gate = threading.Event(), threading.Event()
    plain_delete = engine.delete

    def slow_delete(key: str) -> None:
        deleting.set()
        gate.wait()
        plain_delete(key)

    engine.delete = slow_delete  # type: ignore[method-assign]
    evicted: list[list[str]] = []
    sources: list[str] = []

    def acquire() -> None:
        with cache.acquire(A) as lease:
            sources.append(lease.source)

    evicting = threading.Thread(target=lambda: evicted.append(cache.evict(A, tier="engine")))
    evicting.start()
    deleting.wait()
    acquiring = threading.Thread(target=acquire)
    acquiring.start()
    wait_until(lambda: cache.stats().tier("engine").misses == 2)  # it found no engine copy, and waits
    assert sources == []
    gate.set()
    evicting.join()
    acquiring.join()

    assert evicted == [["engine"]] and sources == ["cpu"]
    assert engine.copies == {A: PAYLOADS[0]} and origin.reads[A] == 1
    assert_consistent(cache, engine, cpu, ssd)


def test_concurrent_acquires_and_evictions_of_the_same_keys_stay_consistent() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(engine_slots=2, cpu_entries=2, ssd_entries=3)
    keys = [A, B, C]
    wrong: list[str] = []

    def traffic(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(200):
            key = rng.choice(keys)
            try:
                if rng.random() < 0.5:
                    with cache.acquire(key) as lease:
                        if engine.copies.get(lease.key) != PAYLOADS[KEYS.index(key)]:
                            wrong.append(key)
                else:
                    tier = rng.choice(["engine", "cpu", "ssd", None])
                    removed = cache.evict(key, tier=tier)
                    if tier is not None and removed not in ([], [tier]):
                        wrong.append(f"{key} from {tier}: {removed}")
            except (Conflict, CacheFull):  # in use, or the engine's slots all are: fair refusals
                pass

    threads = [threading.Thread(target=traffic, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert wrong == []
    assert cache.stats().leases == 0
    assert_consistent(cache, engine, cpu, ssd)
    for key in keys:  # the cache knows exactly which copies are where
        cache.evict(key)
    assert engine.copies == cpu.copies == ssd.copies == {}
    assert_consistent(cache, engine, cpu, ssd)
    with cache.acquire(A) as lease:
        assert lease.source == "object_store"


# ---- policy ----------------------------------------------------------------------------------


def test_demotion_moves_an_evicted_copy_down_from_a_readable_tier() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(engine_slots=2, cpu_entries=1)
    cpu.put(A, PAYLOADS[0])
    assert cache.adopt("cpu", A, 100)  # a copy in the CPU only

    touch(cache, B)  # the CPU's one entry goes to B; A moves down to the SSD
    assert ssd.copies[A] == PAYLOADS[0] and cpu.reads[A] == 1
    assert not cpu.contains(A)
    assert cache.stats().tier("ssd").demotions == 1


def test_demotion_from_the_engine_reads_a_lower_copy() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(engine_slots=2, cpu_entries=1)
    touch(cache, A, B)  # the engine holds A and B; the CPU only B; the SSD both
    touch(cache, B, B)  # B is now more frequent than A
    touch(cache, C)  # the engine evicts A, which has no CPU copy: demoted there from the SSD

    assert set(engine.copies) == {B, C}
    assert set(cpu.copies) == {A}
    assert ssd.reads[A] == 1 and origin.reads[A] == 1
    assert cache.stats().tier("cpu").demotions == 1


def test_frequency_keeps_a_popular_adapter_through_a_scan_that_lru_does_not() -> None:
    for window_fraction, survives in ((0.01, True), (1.0, False)):
        cache, engine, *_ = three_tiers(engine_slots=4, window_fraction=window_fraction)
        touch(cache, *[A] * 5)
        touch(cache, *KEYS[10:30])  # one request each
        assert engine.contains(A) is survives


def test_a_request_served_by_the_engine_counts_for_the_copies_below_it() -> None:
    engine = FakeTier("engine", max_entries=2, readable=False)
    ssd = FakeTier("ssd", capacity_bytes=200)
    cache = TieredCache([engine, ssd], FakeOrigin(PAYLOADS), window_fraction=1.0)  # LRU: recency decides
    touch(cache, A, B, A, A)  # A is served by the engine, and is the most recent on the SSD too
    cache.prefetch([C])  # the SSD makes room for C
    assert set(ssd.copies) == {A, C}


def test_budgets_hold_at_every_instant_under_concurrent_traffic() -> None:
    sizes = [50 + 37 * number % 350 for number in range(40)]
    payloads = [adapter(number, size) for number, size in enumerate(sizes)]
    keys = [content_hash(payload) for payload in payloads]
    engine = FakeTier("engine", capacity_bytes=1000, max_entries=3, readable=False)
    cpu = FakeTier("cpu", capacity_bytes=1500)
    ssd = FakeTier("ssd", capacity_bytes=4000, max_entries=20)
    cache = TieredCache([engine, cpu, ssd], FakeOrigin(payloads), expected_entries=64)
    weights = [1 / (rank + 1) for rank in range(len(keys))]
    wrong: list[str] = []

    def traffic(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            key = rng.choices(keys, weights)[0]
            try:
                with cache.acquire(key) as lease:
                    if engine.copies.get(lease.key) != payloads[keys.index(key)]:
                        wrong.append(key)
            except CacheFull:  # two large adapters in use leave no room for a third: a fair refusal
                pass
            if rng.random() < 0.1:
                cache.prefetch([rng.choice(keys)])

    threads = [threading.Thread(target=traffic, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert wrong == []
    assert engine.overflows == cpu.overflows == ssd.overflows == []
    stats = cache.stats()
    assert stats.leases == 0
    for tier in (engine, cpu, ssd):
        assert stats.tier(tier.name).resident_entries == len(tier.copies)
        assert stats.tier(tier.name).resident_bytes == tier.resident_bytes()
    assert stats.tier("engine").hits + stats.tier("engine").misses == 900


# ---- prefetch, adoption, statistics ----------------------------------------------------------


def test_prefetch_warms_the_lower_tiers_without_taking_engine_slots() -> None:
    cache, engine, cpu, ssd, origin = three_tiers()
    assert cache.prefetch([A, B]) == 2
    assert not engine.puts and set(cpu.copies) == set(ssd.copies) == {A, B}
    assert cache.prefetch([A]) == 0  # already warm

    assert cache.prefetch([C], into="ssd") == 1
    assert not cpu.contains(C) and ssd.contains(C)
    with cache.acquire(A) as lease:
        assert lease.source == "cpu"
    stats = cache.stats()
    assert (stats.prefetched, stats.tier("engine").misses, stats.tier("cpu").hits) == (5, 1, 1)
    with pytest.raises(InvalidRequest, match="below the engine"):
        cache.prefetch([D], into="engine")


def test_adopt_counts_copies_a_previous_process_left() -> None:
    cache, engine, cpu, ssd, origin = three_tiers(ssd_entries=2)
    for key, payload in zip(KEYS[:3], PAYLOADS[:3], strict=True):
        ssd.put(key, payload)
    assert [cache.adopt("ssd", key, 100) for key in KEYS[:3]] == [True, True, False]  # the budget is 2
    assert cache.adopt("ssd", A, 100)  # known already
    with cache.acquire(A) as lease:
        assert lease.source == "ssd"
    assert not origin.reads


def test_stats_count_hits_misses_promotions_evictions_and_latency() -> None:
    now = [0.0]
    engine = FakeTier("engine", max_entries=1, readable=False)
    cpu = FakeTier("cpu", capacity_bytes=200)
    cache = TieredCache(
        [engine, cpu],
        FakeOrigin(PAYLOADS, advance=now),
        clock=lambda: now[0],
    )
    touch(cache, A, A, B, A)  # origin, engine hit, origin (evicts A from the engine), CPU

    stats = cache.stats()
    assert [(t.name, t.hits, t.misses, t.promotions, t.evictions) for t in stats.tiers] == [
        ("engine", 1, 3, 3, 2),
        ("cpu", 1, 2, 2, 0),
        ("object_store", 2, 0, 0, 0),
    ]
    assert (stats.tier("engine").resident_entries, stats.tier("engine").resident_bytes) == (1, 100)
    assert (stats.tier("cpu").resident_entries, stats.tier("cpu").resident_bytes) == (2, 200)
    from_origin = stats.tier("object_store").promotion_latency
    assert (from_origin.count, from_origin.sum_s) == (2, 4.0)
    assert dict(from_origin.buckets)[1.0] == 0 and dict(from_origin.buckets)[5.0] == 2
    assert stats.tier("cpu").promotion_latency.count == 1


def test_metrics_expose_the_stats_to_prometheus() -> None:
    cache, *_ = three_tiers()
    registry = CollectorRegistry()
    register_metrics(cache, registry)
    touch(cache, A, A)

    text = generate_latest(registry).decode()
    assert 'mint_adapter_cache_hits_total{tier="engine"} 1.0' in text
    assert 'mint_adapter_cache_misses_total{tier="engine"} 1.0' in text
    assert 'mint_adapter_cache_resident_bytes{tier="cpu"} 100.0' in text
    assert 'mint_adapter_cache_promotion_seconds_count{source="object_store"} 1.0' in text
    assert "mint_adapter_cache_leases 0.0" in text


def test_the_tiers_are_checked_once_at_construction() -> None:
    origin = FakeOrigin([])
    cases = {
        "at least one tier": [],
        "unique": [FakeTier("cpu", max_entries=1), FakeTier("cpu", max_entries=1)],
        "needs a budget": [FakeTier("cpu")],
        "positive": [FakeTier("cpu", capacity_bytes=0)],
    }
    for message, tiers in cases.items():
        with pytest.raises(InvalidRequest, match=message):
            TieredCache(tiers, origin)

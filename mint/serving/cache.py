"""The adapter cache of a serving node: tiers of copies under one eviction policy, pure Python.

Tiers, fastest first: the engine's adapter slots (GPU) -> CPU RAM -> local SSD, each with a
budget (bytes and/or a number of entries), then the origin: the object store, which always
has every adapter version, is never evicted and is never written here. `TieredCache.acquire`
makes an adapter servable by promoting it into the first tier from the nearest tier that has
a copy, and returns a `Lease`; the tiers themselves are small protocols (`Tier`, `Origin`)
implemented in `mint.serving.tiers` and, for the policy's tests and benchmark, in memory.
This module does no I/O of its own: it decides, and calls the tiers.

Keys are adapter-version content hashes (sha256, 64 lowercase hex digits). A new version is a
new key, so it can never be served from an entry cached for an older one. With
`check_origin`, the cache checks what the origin hands it against the key itself, on a helper
thread while the first tier takes the copy in (the engine decoding and loading it): a version's
handoff to serving waits for the longer of the two, not their sum. Bytes whose hash differs are
never leased and reach no lower tier: the first tier's copy is removed and the promotion fails
with Conflict.

Placement. A promotion writes the adapter into every tier between its source and the engine
(downloaded once, it also lands on the SSD and in RAM), so the lower tiers usually already
hold what the engine holds. When a tier evicts a copy and no lower tier holds one, the copy
is demoted: it moves to the nearest lower tier that can make room, read from the evicted tier
if that tier can hand it back, else from a lower copy. The engine cannot hand back what it
loaded (`Tier.readable` is False), and a demotion never downloads, so an engine copy with no
copy below it is simply dropped: the origin still has it.

Eviction policy: W-TinyLFU (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache
Admission Policy", 2017; the policy of Caffeine), weighted by bytes, in every tier. Requests
for adapters follow a heavy-tailed (Zipf-like) popularity, and on such workloads recency alone
is a poor predictor: plain LRU lets one burst of cold adapters push out the popular ones.
W-TinyLFU keeps a compact frequency history of every key asked for, including keys no longer
cached, in a count-min sketch that halves itself periodically (so popularity can change). A
new entry goes into a small LRU window (1% of the tier); when the window overflows and the
tier is full, its oldest entry must beat the main area's eviction victim on estimated
frequency to stay, else it is the one evicted. The main area is a segmented LRU (probation,
then protected after a second hit), so among equally frequent entries the least recent goes.
The small window keeps the policy good on bursts of new adapters (a new version) and the
frequency duel makes it close to LFU on stationary Zipf traffic; `bench/cache_policy.py`
measures it against LRU and Belady's offline optimum. A request counts as a hit on every
copy of the adapter, not only the one that served it: lower copies back up the upper ones,
and a popular adapter that the engine serves all day must not look cold to the SSD. Every
operation is O(1) (amortized for the sketch's halving): a hit moves the entry within each
tier that holds it. `window_fraction=1.0` turns the policy into plain LRU, which the
benchmark uses as its anchor.

In-use and pinned entries are never evicted: a leased adapter keeps its engine copy (the
engine serves from that copy; lower copies stay evictable), a pinned one keeps every copy.
Such entries leave the policy's lists while held, so eviction never scans past them. When
the engine cannot make room because leases and pins hold it, a promotion raises `CacheFull`
rather than over-committing; room that other promotions hold only while they move is waited
for. Lower tiers that cannot make room simply do not take the copy.

An operator can also evict an adapter version outright (`TieredCache.evict`), from one tier or
from all: its copies are deleted, not demoted, since the operator asked for them to go. It
refuses a pinned adapter, and an adapter in use when its engine copy would go, rather than wait.

Concurrency. One lock guards the bookkeeping and is held only for O(1) work, never across I/O.
Every read or write of a key's copies happens under a per-key flight: one thread (the
leader) moves the key while others wait for it, so however many requests ask for the same
adapter, exactly one fetch happens, and followers of a promotion receive their leases from
the leader. Victims get a flight of their own while they are deleted or demoted, so a key is
never added and removed concurrently. Budgets are reserved when a move is planned, and the
space a victim frees counts only for the promotion that evicted it until the victim is
physically gone, so the bytes and entries a tier physically holds never exceed its budget,
even for an instant. The API is synchronous and thread-safe; an asyncio server calls it
through `asyncio.to_thread`.

Each tier's W-TinyLFU bookkeeping (the frequency sketch, the segments, the choice of a victim)
is in `mint.serving.wtinylfu`; what the cache counts (per tier: hits, misses, promotions,
demotions, evictions, promotion latency) and its Prometheus metrics in `mint.serving.cache_stats`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol

from mint.errors import Conflict, InvalidRequest, NotFound, ServiceUnavailable
from mint.serving.cache_stats import CacheStats, TierCounters, TierStats
from mint.serving.content_keys import checked_content, validate_content_hash
from mint.serving.wtinylfu import (
    WINDOW,
    WINDOW_FRACTION,
    Entry,
    FrequencySketch,
    Tier,
    TierState,
)

log = logging.getLogger(__name__)


class CacheFull(ServiceUnavailable):
    """A tier cannot make room: every entry in it is in use or pinned. Retry later, or unpin."""


class Origin(Protocol):
    """Where every adapter version lives (the object store): read-only here, never evicted.

    `get` raises NotFound for a key that names no adapter version.
    """

    name: str

    def get(self, key: str) -> bytes: ...


# ---- bookkeeping -----------------------------------------------------------------------------


class _Flight:
    """A move of one key in progress; others wait on `done`. A promotion grants leases to its waiters."""

    __slots__ = ("done", "error", "grants_leases", "waiters", "source")

    def __init__(self, *, grants_leases: bool) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.grants_leases = grants_leases
        self.waiters = 0
        self.source = ""  # the name of the tier the copy came from, once landed


@dataclass
class _Eviction:
    """A copy leaving `tier`, and where it is demoted to (`room` makes space there first)."""

    entry: Entry
    tier: int
    demote_to: int | None = None
    read_from: int | None = None
    room: list[_Eviction] = field(default_factory=list)
    demoted: bool = False
    source_lost: bool = False  # the copy to demote from was gone when read


@dataclass
class _Fill:
    """A copy of the moving key to write into `tier`, once `room` is made."""

    tier: int
    room: list[_Eviction]
    error: BaseException | None = None


class _OriginCheck:
    """`checked_content` of an origin payload on a helper thread (hashlib lets go of the GIL);
    `result()` waits for it: None when the payload is its version, else the Conflict to fail with."""

    def __init__(self, key: str, payload: bytes, origin: str) -> None:
        self._error: Conflict | None = None
        self._thread = threading.Thread(target=self._check, args=(key, payload, origin), name="origin-check")
        self._thread.start()

    def _check(self, key: str, payload: bytes, origin: str) -> None:
        try:
            checked_content(key, payload, f"the {origin}")
        except Conflict as error:
            self._error = error

    def result(self) -> Conflict | None:
        self._thread.join()
        return self._error


# ---- the cache -------------------------------------------------------------------------------


class Lease:
    """The right to serve one adapter version from the engine until released.

    `key` is the id the engine knows the adapter by; `source` names the tier its copy came
    from ("engine" on a hit). A context manager; `release()` twice is harmless.
    """

    __slots__ = ("key", "size_bytes", "source", "_cache", "_released")

    def __init__(self, cache: TieredCache, key: str, size_bytes: int, source: str) -> None:
        self.key = key
        self.size_bytes = size_bytes
        self.source = source
        self._cache = cache
        self._released = False

    def release(self) -> None:
        self._cache.release(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Lease(key={self.key[:12]}..., source={self.source!r}, released={self._released})"


class TieredCache:
    """Adapter copies across `tiers` (fastest first; the first is the engine) above `origin`.

    `expected_entries` is about how many adapters the tiers hold together; it sizes the
    frequency sketch (16 bytes per entry, rounded up to a power of two) and how many requests
    its history spans. `window_fraction` is W-TinyLFU's window share of each tier; 1.0 makes
    the policy plain LRU. `check_origin` checks the origin's payloads against their keys
    (sha256) while the first tier takes them in. `clock` times promotions, in seconds.
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        origin: Origin,
        *,
        expected_entries: int = 10_000,
        window_fraction: float = WINDOW_FRACTION,
        check_origin: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        _check_tiers(tiers, origin)
        if not 0.0 < window_fraction <= 1.0:
            raise InvalidRequest(f"window_fraction must be in (0, 1], not {window_fraction}", param="window_fraction")
        self._tiers = list(tiers)
        self._origin = origin
        self._states = [TierState(tier, index, window_fraction) for index, tier in enumerate(tiers)]
        self._origin_index = len(tiers)
        self._origin_counters = TierCounters()
        self._check_origin = check_origin
        self._sketch = FrequencySketch(expected_entries)
        self._clock = clock
        self._lock = threading.Lock()
        self._landed = threading.Condition(self._lock)  # notified whenever a flight lands
        self._entries: dict[str, Entry] = {}
        self._flights: dict[str, _Flight] = {}
        self._leases = 0
        self._pinned = 0
        self._prefetched = 0

    @property
    def tier_names(self) -> list[str]:
        """The tiers' names, fastest first, the origin last."""
        return [tier.name for tier in self._tiers] + [self._origin.name]

    # -- public API

    def acquire(self, key: str) -> Lease:
        """Make the adapter version `key` servable by the engine and hold it there until released.

        Blocks while the adapter is fetched (once, however many callers wait for it) and while
        other promotions hold the room it needs. Raises InvalidRequest for a key that is not a
        content hash, NotFound when the origin has no such version, CacheFull when leases and
        pins hold all of the engine's room.
        """
        return self._promote(key, request=True)

    def release(self, lease: Lease) -> None:
        """Give back a lease; the adapter becomes evictable from the engine when none is left."""
        with self._lock:
            if lease._released:
                return
            lease._released = True
            entry = self._entries[lease.key]
            entry.leases -= 1
            self._leases -= 1
            if entry.leases == 0:
                self._sync_tier(entry, self._states[0])  # leases hold the engine's copy only

    def pin(self, key: str) -> None:
        """Load the adapter into the engine and keep all its copies until `unpin` (pins count up)."""
        lease = self._promote(key, request=False)
        with self._lock:
            entry = self._entries[key]
            entry.pins += 1
            if entry.pins == 1:
                self._pinned += 1
                self._sync(entry)
        lease.release()

    def unpin(self, key: str) -> None:
        """Undo one `pin`; raises InvalidRequest if the adapter is not pinned."""
        with self._lock:
            entry = self._entries.get(validate_content_hash(key))
            if entry is None or entry.pins == 0:
                raise InvalidRequest(f"adapter {key[:12]}... is not pinned", param="key")
            entry.pins -= 1
            if entry.pins == 0:
                self._pinned -= 1
                self._sync(entry)

    def evict(self, key: str, *, tier: str | None = None) -> list[str]:
        """Remove the adapter version's copies from the tier named `tier`, or from every tier.

        An operator's eviction: the copies go, none is demoted, and the origin keeps its own.
        Returns the names of the tiers a copy was removed from, fastest first ([] when none
        held one). Waits for a move of the key in progress, then holds the key's flight while
        deleting. Raises Conflict for a pinned adapter, and for one in use when its engine copy
        would go; InvalidRequest for a key that is not a content hash or an unknown tier. A
        tier that fails to delete its copy keeps it, counted, and its error is raised once the
        other copies are gone.
        """
        validate_content_hash(key)
        targets = range(len(self._states)) if tier is None else (self._state_named(tier).index,)
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is None:
                    return []
                flight = self._flights.get(key)
                if flight is None:
                    evicted = self._plan_evict(entry, targets)
                    if not evicted:
                        return []
                    entry, flight = self._take_off(key, grants_leases=False)
                    segments = [state.segment(entry) for state in evicted]
                    for state in evicted:
                        state.unplace(entry)  # its space stays reserved until the copy is deleted
                    break
            flight.done.wait()  # a promotion, prefetch or eviction of this key: look again once it is done
        errors: list[Exception | None] = []
        for state in evicted:
            try:
                state.tier.delete(key)
                errors.append(None)
            except Exception as error:
                log.warning("adapter cache: evicting %s from %s failed: %s", key, state.tier.name, error)
                errors.append(error)
        with self._lock:
            for state, segment, error in zip(evicted, segments, errors, strict=True):
                if error is None:
                    state.release(entry.size_bytes)
                    state.counters.evictions += 1
                else:
                    state.place(entry, segment)  # still there: `_land` lists it again
            self._land(entry, flight, None)
        failed = next((error for error in errors if error is not None), None)
        if failed is not None:
            raise failed
        return [state.tier.name for state in evicted]

    def prefetch(self, keys: Iterable[str], *, into: str | None = None) -> int:
        """Warm the tier named `into` (default: the first below the engine) and those below it.

        Takes no engine slot and counts no request. Keys already there or faster, or being
        moved, are skipped. Returns how many copies were written into the `into` tier; raises
        NotFound at the first version the origin does not have.
        """
        target = self._prefetch_target(into)
        checked = [validate_content_hash(key) for key in keys]
        return sum(self._warm(key, target) for key in checked)

    def adopt(self, tier: str, key: str, size_bytes: int) -> bool:
        """Count a copy the tier already holds (e.g. files left on the SSD by a previous process).

        Adopted only if it fits without evicting anything and is not tracked there yet; returns
        whether it was. The caller deletes copies that were not adopted.
        """
        validate_content_hash(key)
        with self._lock:
            state = self._state_named(tier)
            entry = self._entries.get(key)
            if entry is not None and state.holds(entry):
                return entry.size_bytes == size_bytes
            if (entry is not None and (entry.flying or entry.size_bytes != size_bytes)) or not state.fits(size_bytes):
                return False
            if entry is None:
                entry = self._entries[key] = Entry(key, size_bytes)
            state.reserve(size_bytes)
            state.place(entry, WINDOW)
            self._sync(entry)
            state.settle()
            return True

    def stats(self) -> CacheStats:
        """A snapshot of every tier's counters and residency."""
        with self._lock:
            origin = self._origin_counters
            return CacheStats(
                tiers=(
                    *(state.snapshot() for state in self._states),
                    TierStats(
                        name=self._origin.name,
                        hits=origin.hits,
                        misses=origin.misses,
                        promotions=0,
                        demotions=0,
                        evictions=0,
                        resident_entries=None,
                        resident_bytes=None,
                        capacity_bytes=None,
                        max_entries=None,
                        promotion_latency=origin.latency.snapshot(),
                    ),
                ),
                leases=self._leases,
                pinned=self._pinned,
                prefetched=self._prefetched,
            )

    # -- promotion

    def _promote(self, key: str, *, request: bool) -> Lease:
        """Lease `key` in the engine: a hit, a wait on another thread's promotion, or a promotion."""
        engine = self._states[0]
        first_look = True
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is None:
                    validate_content_hash(key)  # tracked keys were checked when first seen
                elif engine.holds(entry):
                    self._grant(entry, 1)  # before `touch`, which then only changes its segment
                    if request and first_look:
                        self._sketch.increment(key)
                        engine.counters.hits += 1
                        self._touch(entry)
                    return Lease(self, key, entry.size_bytes, source=engine.tier.name)
                if first_look:
                    started = self._clock()
                    if request:
                        self._sketch.increment(key)
                        engine.counters.misses += 1
                    first_look = False
                flight = self._flights.get(key)
                if flight is None:
                    entry, flight = self._take_off(key)
                    break
                if flight.grants_leases:
                    flight.waiters += 1
            flight.done.wait()
            if flight.grants_leases:  # the leader granted our lease, or failed for us all
                if flight.error is not None:
                    raise flight.error
                return Lease(self, key, self._entries[key].size_bytes, source=flight.source)
            # An eviction or a prefetch of this key has finished: look again.
        return self._lead_promotion(entry, flight, request=request, started=started)

    def _lead_promotion(self, entry: Entry, flight: _Flight, *, request: bool, started: float) -> Lease:
        """Move `entry` into the engine for this thread and the flight's waiters."""
        source, fills, refused = self._move_up(entry, flight, target=0)
        with self._lock:
            failed = refused or fills[0].error  # the first fill is the engine's (`_move_up` raised if it could not be)
            self._commit_fills(entry, fills)
            counters = self._counters(source)
            if request:
                for state in self._states[1:source]:
                    state.counters.misses += 1
                counters.hits += 1
                self._touch(entry)
            if failed is None:
                counters.latency.observe(self._clock() - started)
                self._grant(entry, 1 + flight.waiters)
            flight.source = self.tier_names[source]
            self._land(entry, flight, failed)
        if failed is not None:
            raise failed
        return Lease(self, entry.key, entry.size_bytes, source=flight.source)

    def _warm(self, key: str, target: int) -> bool:
        """Prefetch one key into `target` and the tiers between it and its nearest copy."""
        with self._lock:
            entry = self._entries.get(key)
            if key in self._flights or (entry is not None and any(s.holds(entry) for s in self._states[: target + 1])):
                return False
            entry, flight = self._take_off(key, grants_leases=False)
        _, fills, refused = self._move_up(entry, flight, target=target)
        with self._lock:
            warmed = any(fill.tier == target and fill.error is None for fill in fills)
            self._commit_fills(entry, fills)
            self._prefetched += sum(fill.error is None for fill in fills)
            self._land(entry, flight, refused)
        if refused is not None:
            raise refused
        return warmed

    def _take_off(self, key: str, *, grants_leases: bool = True) -> tuple[Entry, _Flight]:
        """Start a flight for `key` (under the lock): its copies are held until it lands."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = Entry(key, 0)
        flight = self._flights[key] = _Flight(grants_leases=grants_leases)
        entry.flying = True
        self._sync(entry)
        return entry, flight

    def _land(self, entry: Entry, flight: _Flight, error: BaseException | None) -> None:
        """End the flight (under the lock), waking its waiters."""
        entry.flying = False
        self._sync(entry)
        for state in self._states:
            state.settle()
        del self._flights[entry.key]
        flight.error = error
        flight.done.set()
        self._landed.notify_all()
        self._forget_if_idle(entry)

    def _move_up(self, entry: Entry, flight: _Flight, *, target: int) -> tuple[int, list[_Fill], Conflict | None]:
        """Read the nearest copy below `target` and write it into `target` and every tier down to it.

        The first fill is `target` itself when it can make room; for the engine it must, or
        CacheFull ends the flight. Returns the source's index, the fills, to commit, and the
        Conflict that refused an origin payload whose hash is not its key (every fill failed).
        """
        check: _OriginCheck | None = None
        try:
            payload, source = self._read_nearest(entry, below=target)
            if source == self._origin_index and self._check_origin:
                check = _OriginCheck(entry.key, payload, self._origin.name)
            with self._lock:
                fills = self._plan_fills(entry, range(target, source), required=target == 0)
                while fills is None:  # the engine's room is only taken by moves in flight: wait for them
                    self._landed.wait()
                    fills = self._plan_fills(entry, range(target, source), required=target == 0)
        except BaseException as error:
            if check is not None:
                check.result()  # joined: the helper thread ends with the flight
            with self._lock:
                self._land(entry, flight, error)
            raise
        refused: Conflict | None = None
        for fill in fills:
            self._run_evictions(fill.room)  # planned and reserved: run even for a refused payload
            if refused is not None:
                fill.error = refused
                continue
            try:
                self._tiers[fill.tier].put(entry.key, payload)
            except Exception as error:  # the tier failed; the cache stays consistent without the copy
                log.warning(
                    "adapter cache: writing %s into %s failed: %s", entry.key, self.tier_names[fill.tier], error
                )
                fill.error = error
            if check is not None:  # after the first fill: lower tiers take checked bytes only
                refused, check = check.result(), None
                if refused is not None:
                    self._remove_refused(entry.key, fill, refused)
        if check is not None:  # no fill at all
            refused = check.result()
        return source, fills, refused

    def _remove_refused(self, key: str, fill: _Fill, refused: Conflict) -> None:
        """Take out the copy a fill wrote of a payload the origin check refused; the fill fails."""
        log.warning("adapter cache: %s", refused)
        if fill.error is None:
            try:
                self._tiers[fill.tier].delete(key)
            except Exception as error:  # noqa: BLE001 - the copy is not committed; an orphan holds no lease
                log.warning("adapter cache: removing %s from %s failed: %s", key, self.tier_names[fill.tier], error)
        fill.error = refused

    def _read_nearest(self, entry: Entry, *, below: int) -> tuple[bytes, int]:
        """The payload from the nearest readable copy below tier `below`, else from the origin.

        A copy that turns out missing (deleted behind the cache's back, or corrupt) is
        forgotten and the next one tried.
        """
        while True:
            with self._lock:
                source = self._nearest_copy(entry, below=below)
            reader = self._tiers[source] if source < self._origin_index else self._origin
            try:
                payload = reader.get(entry.key)
            except NotFound:
                if source == self._origin_index:
                    raise
                with self._lock:
                    self._forget_copy(entry, source)
                continue
            with self._lock:
                if entry.segments and len(payload) != entry.size_bytes:
                    raise Conflict(
                        f"{reader.name} returned {len(payload)} bytes for {entry.key}, not {entry.size_bytes}: "
                        "cache keys must be content hashes of the payload"
                    )
                entry.size_bytes = len(payload)
            return payload, source

    def _forget_copy(self, entry: Entry, index: int) -> None:
        """Forget a copy that is gone behind the cache's back (deleted, or removed as damaged)."""
        state = self._states[index]
        if state.holds(entry):
            log.warning("adapter cache: the %s tier lost its copy of %s", state.tier.name, entry.key)
            state.unplace(entry)
            state.release(entry.size_bytes)

    def _nearest_copy(self, entry: Entry, *, below: int) -> int:
        for state in self._states[below + 1 :]:
            if state.holds(entry) and state.tier.readable:
                return state.index
        return self._origin_index

    def _plan_fills(self, entry: Entry, tiers: range, *, required: bool) -> list[_Fill] | None:
        """Reserve room for `entry` in each of `tiers` that can make it; the first must if `required`.

        When the first cannot yet but will once the moves in flight are done, reserves nothing
        and returns None; when only releases or unpins would make room, raises CacheFull.
        """
        fills = []
        for index in tiers:
            if self._states[index].holds(entry):  # an unreadable tier's copy, already there
                continue
            room = self._make_room(index, entry)
            if room is not None:
                fills.append(_Fill(index, room))
            elif required and index == tiers.start:
                if self._states[index].could_fit_later(entry.size_bytes):
                    return None
                raise self._full(index, entry)
        return fills

    def _full(self, index: int, entry: Entry) -> CacheFull:
        state = self._states[index]
        budget = " and ".join(
            part
            for part in (
                f"{state.max_entries} entries" if state.max_entries is not None else "",
                f"{state.capacity_bytes} bytes" if state.capacity_bytes is not None else "",
            )
            if part
        )
        return CacheFull(
            f"the {state.tier.name} tier has no room for adapter {entry.key} ({entry.size_bytes} bytes): "
            f"its budget of {budget} is taken by adapters in use or pinned; retry when requests finish, "
            "unpin adapters, or give the tier a larger budget"
        )

    def _make_room(self, index: int, entry: Entry) -> list[_Eviction] | None:
        """Choose victims so that `entry` fits in tier `index`, and reserve its space (under the lock).

        Returns the evictions to run, or None when the tier cannot take the copy (it is too
        large, or everything there is held). Victims are held by flights until they are gone.
        """
        state = self._states[index]
        size = entry.size_bytes
        if not state.could_fit(size):
            return None
        victims = []
        freed_bytes = freed_entries = 0
        while not state.fits(size, freed_bytes, freed_entries):
            victim = state.next_victim(size, self._sketch)
            state.unplace(victim)
            victim.flying = True
            self._sync(victim)
            self._flights[victim.key] = _Flight(grants_leases=False)
            freed_bytes += victim.size_bytes
            freed_entries += 1
            victims.append(victim)
        state.reserve(size)
        # Demotions are planned only now: making room below holds more entries, and some of
        # them may have copies here that the loop above was counting on.
        return [self._plan_demotion(victim, index) for victim in victims]

    def _plan_demotion(self, victim: Entry, index: int) -> _Eviction:
        """Where the copy evicted from tier `index` goes: the nearest lower tier that takes it,
        unless a lower tier already holds one or there is nothing to read it from."""
        eviction = _Eviction(victim, index)
        for lower in range(index + 1, len(self._states)):
            if self._states[lower].holds(victim):
                break
            source = index if self._tiers[index].readable else self._nearest_copy(victim, below=lower)
            if source == self._origin_index:
                break  # a demotion never downloads
            room = self._make_room(lower, victim)
            if room is not None:
                eviction.demote_to, eviction.read_from, eviction.room = lower, source, room
                break
        return eviction

    def _run_evictions(self, evictions: list[_Eviction]) -> None:
        """Do the I/O of evictions (outside the lock): room below first, then demote, then delete."""
        for eviction in evictions:
            key = eviction.entry.key
            if eviction.demote_to is not None and eviction.read_from is not None:
                self._run_evictions(eviction.room)
                try:
                    payload = self._tiers[eviction.read_from].get(key)
                    self._tiers[eviction.demote_to].put(key, payload)
                    eviction.demoted = True
                except NotFound:
                    eviction.source_lost = True
                except Exception as error:
                    log.warning("adapter cache: demoting %s failed: %s", key, error)
            try:
                self._tiers[eviction.tier].delete(key)
            except Exception as error:
                log.warning("adapter cache: deleting %s from %s failed: %s", key, self.tier_names[eviction.tier], error)

    def _commit_evictions(self, evictions: list[_Eviction]) -> None:
        """Record evictions once their I/O is done (under the lock), and land the victims' flights."""
        for eviction in evictions:
            entry, state = eviction.entry, self._states[eviction.tier]
            state.release(entry.size_bytes)
            state.counters.evictions += 1
            if eviction.demote_to is not None:
                self._commit_evictions(eviction.room)
                lower = self._states[eviction.demote_to]
                if eviction.demoted:
                    lower.place(entry, WINDOW)
                    lower.counters.demotions += 1
                else:
                    lower.release(entry.size_bytes)
                if eviction.source_lost and eviction.read_from is not None:
                    self._forget_copy(entry, eviction.read_from)
            self._land(entry, self._flights[entry.key], None)

    def _commit_fills(self, entry: Entry, fills: list[_Fill]) -> None:
        for fill in fills:
            self._commit_evictions(fill.room)
            state = self._states[fill.tier]
            if fill.error is None:
                state.place(entry, WINDOW)
                state.counters.promotions += 1
            else:
                state.release(entry.size_bytes)

    # -- eviction by an operator

    def _plan_evict(self, entry: Entry, targets: Iterable[int]) -> list[TierState]:
        """The tiers among `targets` whose copy of `entry` an `evict` removes (under the lock, no flight)."""
        if entry.pins:
            raise Conflict(f"adapter {entry.key} is pinned, which keeps every copy of it: unpin it first", param="key")
        evicted = [self._states[index] for index in targets if self._states[index].holds(entry)]
        if entry.leases and self._states[0] in evicted:
            raise Conflict(
                f"adapter {entry.key} is in use by {entry.leases} request(s) served from its engine copy: "
                "retry the eviction after those requests finish",
                param="key",
            )
        return evicted

    # -- holds

    def _grant(self, entry: Entry, count: int) -> None:
        """Add `count` leases on the entry (under the lock); its engine copy is held from now."""
        entry.leases += count
        self._leases += count
        if entry.leases == count and self._states[0].holds(entry):
            self._sync_tier(entry, self._states[0])

    def _sync(self, entry: Entry) -> None:
        """List each copy of the entry for eviction unless it is held (moving, pinned, or leased in the engine)."""
        for state in self._states:
            if state.holds(entry):
                self._sync_tier(entry, state)

    def _sync_tier(self, entry: Entry, state: TierState) -> None:
        """`_sync` for the entry's copy in one tier (which holds one)."""
        durable = entry.pins > 0 or (state.index == 0 and entry.leases > 0)
        if durable != bool(entry.durable & state.bit):
            state.set_durable(entry, durable)
        held = durable or entry.flying
        listed = bool(entry.listed & state.bit)
        if listed and held:
            state.unlink(entry)
        elif not listed and not held:
            state.link(entry)

    def _touch(self, entry: Entry) -> None:
        """A request counts as a hit on every copy of the entry (see the module's docstring)."""
        for state in self._states:
            if state.holds(entry):
                state.touch(entry)

    def _forget_if_idle(self, entry: Entry) -> None:
        if not (entry.segments or entry.flying or entry.leases or entry.pins):
            self._entries.pop(entry.key, None)

    # -- lookups

    def _counters(self, index: int) -> TierCounters:
        return self._states[index].counters if index < self._origin_index else self._origin_counters

    def _state_named(self, name: str) -> TierState:
        for state in self._states:
            if state.tier.name == name:
                return state
        raise InvalidRequest(f"no cache tier named {name!r}; the tiers are {self.tier_names[:-1]}", param="tier")

    def _prefetch_target(self, into: str | None) -> int:
        if into is None:
            if len(self._states) < 2:
                raise InvalidRequest("prefetch needs a tier below the engine; this cache has none", param="into")
            return 1
        index = self._state_named(into).index
        if index == 0:
            raise InvalidRequest("prefetch warms the tiers below the engine; acquire or pin to load it", param="into")
        return index


def _check_tiers(tiers: Sequence[Tier], origin: Origin) -> None:
    if not tiers:
        raise InvalidRequest("an adapter cache needs at least one tier (the engine) above the origin", param="tiers")
    names = [tier.name for tier in tiers] + [origin.name]
    if len(set(names)) != len(names):
        raise InvalidRequest(f"cache tier names must be unique, not {names}", param="tiers")
    for tier in tiers:
        if tier.capacity_bytes is None and tier.max_entries is None:
            raise InvalidRequest(f"tier {tier.name!r} needs a budget: capacity_bytes, max_entries or both")
        for budget in (tier.capacity_bytes, tier.max_entries):
            if budget is not None and budget < 1:
                raise InvalidRequest(f"tier {tier.name!r} has a budget of {budget}; budgets must be positive")

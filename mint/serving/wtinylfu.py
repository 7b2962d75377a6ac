"""W-TinyLFU, tier by tier: the frequency sketch and each tier's segmented eviction lists.

`TieredCache` (`mint.serving.cache`) decides what moves between tiers; this module keeps the
bookkeeping its decisions read, all O(1) and guarded by the cache's lock:

- `FrequencySketch`: a count-min sketch of how often each key was asked for (cached or not),
  halved periodically so that popularity can change (TinyLFU's history).
- `Entry`: one adapter version the cache tracks: the segment of its copy in each tier, its
  leases and pins, whether a flight moves it.
- `TierState`: one tier's budget and its three LRU segments (a small window for new entries,
  then probation and protected, the segmented LRU of the main area), and `next_victim`, the
  frequency duel between the window's oldest entry and the main area's victim.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from mint.serving.cache_stats import TierCounters, TierStats

WINDOW_FRACTION = 0.01  # of each tier, for new entries (W-TinyLFU's default)
PROTECTED_FRACTION = 0.8  # of each tier's main area, for entries hit at least twice


# ---- frequency -------------------------------------------------------------------------------

_HALVED = bytes(value >> 1 for value in range(256))


class Tier(Protocol):
    """One bounded tier of copies. The cache decides what enters and leaves; the tier stores.

    `capacity_bytes` and `max_entries` are the budget (at least one is set). `get` returns a
    copy or raises NotFound; `put` stores one (replacing any); `delete` is idempotent.
    `readable` is False for a tier that cannot hand back what it holds (an engine).
    """

    name: str
    capacity_bytes: int | None
    max_entries: int | None
    readable: bool

    def get(self, key: str) -> bytes: ...
    def put(self, key: str, payload: bytes) -> None: ...
    def delete(self, key: str) -> None: ...
    def contains(self, key: str) -> bool: ...


class FrequencySketch:
    """How often each key was requested lately, in 16 bytes per cached entry.

    A count-min sketch: 4 rows of saturating counters (at most 15), each key counted in one
    counter per row chosen by double hashing; the estimate is the smallest of its 4 counters,
    so collisions can only overestimate, and the conservative update (only the smallest
    counters grow) keeps that small. Each row has 4 counters per cached entry (as Caffeine's
    sketch): with a catalogue far larger than the cache, most keys are asked for once, and a
    narrower row lets their collisions drown the counts that matter. After 10 increments per
    cached entry every counter is halved, so the history fades and a key that stops being
    asked for loses its standing.
    """

    DEPTH = 4
    MAX_COUNT = 15
    COUNTERS_PER_ENTRY = 4  # per row

    def __init__(self, expected_entries: int) -> None:
        expected_entries = max(expected_entries, 1)
        self.width = 1 << max(4, (self.COUNTERS_PER_ENTRY * expected_entries - 1).bit_length())
        self.sample_size = 10 * expected_entries
        self._mask = self.width - 1
        self._table = bytearray(self.DEPTH * self.width)
        self._additions = 0

    def _counters(self, key: str) -> tuple[int, int, int, int]:
        """The key's counter in each row (double hashing; the rows are unrolled: this is the hot path)."""
        mask, width = self._mask, self.width
        hashed = hash(key)  # str hashes are cached on the object: no work after the first call
        low, step = hashed & 0xFFFFFFFF, ((hashed >> 32) & 0xFFFFFFFF) | 1
        return (
            low & mask,
            width + ((low + step) & mask),
            2 * width + ((low + 2 * step) & mask),
            3 * width + ((low + 3 * step) & mask),
        )

    def increment(self, key: str) -> None:
        table = self._table
        first, second, third, fourth = self._counters(key)
        smallest = min(table[first], table[second], table[third], table[fourth])
        if smallest >= self.MAX_COUNT:
            return
        for index in (first, second, third, fourth):
            if table[index] == smallest:
                table[index] += 1
        self._additions += 1
        if self._additions >= self.sample_size:
            self._table = self._table.translate(_HALVED)  # halve every counter, at C speed
            self._additions //= 2

    def estimate(self, key: str) -> int:
        table = self._table
        first, second, third, fourth = self._counters(key)
        return min(table[first], table[second], table[third], table[fourth])


# ---- bookkeeping -----------------------------------------------------------------------------

# Where a copy sits in its tier: 2 bits per tier in `Entry.segments` (tier i at bits 2i, 2i+1).
ABSENT, WINDOW, PROBATION, PROTECTED = 0, 1, 2, 3


class Entry:
    """One adapter version the cache tracks: its copies, holds and whether it is moving.

    `segments` packs the segment of its copy in each tier (0 = no copy); `listed` has bit i
    set while its copy in tier i is in that tier's eviction lists (not held), `durable`
    while that copy is held by a lease or a pin. `flying` is True while a flight moves its
    copies; it holds all of them for that while.
    """

    __slots__ = ("key", "size_bytes", "segments", "listed", "durable", "leases", "pins", "flying")

    def __init__(self, key: str, size_bytes: int) -> None:
        self.key = key
        self.size_bytes = size_bytes
        self.segments = 0
        self.listed = 0
        self.durable = 0
        self.leases = 0
        self.pins = 0
        self.flying = False


class TierState:
    """The policy's view of one tier: its W-TinyLFU segments, budget accounting and counters.

    Accounting has two parts. The segment sizes count the copies placed in each segment
    (held or not): they shape the policy. `used_*` counts what the tier may physically hold:
    placed copies, copies being written, and victims not yet deleted; it never exceeds the
    budget except by victims whose space their own promotion is about to reuse.
    """

    def __init__(self, tier: Tier, index: int, window_fraction: float) -> None:
        self.tier = tier
        self.index = index
        self.bit = 1 << index
        self.shift = 2 * index
        self.capacity_bytes = tier.capacity_bytes
        self.max_entries = tier.max_entries
        cap, most = tier.capacity_bytes, tier.max_entries
        self.window_bytes_max = None if cap is None else cap * window_fraction
        self.window_entries_max = None if most is None else max(1, int(most * window_fraction))
        self.protected_bytes_max = None if cap is None else PROTECTED_FRACTION * (cap - cap * window_fraction)
        self.protected_entries_max = (
            None if most is None else int(PROTECTED_FRACTION * (most - (self.window_entries_max or 0)))
        )
        self.lists: tuple[OrderedDict[str, Entry], ...] = (OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict())
        self.segment_bytes = [0, 0, 0, 0]
        self.segment_entries = [0, 0, 0, 0]
        self.used_bytes = 0
        self.used_entries = 0
        self.evictable_bytes = 0
        self.evictable_entries = 0
        self.durable_bytes = 0  # placed copies held by leases or pins
        self.durable_entries = 0
        self.counters = TierCounters()

    # -- placement

    def segment(self, entry: Entry) -> int:
        return (entry.segments >> self.shift) & 3

    def holds(self, entry: Entry) -> bool:
        return (entry.segments >> self.shift) & 3 != ABSENT

    def place(self, entry: Entry, segment: int) -> None:
        """Record a copy in `segment` (not listed: `TieredCache._sync` lists it unless it is held)."""
        entry.segments = (entry.segments & ~(3 << self.shift)) | (segment << self.shift)
        self.segment_bytes[segment] += entry.size_bytes
        self.segment_entries[segment] += 1

    def unplace(self, entry: Entry) -> None:
        """Forget the copy (its space stays in `used_*` until released)."""
        segment = self.segment(entry)
        if entry.listed & self.bit:
            self.unlink(entry)
        if entry.durable & self.bit:
            self.set_durable(entry, False)
        entry.segments &= ~(3 << self.shift)
        self.segment_bytes[segment] -= entry.size_bytes
        self.segment_entries[segment] -= 1

    def link(self, entry: Entry) -> None:
        self.lists[self.segment(entry)][entry.key] = entry  # at the most recent end
        entry.listed |= self.bit
        self.evictable_bytes += entry.size_bytes
        self.evictable_entries += 1

    def set_durable(self, entry: Entry, durable: bool) -> None:
        """Count the copy as held by a lease or a pin (or no longer)."""
        sign = 1 if durable else -1
        entry.durable ^= self.bit
        self.durable_bytes += sign * entry.size_bytes
        self.durable_entries += sign

    def unlink(self, entry: Entry) -> None:
        del self.lists[self.segment(entry)][entry.key]
        entry.listed &= ~self.bit
        self.evictable_bytes -= entry.size_bytes
        self.evictable_entries -= 1

    def move(self, entry: Entry, segment: int) -> None:
        """Move the copy to another segment, at its most recent end if listed."""
        listed = bool(entry.listed & self.bit)
        if listed:
            self.unlink(entry)
        old = self.segment(entry)
        self.segment_bytes[old] -= entry.size_bytes
        self.segment_entries[old] -= 1
        self.place(entry, segment)
        if listed:
            self.link(entry)

    def touch(self, entry: Entry) -> None:
        """A hit: window and protected copies become most recent; probation ones are protected."""
        segment = self.segment(entry)
        if segment == PROBATION:
            self.move(entry, PROTECTED)
            self.settle()
        elif entry.listed & self.bit:
            self.lists[segment].move_to_end(entry.key)

    def settle(self) -> None:
        """Overflowing window entries enter probation; overflowing protected ones fall back to it.

        The window keeps its newest entry even when that one alone is over its share (a large
        adapter in a small tier), so a newcomer still has to win a duel to reach the main area.
        """
        window, protected = self.lists[WINDOW], self.lists[PROTECTED]
        while len(window) > 1 and self._over(WINDOW, self.window_bytes_max, self.window_entries_max):
            self.move(window[next(iter(window))], PROBATION)
        while protected and self._over(PROTECTED, self.protected_bytes_max, self.protected_entries_max):
            self.move(protected[next(iter(protected))], PROBATION)

    def _over(self, segment: int, bytes_max: float | None, entries_max: int | None) -> bool:
        return (bytes_max is not None and self.segment_bytes[segment] > bytes_max) or (
            entries_max is not None and self.segment_entries[segment] > entries_max
        )

    # -- room

    def fits(self, size_bytes: int, freed_bytes: int = 0, freed_entries: int = 0) -> bool:
        """Whether one more copy of `size_bytes` fits once `freed_*` are gone."""
        return (self.capacity_bytes is None or self.used_bytes - freed_bytes + size_bytes <= self.capacity_bytes) and (
            self.max_entries is None or self.used_entries - freed_entries + 1 <= self.max_entries
        )

    def could_fit(self, size_bytes: int) -> bool:
        """Whether it would fit after evicting every copy that is not held."""
        return self.fits(size_bytes, self.evictable_bytes, self.evictable_entries)

    def could_fit_later(self, size_bytes: int) -> bool:
        """Whether it would fit once the moves in flight are done: only leases and pins hold room for good."""
        return (self.capacity_bytes is None or self.durable_bytes + size_bytes <= self.capacity_bytes) and (
            self.max_entries is None or self.durable_entries + 1 <= self.max_entries
        )

    def reserve(self, size_bytes: int) -> None:
        self.used_bytes += size_bytes
        self.used_entries += 1

    def release(self, size_bytes: int) -> None:
        self.used_bytes -= size_bytes
        self.used_entries -= 1

    def next_victim(self, incoming_bytes: int, sketch: FrequencySketch) -> Entry:
        """The copy to evict next for an incoming one (which will enter the window).

        If the window is full, its oldest entry duels the main area's victim (the oldest in
        probation, else in protected): the more frequent one stays, the incumbent on a tie,
        and a winning candidate enters probation. Only listed copies take part; the caller
        has checked with `could_fit` that there is one.
        """
        window, main = self.lists[WINDOW], self.lists[PROBATION] or self.lists[PROTECTED]
        window_full = (
            self.window_bytes_max is not None and self.segment_bytes[WINDOW] + incoming_bytes > self.window_bytes_max
        ) or (self.window_entries_max is not None and self.segment_entries[WINDOW] + 1 > self.window_entries_max)
        victim = main[next(iter(main))] if main else None
        if window and (window_full or victim is None):
            candidate = window[next(iter(window))]
            if victim is None or sketch.estimate(candidate.key) <= sketch.estimate(victim.key):
                return candidate
            self.move(candidate, PROBATION)
        assert victim is not None
        return victim

    def snapshot(self) -> TierStats:
        counters = self.counters
        return TierStats(
            name=self.tier.name,
            hits=counters.hits,
            misses=counters.misses,
            promotions=counters.promotions,
            demotions=counters.demotions,
            evictions=counters.evictions,
            resident_entries=sum(self.segment_entries[1:]),
            resident_bytes=sum(self.segment_bytes[1:]),
            capacity_bytes=self.capacity_bytes,
            max_entries=self.max_entries,
            promotion_latency=counters.latency.snapshot(),
        )

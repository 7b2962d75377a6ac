"""Mint's adapter-cache policy against plain LRU and Belady's offline optimum, on Zipf traffic.

    python bench/cache_policy.py [--catalogue 1000000] [--requests 200000] [--exponents 0.8 1.0 1.2]

Three tables, each with its anchor, Mint's figure and their ratio:

1. Hit ratios, per Zipf exponent: the share of requests served by each tier (engine, CPU,
   SSD) and by any of them, after a warm-up. The contestants are the same shipped class,
   `mint.serving.cache.TieredCache`, over byte-counting fake tiers with the same budgets:
   Mint's policy (W-TinyLFU) and plain LRU (`window_fraction=1.0`). Belady's MIN, the
   offline optimum that knows every future request, bounds the engine tier (same slots,
   every request must be loaded) and the whole cache (all tiers' entries as one cache that
   may decline to keep an adapter). Every adapter has the same size, so MIN is exact.
2. Lookup cost: nanoseconds per `acquire` + `release` on a hit, with 10^3 to 10^6 adapters
   tracked; anchor: a hit in a bare `OrderedDict` LRU (the least any Python cache does).
3. Bookkeeping: bytes the cache allocates per tracked adapter (tracemalloc), frequency
   sketch included, keys excluded (the caller owns them); anchor: the same `OrderedDict`.

Requests are drawn with numpy from a finite Zipf distribution over the catalogue (the rank
k is asked for with probability proportional to k^-s), and ranks are shuffled onto adapter
ids. The defaults finish in one to two minutes on two cores.
"""

from __future__ import annotations

import argparse
import heapq
import sys
import time
import tracemalloc
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mint.serving.cache import Tier, TieredCache  # noqa: E402

MiB = 1024 * 1024


class CountingTier:
    """A tier that keeps no bytes: it counts what it would hold and checks its budget."""

    def __init__(
        self, name: str, payload: bytes, *, capacity_bytes: int | None, max_entries: int | None, readable: bool
    ) -> None:
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.max_entries = max_entries
        self.readable = readable
        self._payload = payload
        self._keys: set[str] = set()

    def get(self, key: str) -> bytes:
        assert key in self._keys, f"{self.name} was asked for a copy it does not hold"
        return self._payload

    def put(self, key: str, payload: bytes) -> None:
        self._keys.add(key)
        size = len(self._keys)
        assert self.max_entries is None or size <= self.max_entries, f"{self.name} over its entries"
        assert self.capacity_bytes is None or size * len(payload) <= self.capacity_bytes, f"{self.name} over its bytes"

    def delete(self, key: str) -> None:
        self._keys.discard(key)

    def contains(self, key: str) -> bool:
        return key in self._keys


class CountingOrigin:
    """The object store: every adapter exists and has the same bytes."""

    name = "object_store"

    def __init__(self, payload: bytes) -> None:
        self._payload = payload

    def get(self, key: str) -> bytes:
        return self._payload


def make_cache(args: argparse.Namespace, payload: bytes, *, window_fraction: float) -> TieredCache:
    size = len(payload)
    tiers: list[Tier] = [
        CountingTier("engine", payload, capacity_bytes=None, max_entries=args.engine_slots, readable=False),
        CountingTier("cpu", payload, capacity_bytes=args.cpu_adapters * size, max_entries=None, readable=True),
        CountingTier("ssd", payload, capacity_bytes=args.ssd_adapters * size, max_entries=None, readable=True),
    ]
    expected = args.engine_slots + args.cpu_adapters + args.ssd_adapters
    return TieredCache(tiers, CountingOrigin(payload), expected_entries=expected, window_fraction=window_fraction)


# ---- traffic and the offline optimum ---------------------------------------------------------


def zipf_requests(catalogue: int, count: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """`count` adapter ids in [0, catalogue), rank k drawn with probability proportional to k^-exponent."""
    weights = np.arange(1, catalogue + 1, dtype=np.float64) ** -exponent
    cumulative = np.cumsum(weights)
    ranks = np.searchsorted(cumulative, rng.random(count) * cumulative[-1], side="right")
    ranks = np.minimum(ranks, catalogue - 1)
    ids: np.ndarray = rng.permutation(catalogue)[ranks]
    return ids


def next_uses(requests: np.ndarray) -> np.ndarray:
    """For each request, the position of the next request for the same id (len(requests) if none)."""
    order = np.argsort(requests, kind="stable")
    grouped = requests[order]
    following = np.full(len(requests), len(requests), dtype=np.int64)
    same = grouped[1:] == grouped[:-1]
    following[order[:-1][same]] = order[1:][same]
    return following


def belady_hits(requests: np.ndarray, following: np.ndarray, capacity: int, *, bypass: bool, warmup: int) -> int:
    """Hits after `warmup` of Belady's MIN with `capacity` entries: evict what is needed farthest ahead.

    With `bypass`, an adapter needed later than everything cached is not cached at all (the
    optimum for a cache that may decline); without, every request is loaded (an engine).
    """
    cached: dict[int, int] = {}  # id -> position of its next request
    farthest: list[tuple[int, int]] = []  # (-next position, id), with stale pairs skipped lazily
    hits = 0
    for position, (adapter, upcoming) in enumerate(zip(requests.tolist(), following.tolist(), strict=True)):
        if adapter in cached:
            hits += position >= warmup
        elif len(cached) >= capacity:
            while cached.get(farthest[0][1]) != -farthest[0][0]:
                heapq.heappop(farthest)
            if bypass and upcoming >= -farthest[0][0]:
                continue
            del cached[heapq.heappop(farthest)[1]]
        cached[adapter] = upcoming
        heapq.heappush(farthest, (-upcoming, adapter))
    return hits


# ---- the three measurements ------------------------------------------------------------------


def served_shares(cache: TieredCache, keys: list[str], sequence: list[int], warmup: int) -> dict[str, float]:
    """Run the requests; the share of post-warm-up requests each tier served (by stats deltas)."""
    for index in sequence[:warmup]:
        cache.acquire(keys[index]).release()
    before = {tier.name: tier.hits for tier in cache.stats().tiers}
    for index in sequence[warmup:]:
        cache.acquire(keys[index]).release()
    measured = len(sequence) - warmup
    shares = {tier.name: (tier.hits - before[tier.name]) / measured for tier in cache.stats().tiers}
    shares["any tier"] = 1.0 - shares.pop("object_store")
    return shares


def hit_ratio_table(args: argparse.Namespace, exponent: float, payload: bytes) -> None:
    rng = np.random.default_rng(args.seed)
    requests = zipf_requests(args.catalogue, args.requests, exponent, rng)
    distinct, sequence = np.unique(requests, return_inverse=True)
    keys = [f"{int(adapter):064x}" for adapter in distinct]
    order = sequence.tolist()
    warmup = int(len(order) * args.warmup)

    started = time.perf_counter()
    mint = served_shares(make_cache(args, payload, window_fraction=0.01), keys, order, warmup)
    mint_s = time.perf_counter() - started
    lru = served_shares(make_cache(args, payload, window_fraction=1.0), keys, order, warmup)
    following = next_uses(sequence)
    measured = len(order) - warmup
    total = args.engine_slots + args.cpu_adapters + args.ssd_adapters
    belady = {
        "engine": belady_hits(sequence, following, args.engine_slots, bypass=False, warmup=warmup) / measured,
        "any tier": belady_hits(sequence, following, total, bypass=True, warmup=warmup) / measured,
    }

    print(
        f"\nHit ratio, Zipf s={exponent}: share of {measured:,} requests (after {warmup:,} of warm-up) "
        f"served by each tier; {len(keys):,} distinct adapters asked for; Mint ran {mint_s:.1f} s"
    )
    rows = [
        (
            tier,
            f"{lru[tier]:.4f}",
            f"{mint[tier]:.4f}",
            _ratio(mint[tier], lru[tier]),
            f"{belady[tier]:.4f}" if tier in belady else "-",
            _ratio(mint[tier], belady[tier]) if tier in belady else "-",
        )
        for tier in ("engine", "cpu", "ssd", "any tier")
    ]
    _table(["tier", "LRU", "Mint", "Mint/LRU", "Belady", "Mint/Belady"], rows)


def lookup_and_memory_table(args: argparse.Namespace, payload: bytes) -> None:
    rng = np.random.default_rng(args.seed)
    rows = []
    for entries in args.lookup_sizes:
        keys = [f"{index:064x}" for index in range(entries)]
        probes = [keys[index] for index in rng.integers(0, entries, args.lookup_hits).tolist()]

        tracemalloc.start()
        engine = CountingTier("engine", payload, capacity_bytes=None, max_entries=entries, readable=False)
        cache = TieredCache([engine], CountingOrigin(payload), expected_entries=entries)
        for key in keys:
            cache.adopt("engine", key, len(payload))
        mint_bytes = tracemalloc.get_traced_memory()[0] / entries
        tracemalloc.stop()
        tracemalloc.start()
        anchor: OrderedDict[str, None] = OrderedDict.fromkeys(keys)
        anchor_bytes = tracemalloc.get_traced_memory()[0] / entries
        tracemalloc.stop()

        started = time.perf_counter_ns()
        for key in probes:
            anchor[key]  # noqa: B018 - the read a cache hit does
            anchor.move_to_end(key)
        anchor_ns = (time.perf_counter_ns() - started) / len(probes)
        started = time.perf_counter_ns()
        for key in probes:
            cache.acquire(key).release()
        mint_ns = (time.perf_counter_ns() - started) / len(probes)
        assert cache.stats().tier("engine").hits == len(probes)
        rows.append((entries, anchor_ns, mint_ns, anchor_bytes, mint_bytes))

    print(f"\nLookup cost: ns per acquire + release on a hit ({args.lookup_hits:,} hits on random adapters)")
    _table(
        ["adapters tracked", "OrderedDict hit", "Mint hit", "Mint/OrderedDict"],
        [(f"{n:,}", f"{a:.0f}", f"{m:.0f}", _ratio(m, a)) for n, a, m, _, _ in rows],
    )
    print("\nBookkeeping: bytes allocated per tracked adapter (tracemalloc; keys excluded)")
    _table(
        ["adapters tracked", "OrderedDict", "Mint", "Mint/OrderedDict"],
        [(f"{n:,}", f"{a:.0f}", f"{m:.0f}", _ratio(m, a)) for n, _, _, a, m in rows],
    )


def _ratio(value: float, anchor: float) -> str:
    return f"{value / anchor:.2f}x" if anchor else "-"


def _table(header: list[str], rows: Sequence[tuple[object, ...]]) -> None:
    cells = [header, *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    for number, row in enumerate(cells):
        print(
            "  ".join(
                cell.rjust(width) if column else cell.ljust(width)
                for column, (cell, width) in enumerate(zip(row, widths, strict=True))
            )
        )
        if number == 0:
            print("  ".join("-" * width for width in widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--catalogue", type=int, default=1_000_000, help="adapters that exist")
    parser.add_argument("--requests", type=int, default=200_000, help="requests per exponent")
    parser.add_argument("--warmup", type=float, default=0.25, help="share of requests before counting")
    parser.add_argument("--exponents", type=float, nargs="+", default=[0.8, 1.0, 1.2])
    parser.add_argument("--engine-slots", type=int, default=32)
    parser.add_argument("--cpu-adapters", type=int, default=256, help="the CPU tier's budget, in adapters")
    parser.add_argument("--ssd-adapters", type=int, default=4096, help="the SSD tier's budget, in adapters")
    parser.add_argument("--adapter-mib", type=int, default=64, help="every adapter's size")
    parser.add_argument("--lookup-sizes", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    parser.add_argument("--lookup-hits", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    payload = bytes(args.adapter_mib * MiB)  # one buffer shared by every adapter: tiers count, never copy
    print(
        f"Catalogue {args.catalogue:,} adapters of {args.adapter_mib} MiB; budgets: engine {args.engine_slots} "
        f"slots, CPU {args.cpu_adapters} adapters ({args.cpu_adapters * args.adapter_mib / 1024:.0f} GiB), "
        f"SSD {args.ssd_adapters} adapters ({args.ssd_adapters * args.adapter_mib / 1024:.0f} GiB)"
    )
    for exponent in args.exponents:
        hit_ratio_table(args, exponent, payload)
    lookup_and_memory_table(args, payload)


if __name__ == "__main__":
    main()

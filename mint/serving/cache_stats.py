"""What the adapter cache counts, and how it is exposed: statistics snapshots and Prometheus metrics.

`TieredCache` (`mint.serving.cache`) keeps one `TierCounters` per tier (and one for the
origin), updated under its lock: hits, misses, promotions, demotions, evictions and a
latency histogram of promotions into the engine by the tier the copy came from.
`TieredCache.stats()` returns them as a `CacheStats` snapshot (frozen dataclasses, what the
node's `GET /internal/v1/cache` returns), and `register_metrics` exposes the same snapshot to
Prometheus at each scrape (`GET /metrics` of a node). Nothing here decides anything: the
policy is the cache's.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0)


# ---- snapshots and counters ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LatencyStats:
    """A latency histogram: `buckets` are (upper bound in seconds, how many took at most that),
    cumulative, the last bound infinite."""

    count: int
    sum_s: float
    buckets: tuple[tuple[float, int], ...]


@dataclass(frozen=True)
class TierStats:
    """One tier's counters since start-up, and what it holds now.

    `hits`: acquires whose nearest copy was here; `misses`: acquires that looked here and
    found none. `promotions`: copies written here on the way up (acquire, pin, prefetch);
    `demotions`: copies moved here from a faster tier that evicted them; `evictions`: copies
    removed to make room or by `TieredCache.evict`. `promotion_latency`: promotions into the
    engine served from this tier, from the first look to the lease. The origin's residency and
    budget are None.
    """

    name: str
    hits: int
    misses: int
    promotions: int
    demotions: int
    evictions: int
    resident_entries: int | None
    resident_bytes: int | None
    capacity_bytes: int | None
    max_entries: int | None
    promotion_latency: LatencyStats


@dataclass(frozen=True)
class CacheStats:
    """Every tier's statistics, fastest first and the origin last, and the cache's holds now."""

    tiers: tuple[TierStats, ...]
    leases: int  # leases held now
    pinned: int  # adapters pinned now
    prefetched: int  # copies warmed by `prefetch` since start-up

    def tier(self, name: str) -> TierStats:
        for stats in self.tiers:
            if stats.name == name:
                return stats
        raise KeyError(name)


class LatencyHistogram:
    """Counts of latencies per bucket of `LATENCY_BUCKETS_S` (the last bucket is everything above)."""

    __slots__ = ("counts", "sum_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.sum_s += seconds

    def snapshot(self) -> LatencyStats:
        cumulative, buckets = 0, []
        for bound, count in zip((*LATENCY_BUCKETS_S, float("inf")), self.counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        return LatencyStats(count=cumulative, sum_s=self.sum_s, buckets=tuple(buckets))


@dataclass
class TierCounters:
    hits: int = 0
    misses: int = 0
    promotions: int = 0
    demotions: int = 0
    evictions: int = 0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)


# ---- metrics ---------------------------------------------------------------------------------


class StatsSource(Protocol):
    """What the metrics read: a cache's statistics snapshot (`TieredCache.stats`)."""

    def stats(self) -> CacheStats: ...


class CacheCollector(Collector):
    """Prometheus metrics read from `TieredCache.stats()` at each scrape (labels: the tier's name)."""

    def __init__(self, cache: StatsSource, prefix: str = "mint_adapter_cache") -> None:
        self._cache = cache
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        stats, prefix = self._cache.stats(), self._prefix
        counters = {
            "hits": "Acquires whose nearest copy was in this tier",
            "misses": "Acquires that looked in this tier and found no copy",
            "promotions": "Copies written into this tier on the way to the engine",
            "demotions": "Copies moved into this tier from a faster tier that evicted them",
            "evictions": "Copies removed from this tier to make room or by an operator",
        }
        for name, documentation in counters.items():
            family = CounterMetricFamily(f"{prefix}_{name}", documentation, labels=["tier"])
            for tier in stats.tiers:
                family.add_metric([tier.name], getattr(tier, name))
            yield family
        gauges = {
            "resident_bytes": "Bytes of the copies this tier holds",
            "resident_entries": "Copies this tier holds",
            "capacity_bytes": "This tier's budget in bytes",
            "max_entries": "This tier's budget in entries",
        }
        for name, documentation in gauges.items():
            gauge = GaugeMetricFamily(f"{prefix}_{name}", documentation, labels=["tier"])
            for tier in stats.tiers:
                value = getattr(tier, name)
                if value is not None:
                    gauge.add_metric([tier.name], value)
            yield gauge
        latency = HistogramMetricFamily(
            f"{prefix}_promotion_seconds",
            "Time to make an adapter servable in the engine, by the tier its copy came from",
            labels=["source"],
        )
        for tier in stats.tiers:
            histogram = tier.promotion_latency
            buckets = [("+Inf" if bound == float("inf") else repr(bound), count) for bound, count in histogram.buckets]
            latency.add_metric([tier.name], buckets, histogram.sum_s)
        yield latency
        yield GaugeMetricFamily(f"{prefix}_leases", "Leases held now", value=stats.leases)
        yield GaugeMetricFamily(f"{prefix}_pinned", "Adapters pinned now", value=stats.pinned)


def register_metrics(cache: StatsSource, registry: CollectorRegistry = REGISTRY) -> CacheCollector:
    """Expose the cache's statistics on `registry` (the API's `/metrics` serves the default one)."""
    collector = CacheCollector(cache)
    registry.register(collector)
    return collector

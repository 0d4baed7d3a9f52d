"""Per-model serving metrics: requests by status, latency histogram, compiles, cache events.

`Metrics` keeps them in the process (tests, the explain text); `RayMetrics` also records
them through `ray.util.metrics`, which Ray exports in Prometheus format on each node's
metrics port (names get Ray's `ray_` prefix):

    ray_autoclust_requests_total{model, status}        requests answered, by HTTP status
    ray_autoclust_request_latency_ms_bucket{model, le}  time in the replica, per request
    ray_autoclust_compiles_total{model}                 signatures compiled by replicas
    ray_autoclust_cache_entries_total{model, event}     --cache_dir entries loaded, stored
                                                        (built here), refused; lock waits
"""

from __future__ import annotations

import bisect
import collections
from typing import Any

from autoclust.runtime import disk_cache

LATENCY_BUCKETS_MS = (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000)
CACHE_EVENTS = ("loaded", "stored", "refused", "lock_waits")


class Metrics:
    """Counters of one model's replica in this process."""

    def __init__(self, model: str):
        self.model = model
        self.requests: collections.Counter[int] = collections.Counter()
        self.latency_counts = [0] * (len(LATENCY_BUCKETS_MS) + 1)  # the last: over the top
        self.compiles = 0
        self.cache: collections.Counter[str] = collections.Counter()
        self._cache_seen = {e: disk_cache.COUNTS[e] for e in CACHE_EVENTS}

    def request(self, status: int, seconds: float) -> None:
        """One answered request."""
        ms = seconds * 1e3
        self.requests[status] += 1
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS_MS, ms)] += 1
        self._emit_request(status, ms)

    def compiled(self, session: Any) -> None:
        """Take in the session's compiles and the cache's events since the last call."""
        total = sum(c["compiles"] for c in session.stats()["clusters"])
        if total != self.compiles:
            self._emit_compiles(total - self.compiles)
            self.compiles = total
        for event in CACHE_EVENTS:
            delta = disk_cache.COUNTS[event] - self._cache_seen[event]
            if delta:
                self._cache_seen[event] += delta
                self.cache[event] += delta
                self._emit_cache(event, delta)

    def summary(self) -> str:
        """One line for the explain text."""
        answered = sum(self.requests.values())
        codes = ", ".join(f"{n} x {s}" for s, n in sorted(self.requests.items()))
        cache = ", ".join(f"{n} {e}" for e, n in sorted(self.cache.items()))
        return (f"{answered} requests ({codes or 'none'}), {self.compiles} signatures compiled"
                + (f", cache entries: {cache}" if cache else ""))

    def _emit_request(self, status: int, ms: float) -> None:
        pass

    def _emit_compiles(self, n: int) -> None:
        pass

    def _emit_cache(self, event: str, n: int) -> None:
        pass


class RayMetrics(Metrics):
    """Metrics also recorded in Ray's metrics (a replica or an actor only)."""

    def __init__(self, model: str):
        super().__init__(model)
        from ray.util import metrics as rm
        self._tags = {"model": model}
        self._requests = rm.Counter("autoclust_requests", "requests answered, by HTTP status",
                                    tag_keys=("model", "status"))
        self._latency = rm.Histogram("autoclust_request_latency_ms",
                                     "time a request spends in the replica (ms)",
                                     boundaries=list(LATENCY_BUCKETS_MS), tag_keys=("model",))
        self._compiles = rm.Counter("autoclust_compiles", "input signatures compiled",
                                    tag_keys=("model",))
        self._cache = rm.Counter("autoclust_cache_entries", "--cache_dir entries loaded, "
                                 "stored, refused; lock waits", tag_keys=("model", "event"))

    def _emit_request(self, status: int, ms: float) -> None:
        self._requests.inc(1, tags={**self._tags, "status": str(status)})
        self._latency.observe(ms, tags=self._tags)

    def _emit_compiles(self, n: int) -> None:
        self._compiles.inc(n, tags=self._tags)

    def _emit_cache(self, event: str, n: int) -> None:
        self._cache.inc(n, tags={**self._tags, "event": event})

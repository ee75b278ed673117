"""Counters and latency windows behind ``ReplayBuffer.stats()``."""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np

# Latencies kept for the percentiles, and the window of the rates (seconds).
WINDOW = 2048
RATE_WINDOW_S = 60.0


def _percentiles(values) -> dict:
    if not values:
        return {"p50": None, "p99": None}
    a = np.fromiter(values, np.float64, len(values))
    p50, p99 = np.percentile(a, [50, 99])
    return {"p50": float(p50), "p99": float(p99)}


class Stats:
    def __init__(self, now: float) -> None:
        self.started = now
        self.counts: collections.Counter = collections.Counter()
        self.seal_ms: collections.deque = collections.deque(maxlen=WINDOW)
        self.verify_ms: collections.deque = collections.deque(maxlen=WINDOW)
        # Time inside `sample_groups` and `ack` (the spec's sampling and ack latency).
        self.sample_ms: collections.deque = collections.deque(maxlen=WINDOW)
        self.ack_ms: collections.deque = collections.deque(maxlen=WINDOW)
        self.lag: collections.Counter = collections.Counter()
        # (ts, rollouts received, groups sealed) per call, for the rates.
        self.events: collections.deque = collections.deque()
        self.busy = 0.0  # seconds inside add_rollouts

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def received(self, n: int, now: float) -> None:
        self.counts["received"] += n
        self.events.append((now, n, 0))

    def sealed(self, now: float, seal_ms: float) -> None:
        self.counts["groups_sealed"] += 1
        self.seal_ms.append(seal_ms)
        self.events.append((now, 0, 1))

    def verified(self, ms: float) -> None:
        self.verify_ms.append(ms)

    def sampled(self, ms: float) -> None:
        self.sample_ms.append(ms)

    def acked(self, ms: float) -> None:
        self.ack_ms.append(ms)

    def add_call(self, seconds: float) -> None:
        self.counts["add_calls"] += 1
        self.busy += seconds

    def drawn(self, lag: Optional[int]) -> None:
        self.counts["groups_drawn"] += 1
        if lag is not None:
            self.lag[lag] += 1

    def report(self, now: float, **state) -> dict:
        while self.events and now - self.events[0][0] > RATE_WINDOW_S:
            self.events.popleft()
        # Over the window, or over the buffer's life while it is younger than that.
        span = max(min(RATE_WINDOW_S, now - self.started), 1e-3)
        rollouts = sum(e[1] for e in self.events)
        seals = sum(e[2] for e in self.events)
        seal = _percentiles(self.seal_ms)
        out = {
            name: self.counts.get(name, 0)
            for name in (
                "received", "duplicates", "version_rejected", "replica_capped", "groups_sealed",
                "duplicate_groups", "groups_written", "groups_drawn", "batches", "acks_ok",
                "acks_failed", "leases_expired", "consumed", "evicted", "retention", "add_calls",
            )
        }
        out["add_busy_s"] = self.busy
        out.update(state)
        out.update(
            ingest_rollouts_per_s=rollouts / span,
            seal_groups_per_s=seals / span,
            seal_time_ms_p50=seal["p50"],
            seal_time_ms_p99=seal["p99"],
            verifier_latency_ms=_percentiles(self.verify_ms),
            sample_latency_ms=_percentiles(self.sample_ms),
            ack_latency_ms=_percentiles(self.ack_ms),
            policy_lag_histogram=dict(sorted(self.lag.items())),
        )
        return out

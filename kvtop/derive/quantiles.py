"""Latency quantiles from Prometheus histogram buckets, as PromQL's histogram_quantile does:
linear interpolation inside the bucket that holds the rank. Estimates, not exact values."""

from __future__ import annotations

import math

from kvtop.collect.reading import Histogram
from kvtop.derive.stats import Quantiles, QuantileScope


def bucket_delta(now: Histogram, before: Histogram | None) -> list[tuple[float, float]] | None:
    """Cumulative bucket counts observed between two scrapes (None if they don't line up).
    Both are sorted by bound, so lining up is pairwise equality of bounds."""
    if before is None:
        return list(now.buckets)
    if len(now.buckets) != len(before.buckets):
        return None
    delta = []
    for (bound, count), (previous, previous_count) in zip(now.buckets, before.buckets, strict=True):
        if bound != previous:
            return None
        delta.append((bound, count - previous_count))
    return delta


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative (upper bound, count) buckets sorted by bound."""
    if not buckets or not math.isinf(buckets[-1][0]):
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # PromQL: the highest finite bound
            if bound <= 0:
                return bound
            width = count - lower_count
            if width <= 0:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / width
        lower_bound, lower_count = bound, count
    return None


def quantiles(now: Histogram | None, before: Histogram | None,
              scope: QuantileScope) -> Quantiles | None:
    """p50/p90/p99 of the observations between two scrapes (or since start, without one)."""
    if now is None:
        return None
    buckets = bucket_delta(now, before)
    if buckets is None or not buckets or buckets[-1][1] <= 0:
        return None
    return Quantiles(
        p50=quantile(0.5, buckets), p90=quantile(0.9, buckets), p99=quantile(0.99, buckets),
        samples=buckets[-1][1], scope=scope,
    )

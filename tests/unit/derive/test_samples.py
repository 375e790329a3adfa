"""Percentiles of plain samples (a rehearsal's request times, a run's per-minute values) are
numpy's default, linear interpolation: the p90 and p99 a report quotes sit between the two
largest values, not on one of them."""

from __future__ import annotations

from kvtop.derive.samples import percentile


def test_high_percentiles_interpolate_between_the_two_largest_values() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.9) == 3.7
    assert round(percentile([float(v) for v in range(1, 11)], 0.99) or 0.0, 9) == 9.91
    assert percentile([1.0, 2.0], 0.5) == 1.5


def test_the_extremes_are_the_smallest_and_largest_values() -> None:
    values = [5.0, 9.0, 1.0, 7.0]
    assert (percentile(values, 0.0), percentile(values, 1.0)) == (1.0, 9.0)
    assert percentile([], 0.9) is None and percentile([2.5], 0.99) == 2.5


def test_percentile_interpolates() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.0) == 1.0

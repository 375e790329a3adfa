"""Statistics of plain samples. Percentiles (a rehearsal's request times, a run's per-minute
values) are numpy's default, linear interpolation: the p90 and p99 a report quotes sit between
the two largest values, not on one of them. The median, and Theil–Sen's slope with Sen's
bounds, which the leak detector and rehearse's trends rest on."""

from __future__ import annotations

import math

import pytest

from kvtop.derive.samples import median, percentile, theil_sen


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


def test_theil_sen_is_robust_and_bounds_the_slope() -> None:
    xs = [float(i) for i in range(30)]
    ys = [2.0 * x + (50.0 if i % 7 == 0 else 0.0) for i, x in enumerate(xs)]
    slope, lower, upper = theil_sen(xs, ys, 2.33)
    assert slope == pytest.approx(2.0)
    assert lower <= 2.0 <= upper
    flat = theil_sen(xs, [math.sin(x) for x in xs], 2.33)
    assert flat[1] < 0 < flat[2]


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median([1.0, 2.0]) == 1.5
    assert median([7.0]) == 7.0


def pairwise_slopes(xs: list[float], ys: list[float]) -> list[float]:
    return sorted((ys[j] - ys[i]) / (xs[j] - xs[i])
                  for i in range(len(xs)) for j in range(i + 1, len(xs)))


def test_theil_sen_is_the_median_slope_of_each_pair_of_points_once() -> None:
    # pairs (0,1) (0,2) (1,2): slope 1; (0,3) 10/3, (1,3) 4.5, (2,3) 8: median (1 + 10/3) / 2
    slope, _, _ = theil_sen([0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 10.0], 2.33)
    assert slope == pytest.approx((1 + 10 / 3) / 2)


def test_theil_sen_without_two_distinct_times_has_no_slope_and_no_bounds() -> None:
    assert theil_sen([5.0], [1.0], 2.33) == (0.0, -math.inf, math.inf)
    assert theil_sen([5.0, 5.0], [1.0, 9.0], 2.33) == (0.0, -math.inf, math.inf)


# Sen's bounds (Sen 1968; Hollander & Wolfe): of the N = n(n-1)/2 ranked slopes, the lower
# one is at (N - C) / 2 and the upper at (N + C) / 2 (0-based, rounded outwards), with
# C = z * sqrt(n(n-1)(2n+5)/18), Kendall's S standard deviation. At z = 2.33, worked by hand:
@pytest.mark.parametrize(("n", "low", "high"), [
    (4, None, None),  # C = 6.86 > N = 6: unbounded both ways
    (5, 0, None),  # N = 10, C = 9.51: the smallest slope; no upper bound
    (6, 1, 14),  # N = 15, C = 12.40: the 2nd smallest and the largest
    (10, 9, 36),  # N = 45, C = 26.05
    (20, 59, 131),  # N = 190, C = 71.82
    (31, 163, 302),  # N = 465, C = 137.09: a full trend window
])
def test_theil_sen_bounds_are_sens_at_the_given_quantile(n: int, low: int | None,
                                                         high: int | None) -> None:
    xs = [float(i) for i in range(n)]
    ys = [1.3 ** i + 0.1 * i * i for i in range(n)]  # convex: every pairwise slope differs
    slopes = pairwise_slopes(xs, ys)
    assert len(set(slopes)) == len(slopes)
    _, lower, upper = theil_sen(xs, ys, 2.33)
    assert lower == (-math.inf if low is None else slopes[low])
    assert upper == (math.inf if high is None else slopes[high])


def test_a_wider_quantile_widens_the_bounds() -> None:
    xs = [float(i) for i in range(20)]
    ys = [1.3 ** i for i in range(20)]
    slopes = pairwise_slopes(xs, ys)
    _, lower, upper = theil_sen(xs, ys, 1.0)  # C = 30.82: ranks 79 and 111
    assert (lower, upper) == (slopes[79], slopes[111])

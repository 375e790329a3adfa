"""Statistics of plain samples (a run's per-minute values, a rehearsal's request times, the
leak detector's buckets): quantiles, the median and Theil–Sen's robust slope, as opposed to
the histogram-bucket estimates in ``quantiles.py``."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) of ``values`` with linear interpolation (numpy's default);
    None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    """The middle value; the mean of the middle two for an even count."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def theil_sen(xs: list[float], ys: list[float], z: float) -> tuple[float, float, float]:
    """(slope, lower, upper): median pairwise slope and Sen's distribution-free bounds."""
    n = len(xs)
    points = list(zip(xs, ys, strict=True))
    # Every pair once, in one comprehension: the leak detector runs five of these per
    # bucket close, and a list per i (with its slices and zip) cost ~1.8x as much.
    slopes = [(y - yi) / (x - xi) for i, (xi, yi) in enumerate(points)
              for x, y in points[i + 1:] if x != xi]
    slopes.sort()
    if not slopes:
        return 0.0, -math.inf, math.inf
    count = len(slopes)
    # Kendall's S variance (no ties) gives how many ranked slopes the bound spans.
    c = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    low = math.floor((count - c) / 2)
    high = math.ceil((count + c) / 2)
    lower = slopes[low] if low >= 0 else -math.inf
    upper = slopes[high] if high < count else math.inf
    mid = count // 2  # sorted already: median() would sort them again
    middle = slopes[mid] if count % 2 else (slopes[mid - 1] + slopes[mid]) / 2
    return middle, lower, upper

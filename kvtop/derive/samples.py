"""Statistics of plain samples (a run's per-minute values, a rehearsal's request times), as
opposed to the histogram-bucket estimates in ``quantiles.py``."""

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

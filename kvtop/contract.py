"""What every JSON contract kvtop writes shares (snapshot, check, baseline, compare,
rehearse): numbers rounded, and NaN or Inf, which JSON has neither of, written as unknown."""

from __future__ import annotations

import math


def json_number(value: float | None, digits: int = 6) -> float | None:
    """A rounded number for a JSON contract; NaN or Inf (JSON has neither) is unknown."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)

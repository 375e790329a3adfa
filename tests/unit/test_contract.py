"""Numbers in every JSON contract: rounded, and never NaN or infinite (JSON has neither)."""

from __future__ import annotations

import math

from kvtop.contract import json_number


def test_json_numbers_are_rounded_and_never_nan_or_infinite() -> None:
    assert json_number(0.123456789) == 0.123457
    assert json_number(12.3456, 1) == 12.3
    assert [json_number(v) for v in (None, math.nan, math.inf, -math.inf)] == [None] * 4
    assert json_number(0.0) == 0.0

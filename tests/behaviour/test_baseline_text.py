"""The figures of `kvtop baseline show` and `kvtop compare` as a person reads them: each unit
in its own words, milliseconds below a second, whole numbers once they are large, and a
change signed, with its percentage (points for a fraction)."""

from __future__ import annotations

import pytest

from kvtop.headless.baseline_text import DASH, GIB, change, number


@pytest.mark.parametrize(("value", "unit", "text"), [
    (None, "seconds", DASH),
    (0.1234, "fraction", "12.3 %"),
    (0.0042, "seconds", "4.2 ms"),
    (-0.0042, "seconds", "-4.2 ms"),
    (0.01, "seconds", "10 ms"),
    (0.2504, "seconds", "250 ms"),
    (-0.5, "seconds", "-500 ms"),
    (1.0, "seconds", "1.00 s"),
    (-2.345, "seconds", "-2.35 s"),
    (3.14159, "per_min", "3.14/min"),
    (9.94, "tokens_per_s", "9.9/s"),
    (-9.94, "tokens_per_s", "-9.9/s"),
    (10.0, "tokens_per_s", "10/s"),
    (1234.6, "tokens_per_s", "1235/s"),
    (1.5 * GIB, "bytes", "1.50 GiB"),
    (2.005, "count", "2.00"),
])
def test_each_unit_reads_in_its_own_words(value: float | None, unit: str, text: str) -> None:
    assert number(value, unit) == text


@pytest.mark.parametrize(("delta", "pct", "unit", "text"), [
    (None, None, "seconds", ""),
    (0.015, 5.0, "fraction", "+1.5 pts"),
    (-0.015, -5.0, "fraction", "-1.5 pts"),
    (0.2, 25.4, "seconds", "+200 ms (+25 %)"),
    (-0.2, -25.4, "seconds", "-200 ms (-25 %)"),
    (3.0, None, "per_min", "+3.00/min"),
    (0.0, 0.0, "tokens_per_s", "+0.0/s (+0 %)"),
])
def test_a_change_is_signed_with_its_percentage(delta: float | None, pct: float | None,
                                                unit: str, text: str) -> None:
    assert change(delta, pct, unit) == text

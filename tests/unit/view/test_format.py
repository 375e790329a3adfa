"""Number formats as a person reads them: a rate keeps its decimal below 10 (0.4
preemptions a second is not a red "0"), a rate too small for it says so, unknown is a dash."""

from __future__ import annotations

from kvtop.derive.stats import EngineStats
from kvtop.view import format as fmt
from kvtop.view.cells import engine_cells


def test_a_rate_below_10_keeps_one_decimal() -> None:
    assert [fmt.rate(v) for v in (0.4, 1.25, 9.94)] == ["0.4", "1.2", "9.9"]
    # at the boundary: what rounds to 10 is read as 10, as everything above
    assert [fmt.rate(v) for v in (9.96, 10.0, 10.4, 12_345.0)] == ["10", "10", "10", "12.3k"]


def test_a_rate_too_small_for_a_decimal_is_not_zero() -> None:
    assert fmt.rate(0.0) == "0"
    assert fmt.rate(0.049) == "<0.1" and fmt.rate(0.05) == "0.1"  # never "0.0"
    assert fmt.rate(None) == fmt.DASH


def test_the_preemption_column_shows_0_4_not_a_red_0() -> None:
    cells = engine_cells(EngineStats("m", None, 0.0, preemptions_per_s=0.4))
    assert (cells["preempt"].text, cells["preempt"].level) == ("0.4", "bad")
    cells = engine_cells(EngineStats("m", None, 0.0, preemptions_per_s=0.01))
    assert cells["preempt"].text == "<0.1"

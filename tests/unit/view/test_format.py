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


def test_a_negative_rate_too_small_for_a_decimal_keeps_its_sign() -> None:
    assert [fmt.rate(v) for v in (-0.049, -0.05, -12_345.0)] == ["-<0.1", "-0.1", "-12.3k"]


def test_a_count_goes_compact_exactly_at_10_000_and_at_a_million() -> None:
    assert fmt.count(None) == fmt.DASH
    assert [fmt.count(v) for v in (9_999.4, 10_000, 10_050)] == ["9999", "10.0k", "10.1k"]
    assert [fmt.count(v) for v in (999_949, 1_000_000, 1_050_000)] == ["999.9k", "1.0M", "1.1M"]
    assert [fmt.count(v) for v in (-10_000, -1_000_000)] == ["-10.0k", "-1.0M"]


def test_a_percent_is_whole_and_unknown_is_a_dash() -> None:
    assert [fmt.percent(v) for v in (None, 0.0, 0.456, 1.0)] == [fmt.DASH, "0%", "46%", "100%"]


def test_a_latency_is_ms_below_one_second_and_whole_seconds_from_100() -> None:
    assert fmt.seconds(None) == fmt.DASH
    assert [fmt.seconds(v) for v in (0.0, 0.9, 0.9994)] == ["0ms", "900ms", "999ms"]
    assert [fmt.seconds(v) for v in (1.0, 1.5, 99.94)] == ["1.0s", "1.5s", "99.9s"]
    assert [fmt.seconds(v) for v in (100.0, 100.4, 250.0)] == ["100s", "100s", "250s"]


def test_an_age_is_seconds_then_minutes_from_60_then_hours_from_3600() -> None:
    assert fmt.age(None) == fmt.DASH
    assert [fmt.age(v) for v in (0.0, 12.0, 59.4)] == ["0s", "12s", "59s"]
    assert [fmt.age(v) for v in (60.0, 60.5, 3000.0, 3599.0)] == ["1m", "1m", "50m", "60m"]
    assert [fmt.age(v) for v in (3600.0, 3600.5, 5400.0, 36_000.0)] == ["1h", "1h", "2h", "10h"]


def test_a_slope_carries_its_sign_and_fits_seven_cells() -> None:
    assert fmt.slope(None) == fmt.DASH
    assert [fmt.slope(v) for v in (0.0, 0.4, 420.0, 999.4)] == ["+0/h", "+0/h", "+420/h", "+999/h"]
    assert [fmt.slope(v) for v in (-0.4, -420.0)] == ["-0/h", "-420/h"]
    assert [fmt.slope(v) for v in (1000.0, 1350.0, 9_949.0)] == ["+1.0k/h", "+1.4k/h", "+9.9k/h"]
    assert [fmt.slope(v) for v in (10_000.0, 10_000.5, 999_000.0, -12_000.0)] == [
        "+10k/h", "+10k/h", "+999k/h", "-12k/h"]


def test_a_projection_is_minutes_below_an_hour_and_days_from_48_hours() -> None:
    assert fmt.hours(None) == fmt.DASH
    assert [fmt.hours(v) for v in (0.0, 0.75, 0.999)] == ["0m", "45m", "60m"]
    assert [fmt.hours(v) for v in (1.0, 1.5, 2.7, 47.9)] == ["1.0h", "1.5h", "2.7h", "47.9h"]
    assert [fmt.hours(v) for v in (48.0, 48.5, 480.0)] == ["2d", "2d", "20d"]


def test_gib_have_one_decimal_and_unknown_is_a_dash() -> None:
    assert [fmt.bytes_gib(v) for v in (None, 0, 3 * 2**29, 80 * 2**30)] == [
        fmt.DASH, "0.0", "1.5", "80.0"]


def test_a_bar_shows_any_use_and_fills_only_when_full() -> None:
    assert [fmt.bar(v) for v in (0.0, 0.001, 0.5, 0.999, 1.0)] == [
        "░░░░░", "▏░░░░", "██▌░░", "████▉", "█████"]
    # out of range is clamped to the bar's width, unknown is dots as wide as the bar
    assert [fmt.bar(v) for v in (-0.2, 1.5, None)] == ["░░░░░", "█████", "·····"]
    assert (fmt.bar(None, 3), fmt.bar(0.5, 8)) == ("···", "████░░░░")


def test_the_kv_cell_shows_blocks_when_known_else_the_percent() -> None:
    assert fmt.kv_cell(0.5, 30, 100) == "██▌░░ 30/100"  # the reported usage wins
    assert fmt.kv_cell(None, 30, 100) == "█▌░░░ 30/100"  # usage from the blocks
    assert fmt.kv_cell(None, 30, 0) == fmt.DASH  # no pool to divide by
    assert fmt.kv_cell(None, None, 100) == fmt.DASH
    assert fmt.kv_cell(0.5, None, 100) == "██▌░░ 50%"
    assert fmt.kv_cell(0.5, 30, None) == "██▌░░ 50%"
    assert fmt.kv_cell(0.5, None, None, cells=8) == "████░░░░ 50%"
    assert fmt.kv_cell(0.5, 30, 100, cells=8) == "████░░░░ 30/100"

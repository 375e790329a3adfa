"""Time charts as text without a terminal: columns on the wall clock, sparklines that tell
zero from no number, and time axes that agree across panes of different widths."""

from __future__ import annotations

import math

from kvtop.view import format as fmt
from kvtop.view.chart import (
    AXIS,
    TICKS,
    Chart,
    Rule,
    Series,
    _axis_labels,
    _Canvas,
    _dot_rows,
    _tick_age,
    bins,
    join_gaps,
    joined_bins,
    nice_ceiling,
    render,
    spacing_s,
    spark_rows,
    time_ticks,
)

SPAN = 300.0


def test_points_are_bucketed_on_the_wall_clock_and_unknown_is_blank() -> None:
    points = [(915.0, 15.0), (990.0, 90.0), (999.0, 99.0)]
    values = bins(points, 999.5, span_s=100.0, count=10)
    assert values[-1] == 94.5  # 990 and 999 share the last 10 s cell
    assert values[1] == 15.0
    assert values[0] is None and values[5] is None  # no data: blank, not zero


def test_a_sparkline_tells_zero_from_no_number() -> None:
    # zero is the floor, any use at least two eighths, no number a blank
    assert spark_rows([0.0, None, 0.1, 50.0, 100.0], 100.0, 1) == ["▁ ▂▄█"]
    assert spark_rows([0.0, None], 0.0, 1) == ["▁ "]  # a top of 0: still zero, not blank
    top, bottom = spark_rows([100.0, 75.0, 10.0, 0.0], 100.0, 2)
    assert (top, bottom) == ("█▄  ", "██▂▁")


def test_sparkline_columns_between_scrapes_are_joined_a_silence_is_not() -> None:
    # a scrape every 5 s over 30 cells of 2 s: the line is whole
    every_5s = [(1000.0 - 5 * i, 10.0) for i in range(15)]
    assert None not in joined_bins(every_5s, 1000.0, 60.0, 30)[1:]  # [0]: before 940 s
    # ...but a 30 s silence stays a gap
    silent = [(t, v) for t, v in every_5s if not 960 < t < 990]
    values = joined_bins(silent, 1000.0, 60.0, 30)
    assert values.count(None) >= 10


def test_every_pane_reads_the_same_span_whatever_its_width() -> None:
    # 120x40: the requests pane's plot is 25 cells, the hit pane's 23; both said -5m
    for width in (20, 23, 25, 31, 40, 60, 110):
        ticks = time_ticks(SPAN, width)
        assert ticks.startswith("-5m") and ticks.rstrip().endswith("now"), (width, ticks)
    assert time_ticks(SPAN, 40).split() == ["-5m", "-4m", "-3m", "-2m", "-1m", "now"]
    assert time_ticks(SPAN, 31).split() == ["-5m", "now"]  # no -4m beside a -5m elsewhere


def test_a_hit_rate_with_quiet_spells_is_a_line_not_a_scatter_of_dots() -> None:
    from kvtop.derive.stats import EngineStats
    from kvtop.view.engine import HIT_JOIN_S, hit_pane

    # a bursty server: a hit rate every 1 s for 5 s, then 20 s without a lookup, and again
    history = [EngineStats("m", "0", float(t), hit_rate=0.4 + (t % 50) / 100,
                           hit_rate_scope="window" if t % 25 < 5 else None)
               for t in range(700, 1001)]
    pane = hit_pane(history[-1], history, 1000.0, 300.0)
    assert pane.chart is not None
    [series] = pane.chart.series
    assert series.join_s == HIT_JOIN_S == 30.0
    values = joined_bins(series.points, 1000.0, 300.0, 60, series.join_s)
    first = next(i for i, v in enumerate(values) if v is not None)
    assert None not in values[first:]  # joined across the 20 s spells
    assert joined_bins(series.points, 1000.0, 300.0, 60).count(None) > 20  # unjoined: dots


# Exact values at each rule's edges (issue 28): the round axis top, the tick labels, the
# columns, the joins and the drawn cells, so a shifted boundary or a lost dot shows.

def test_the_axis_top_is_the_next_round_number_at_or_above_the_highest() -> None:
    values = (0.0, -1.0, math.inf, math.nan, 1.0, 1.0000001, 1.5, 1.6, 2.1, 2.6, 3.1, 4.1,
              5.1, 6.1, 8.1, 9.99, 0.07, 1234.0, 10.0)
    assert [nice_ceiling(v) for v in values] == [
        1.0, 1.0, 1.0, 1.0, 1.0, 1.5, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 10.0,
        0.08, 1500.0, 10.0]
    assert nice_ceiling(1.5 * (1 + 1e-9)) == 1.5  # exactly at the tolerance: still 1.5
    assert nice_ceiling(85.0) == 100.0  # past 8 x 10: the next power of ten


def test_a_chart_axis_uses_its_top_when_positive_else_the_highest_point_or_rule() -> None:
    ramp = Series("a", "b", [(1.0, None), (2.0, 7.0)])
    assert Chart((ramp,), 10.0, 10.0, top=0.0, rules=(Rule("r", "r", 12.0),)).axis_top() == 15
    assert Chart((ramp,), 10.0, 10.0, top=-3.0).axis_top() == 8.0
    assert Chart((ramp,), 10.0, 10.0, top=30.0).axis_top() == 30.0
    assert Chart((), 10.0, 10.0).axis_top() == 1.0
    assert Chart((), 10.0, 10.0, rules=(Rule("r", "r", 0.5),)).axis_top() == 0.5
    assert Chart((ramp,), 10.0, 10.0, top=0.5).axis_top() == 0.5  # under 1: still its top


def test_tick_ages_are_whole_units_or_minutes_and_seconds() -> None:
    ages = (0, 59, 59.4, 59.6, 60, 90, 181, 3600, 3660, 5400, 7200, 86400, 90000, 172800)
    assert [_tick_age(s) for s in ages] == [
        "0s", "59s", "59s", "1m", "1m", "1m30s", "3m1s", "1h", "61m", "90m", "2h", "1d", "25h",
        "2d"]


def test_time_ticks_are_round_steps_that_fit_end_at_their_column_and_never_touch() -> None:
    assert time_ticks(300.0, 40) == "-5m   -4m     -3m    -2m     -1m     now"
    assert time_ticks(300.0, 8) == "-5m  now"
    assert time_ticks(300.0, 7) == "-5m now"
    assert time_ticks(300.0, 3) == "now"
    assert time_ticks(60.0, 30) == "-1m        -30s            now"
    assert time_ticks(3600.0, 50) == "-1h  -50m    -40m    -30m     -20m    -10m     now"
    assert time_ticks(86400.0, 60) == (
        "-1d         -18h           -12h           -6h            now")
    assert time_ticks(45.0, 48) == "-45s         -30s           -15s             now"
    assert time_ticks(7.0, 16) == "  -5s        now"  # no step divides 7 s: the smallest
    assert time_ticks(9.0, 16) == "     -5s     now"  # ...and none past the span
    assert time_ticks(420.0, 60) == (  # 7 minutes: six labels at most, so not every minute
        "      -6m              -4m              -2m              now")
    assert time_ticks(25.0, 20) == "     -15s        now"  # two labels at most in 20 cells
    assert time_ticks(60.0, 15) == "-1m         now"  # one step in under 16 cells
    assert time_ticks(604800.0, 20) == "-7d              now"  # longer than any step
    assert time_ticks(300.0, 6) == "   now"  # -5m would touch now
    assert time_ticks(300.0, 2) == "  "  # not even now fits


def test_bins_take_the_mean_per_column_and_drop_the_future_the_old_and_non_numbers() -> None:
    points = [(0.0, 1.0), (9.99, 3.0), (10.0, 5.0), (99.99, 7.0), (100.0, 9.0),
              (50.0, math.nan), (55.0, None), (-0.01, 4.0)]
    assert bins(points, 99.99, 100.0, 10) == [2.0, 5.0, None, None, None, None, None, None,
                                              None, 7.0]
    assert bins([(12.0, 1.0), (18.0, 3.0), (9.0, 5.0)], 19.0, 10.0, 1) == [2.0]
    assert bins([(9.9, 1.0), (9.6, 3.0)], 10.0, 0.5, 5) == [3.0, None, None, 1.0, None]
    assert bins([(-0.5, 1.0)], -0.5, 2.0, 2) == [None, 1.0]  # before 1970: floor, not trunc
    for span, count in ((0.0, 10), (10.0, 0), (-1.0, 3), (10.0, -1)):
        assert bins([(1.0, 1.0)], 1.0, span, count) == []


def test_the_spacing_is_the_median_gap_between_known_points() -> None:
    assert spacing_s([(0.0, 1.0), (5.0, 1.0), (5.0, 1.0), (10.0, None), (20.0, 1.0),
                      (21.0, 1.0)]) == 5.0
    assert spacing_s([(0.0, 1.0), (1.0, 1.0), (3.0, 1.0), (6.0, 1.0)]) == 2.0
    assert spacing_s([(0.0, 1.0), (1.0, 1.0), (3.0, 1.0), (6.0, 1.0), (10.0, 1.0)]) == 3.0
    assert spacing_s([(0.0, 1.0), (0.0, 1.0), (0.0, 1.0), (1.0, 1.0), (3.0, 1.0)]) == 2.0
    assert spacing_s([(3.0, 1.0)]) == 0.0
    assert spacing_s([(3.0, None), (4.0, 1.0)]) == 0.0


def test_gaps_up_to_most_columns_are_joined_on_a_straight_line() -> None:
    assert join_gaps([None, 1.0, None, None, 4.0, None, None, None, 8.0, None], 3) == [
        None, 1.0, 2.0, 3.0, 4.0, None, None, None, 8.0, None]
    assert join_gaps([1.0, None, 3.0, None, None, None, None, 9.0], 4) == [
        1.0, 2.0, 3.0, None, None, None, None, 9.0]
    assert join_gaps([1.0, 2.0], 1) == [1.0, 2.0]


def test_joined_bins_join_within_two_and_a_half_intervals_or_join_s() -> None:
    every_5s = [(940.0 + 5 * i, 10.0 * i) for i in range(12)]
    assert joined_bins(every_5s, 1000.0, 60.0, 12) == [
        10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, None]
    line = [None, *(10.0 + 5 * i for i in range(21)), None, None]
    assert joined_bins(every_5s, 1000.0, 60.0, 24) == line
    silent = [p for p in every_5s if not 960 <= p[0] <= 975]  # 25 s without a scrape
    assert joined_bins(silent, 1000.0, 60.0, 24) == [*line[:6], *[None] * 9, *line[15:]]
    assert joined_bins(silent, 1000.0, 60.0, 24, join_s=25.0) == line
    shorter = [p for p in every_5s if p[0] not in (965.0, 970.0)]  # 15 s: 6 columns
    assert joined_bins(shorter, 1000.0, 60.0, 24) == [*line[:8], *[None] * 5, *line[13:]]
    # half-second columns: a gap of two stays, as 2.5 x 0.1 s is under one column
    burst = [(8.0, 1.0), (8.1, 1.0), (8.2, 1.0), (9.0, 3.0)]
    assert joined_bins(burst, 10.0, 10.0, 20) == [*[None] * 15, 1.0, None, 3.0, None, None]
    assert joined_bins([(9.55, 1.0), (9.85, 4.0)], 9.99, 0.5, 5) == [1.0, 2.0, 3.0, 4.0, None]
    assert joined_bins(silent, 1000.0, 60.0, 0) == []
    assert joined_bins(silent, 1000.0, 0.0, 5) == []


def test_dot_rows_scale_to_the_top_and_clamp() -> None:
    values = [None, 0.0, -5.0, 50.0, 100.0, 200.0, 49.0, 51.0]
    assert _dot_rows(values, 100.0, 8) == [None, 0, 0, 4, 7, 7, 3, 4]


def test_the_canvas_joins_points_and_a_rule_only_fills_cells_no_series_drew() -> None:
    canvas = _Canvas(2, 1)
    canvas.rule(1, "r")
    canvas.rule(2, "r")  # the same role: the second rule shares the cell
    canvas.line([3, None, 0, 3], "s")
    canvas.rule(0, "q")  # every cell holds a series' dot: no rule drawn
    assert canvas.rows() == [[("⠇⣾", "s")]]
    canvas = _Canvas(3, 2)
    canvas.line([0, 7, 7, 1, None, 5], "s")
    assert canvas.rows() == [[("⢸⢹⠠", "s")], [("⣸⠸", "s"), (" ", "")]]


def test_a_sparkline_clamps_to_its_top_and_height() -> None:
    values = [None, 0.0, -3.0, 1.0, 49.0, 50.0, 100.0, 150.0]
    assert spark_rows(values, 100.0, 2) == ["      ██", " ▁▁▂████"]
    assert spark_rows([1.0], 100.0, 0) == []
    assert spark_rows([5.0, 0.0], -1.0, 1) == ["▂▁"]
    assert spark_rows([0.25], 0.5, 1) == ["▄"]  # a top under 1 scales too


def _two_series_chart() -> Chart:
    ramp = [(937.0 + 2 * i, 100.0 * i / 31) for i in range(32)]
    flat = [(937.0 + 2 * i, 25.0) for i in range(32) if not 10 <= i < 20]
    return Chart((Series("ramp", "blue", ramp), Series("flat", "green", flat)), now=1000.0,
                 span_s=64.0, top=100.0,
                 rules=(Rule("half", "red", 50.0), Rule("over", "x", 120.0),
                        Rule("neg", "y", -1.0)))


def test_a_chart_draws_its_axis_series_rules_and_ticks_in_cells() -> None:
    assert render(_two_series_chart(), 20, 6) == [
        [("100┤", AXIS), ("            ", ""), ("⢀⡤⠖⠃", "blue")],
        [("   │", AXIS), ("         ", ""), ("⣀⡤⠞⠉", "blue"), ("   ", "")],
        [(" 50┤", AXIS), ("⠂⠂⠂⠂⠂⠂", "red"), ("⣢⠶⠚⠃", "blue"), ("⠂⠂⠂⠂⠂⠂", "red")],
        [("   │", AXIS), ("⠤⠤⢤⣤⠖", "green"), ("⠋⠁", "blue"), ("  ", ""),
         ("⠠⠤⠤⠤⠤⠤⠄", "green")],
        [("  0┤", AXIS), ("⠤⠖⠋", "blue"), ("             ", "")],
        [("   └", AXIS), ("-1m          now", TICKS)],
    ]


def test_a_chart_under_five_rows_has_no_ticks_and_too_small_is_nothing() -> None:
    chart = _two_series_chart()
    assert render(chart, 20, 4) == [
        [("100┤", AXIS), ("           ", ""), ("⢀⣠⠴⠚⠁", "blue")],
        [(" 50┤", AXIS), ("⡀⡀⡀⡀⡀⡀⡀", "red"), ("⣀⣠⡴⡚⡉", "blue"), ("⡀⡀⡀⡀", "red")],
        [("   │", AXIS), ("⣀⣀⣀⣀⣠", "green"), ("⠴⠚⠉", "blue"), (" ", ""),
         ("⢀⣀⣀⣀⣀⣀⡀", "green")],
        [("  0┤", AXIS), ("⣠⠴⠚⠉", "blue"), ("            ", "")],
    ]
    assert render(chart, 8, 2) == [  # the smallest: a plot of 4 cells, 50 has no row
        [("100┤", AXIS), ("⡀", "red"), ("⣀⡴⡃", "blue")],
        [("  0┤", AXIS), ("⠶", "green"), ("⠋", "blue"), ("⠒⠂", "green")],
    ]
    assert render(chart, 7, 6) == []
    assert render(chart, 20, 1) == []


def test_axis_labels_sit_on_the_rows_of_rules_inside_the_axis() -> None:
    rules = tuple(Rule(str(v), "r", v) for v in (0.0, 100.0, 120.0, -5000.0, 80.0, 30.0))
    chart = Chart((), 10.0, 10.0, top=100.0, rules=rules)
    assert _axis_labels(chart, 100.0, 5) == {0: "100", 4: "0", 1: "80", 3: "30"}
    chart = Chart((), 10.0, 10.0, top=1.0, rules=(Rule("half", "r", 0.5),), unit=fmt.percent)
    assert _axis_labels(chart, 1.0, 5) == {0: "100%", 4: "0%", 2: "50%"}


def _hit_chart(join_s: float) -> Chart:
    quiet = [(float(t), 0.3) for t in range(989, 1001) if not 993 <= t <= 996]
    return Chart((Series("hit", "blue", quiet, join_s=join_s),), now=1000.5, span_s=12.0,
                 top=1.0, unit=fmt.percent,
                 rules=(Rule("zero", "floor", 0.0), Rule("half", "half", 0.5),
                        Rule("high", "high", 0.8), Rule("top", "full", 1.0)))


def test_rules_from_zero_to_the_top_are_drawn_and_a_series_joins_its_silences() -> None:
    assert render(_hit_chart(6.0), 16, 6) == [
        [("100%┤", AXIS), ("⠁⠁⠁⠁⠁⠁⠁⠁⠁⠁⠁", "full")],
        [(" 80%┤", AXIS), ("⠁⠁⠁⠁⠁⠁⠁⠁⠁⠁⠁", "high")],
        [(" 50%┤", AXIS), ("⠂⠂⠂⠂⠂⠂⠂⠂⠂⠂⠂", "half")],
        [("    │", AXIS), ("⠒⠒⠒⠒⠒⠒⠒⠒⠒⠒⠂", "blue")],
        [("  0%┤", AXIS), ("⡀⡀⡀⡀⡀⡀⡀⡀⡀⡀⡀", "floor")],
        [("    └", AXIS), ("        now", TICKS)],
    ]
    assert render(_hit_chart(0.0), 16, 6)[3] == [  # not joined: the 4 s silence shows
        ("    │", AXIS), ("⠒⠒⠒", "blue"), ("    ", ""), ("⠒⠒⠒⠂", "blue")]
    assert render(_hit_chart(6.0), 16, 5) == [  # five rows: still room for the time
        [("100%┤", AXIS), ("⡀⡀⡀⡀⡀⡀⡀⡀⡀⡀⡀", "high")],
        [(" 50%┤", AXIS), ("⡀⡀⡀⡀⡀⡀⡀⡀⡀⡀⡀", "half")],
        [("    │", AXIS), ("⣀⣀⣀⣀⣀⣀⣀⣀⣀⣀⡀", "blue")],
        [("  0%┤", AXIS), ("⡀⡀⡀⡀⡀⡀⡀⡀⡀⡀⡀", "floor")],
        [("    └", AXIS), ("        now", TICKS)],
    ]


def test_a_plot_narrower_than_four_cells_is_not_drawn() -> None:
    wide_labels = Chart((), 10.0, 10.0, top=1000.0)
    assert render(wide_labels, 8, 5) == []  # "1000┤" leaves 3 cells
    assert render(wide_labels, 9, 3) == [
        [("1000┤", AXIS), ("    ", "")],
        [("    │", AXIS), ("    ", "")],
        [("   0┤", AXIS), ("    ", "")],
    ]

"""Time charts as text without a terminal: columns on the wall clock, sparklines that tell
zero from no number, and time axes that agree across panes of different widths."""

from __future__ import annotations

from kvtop.view.chart import bins, joined_bins, spark_rows, time_ticks

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

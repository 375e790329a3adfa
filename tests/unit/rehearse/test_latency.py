"""The latency criterion on made-up runs whose answer is known: the slow share and its
boundaries, the sign test, too few requests, the histograms of a watch-only run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from kvtop.derive.quantiles import quantile as histogram_quantile
from kvtop.derive.samples import percentile, theil_sen
from kvtop.load.driver import RequestRecord
from kvtop.rehearse import latency
from kvtop.rehearse.criteria import WINDOWS, Criterion, Span, Z
from kvtop.rehearse.latency import (
    Z_WATCH,
    _add_buckets,
    _histogram_deltas,
    _latency_needs,
    _rising,
    _Shares,
    _slow,
    _slow_thresholds,
    _thirds_quantiles,
    _two_proportion_z,
    _window_slope,
    judge_latency,
    judge_latency_histograms,
)
from kvtop.rehearse.requests import RequestTable
from tests.scenarios.rehearse_runs import SPAN


def table_of(ttft_at: Callable[[float], float], *, n: int = 900,
             fail_at: Callable[[float], bool] = lambda t: False, seed: int = 0) -> RequestTable:
    """n requests evenly over SPAN in two classes; TTFT drawn around ttft_at(t)."""
    rng = random.Random(seed)
    table = RequestTable()
    for i in range(n):
        t = SPAN.length * i / n
        cls = "short" if i % 2 else "long"
        base = ttft_at(t) * (3 if cls == "long" else 1)
        failed = fail_at(t)
        table.add(RequestRecord(
            i + 1, 1, cls, t, 0.0, "timeout" if failed else "ok", 100, 10,
            ttft_s=None if failed else base * rng.lognormvariate(0, 0.3),
            tpot_s=None if failed else 0.01 * rng.lognormvariate(0, 0.2),
            total_s=30.0 if failed else base + 0.1, prompt_tokens=100, completion_tokens=10))
    return table


def test_steady_latency_is_ok() -> None:
    criterion = judge_latency(table_of(lambda t: 0.2), SPAN)
    assert criterion.state == "ok", criterion.reason
    share = criterion.figures["slow_share"]
    assert 0.1 <= share["first"] <= 0.3 and abs(share["last"] - share["first"]) < 0.1
    assert set(criterion.figures["slow_thresholds"]) == {"short", "long"}


def test_rising_latency_fails_with_its_figures() -> None:
    criterion = judge_latency(table_of(lambda t: 0.2 * (1 + 3 * t / 3600)), SPAN)
    assert criterion.state == "fail"
    assert criterion.reason.startswith("rising: ")
    figures = criterion.figures
    assert figures["slow_share"]["last"] > 0.8 and figures["z"] > 2.33
    assert figures["held_to_the_end"] is True and figures["trend_per_hour"] > 0
    assert figures["ttft_s"]["last"]["p50"] > 2 * figures["ttft_s"]["first"]["p50"]


def test_a_rise_that_saturates_in_failures_still_fails() -> None:
    table = table_of(lambda t: 0.2, fail_at=lambda t: t > 1500)
    criterion = judge_latency(table, SPAN)
    assert criterion.state == "fail", criterion.reason
    assert criterion.figures["slow_share"]["last"] == 1.0


def test_a_bump_that_went_away_is_not_a_rise() -> None:
    table = table_of(lambda t: 2.0 if 1300 < t < 2300 else 0.2)
    assert judge_latency(table, SPAN).state != "fail"


def test_one_bad_stretch_at_the_end_is_not_a_rise() -> None:
    table = table_of(lambda t: 5.0 if 2500 < t < 2950 else 0.2)  # one window of the last
    criterion = judge_latency(table, SPAN)
    assert criterion.state != "fail" and criterion.figures["held_to_the_end"] is False


def test_cut_requests_are_left_out_and_few_requests_are_not_judged() -> None:
    table = table_of(lambda t: 0.2, n=60)
    criterion = judge_latency(table, SPAN)
    assert criterion.state == "not_judged" and "too few requests" in criterion.reason
    full = table_of(lambda t: 0.2)
    before = judge_latency(full, SPAN).figures["compared"]["last"]
    for i in range(50):  # cut before anything showed: left out
        full.add(RequestRecord(2000 + i, 1, "short", 3599.0, 0.0, "cut", 100, 10,
                               total_s=0.01))
    assert judge_latency(full, SPAN).figures["compared"]["last"] == before
    for i in range(50):  # cut after waiting longer than any answer took: slow
        full.add(RequestRecord(3000 + i, 1, "short", 3000.0, 0.0, "cut", 100, 10,
                               total_s=100.0))
    figures = judge_latency(full, SPAN).figures
    assert figures["compared"]["last"] == before + 50


def histograms(rate_at: Callable[[float], float], slow_share_at: Callable[[float], float]
               ) -> list[tuple[float, list]]:
    """Cumulative TTFT buckets every 60 s: `rate_at` observations a second, 10 % of them
    between 1 and 5 s, and a share `slow_share_at` over 5 s."""
    bounds = (0.1, 0.5, 1.0, 5.0, math.inf)
    counts = [0.0] * len(bounds)
    series = []
    for step in range(61):
        t = step * 60.0
        n = rate_at(t) * 60
        slow = n * slow_share_at(t)
        counts[0] += (n - slow) * 0.45
        counts[1] += (n - slow) * 0.45
        counts[3] += (n - slow) * 0.1
        counts[4] += slow
        cumulative, total = [], 0.0
        for bound, count in zip(bounds, counts, strict=True):
            total += count
            cumulative.append((bound, total))
        series.append((t, cumulative))
    return series


def test_watch_only_judges_the_servers_histogram() -> None:
    steady = judge_latency_histograms(histograms(lambda t: 5, lambda t: 0.05), SPAN)
    assert steady.state == "ok", steady.reason
    rising = judge_latency_histograms(histograms(lambda t: 5, lambda t: t / 3600), SPAN)
    assert rising.state == "fail", rising.reason
    assert rising.figures["source"] == "the server's TTFT histogram"
    empty = judge_latency_histograms([], SPAN)
    assert empty.state == "not_judged"


def test_a_restart_in_the_histograms_counts_from_zero() -> None:
    series = histograms(lambda t: 5, lambda t: 0.05)
    restarted = [(t, [(b, c / 1000) for b, c in buckets]) if t > 1800 else (t, buckets)
                 for t, buckets in series]
    deltas = _histogram_deltas(restarted, SPAN)
    assert all(d[-1][1] > 0 for _, d in deltas)
    assert judge_latency_histograms(restarted, SPAN).state != "fail"


def shares(first: tuple[int, int], last: tuple[int, int],
           last_windows: list[tuple[int, int]] | None = None) -> _Shares:
    """(slow, count) in the first and last thirds; the last spread over its four windows
    (or as given, per window, in window order 8 to 11)."""
    found = _Shares()
    for i in range(first[1]):
        found.add(SPAN, 100.0 + i * 1000 / first[1], 1.0 if i < first[0] else 0.0)
    per_window = last_windows or [(last[0] // 4 + (w < last[0] % 4), last[1] // 4
                                   + (w < last[1] % 4)) for w in range(4)]
    for w, (slow, count) in enumerate(per_window):
        start = SPAN.length * (8 + w) / WINDOWS
        for i in range(count):
            found.add(SPAN, start + 1 + i * 250 / max(count, 1), 1.0 if i < slow else 0.0)
    return found


def rising(found: _Shares) -> Criterion:
    return _rising("requests", found, SPAN, {})


@pytest.mark.parametrize(("last_slow", "state"), [
    (200, "fail"),  # 10 % -> 20 %: exactly ten points
    (199, "watch"),  # a hair under: a creep, not a failure
    (150, "watch"),  # 10 % -> 15 %: exactly five points, z 1.86
    (149, "ok"),
])
def test_the_latency_boundaries(last_slow: int, state: str) -> None:
    criterion = rising(shares((100, 1000), (last_slow, 1000)))
    assert criterion.state == state, criterion.reason


def test_a_creep_of_five_to_ten_points_is_watch_not_fail() -> None:
    criterion = rising(shares((100, 1000), (170, 1000)))
    assert criterion.state == "watch" and criterion.reason.startswith("creeping up: ")
    assert criterion.figures["z"] >= Z_WATCH


def test_a_rise_not_significant_is_not_a_creep() -> None:
    criterion = rising(shares((3, 30), (6, 30)))  # 10 % -> 20 % on 30 each: z 1.1
    assert criterion.state == "ok"


@pytest.mark.parametrize(("windows", "held"), [
    ([(30, 100)] * 4, True),
    ([(30, 100), (30, 100), (30, 100), (5, 100)], False),  # one window at or under
    ([(30, 100), (30, 100), (30, 100), (1, 4)], True),  # a thin window is left out...
    ([(30, 100), (30, 100), (1, 4), (1, 4)], False),  # ...at most one
    ([(0, 0), (0, 0), (0, 0), (120, 400)], False),  # one window never passes it
])
def test_the_sign_test_over_the_last_thirds_windows(windows: list[tuple[int, int]],
                                                    held: bool) -> None:
    slow = sum(s for s, _ in windows)
    count = sum(c for _, c in windows)
    criterion = rising(shares((10, 100), (slow, count), windows))
    assert criterion.figures["held_to_the_end"] is held
    assert (criterion.state == "fail") is held


@pytest.mark.parametrize(("first", "last", "judged"), [
    (30, 30, True), (29, 300, False), (300, 29, False)])
def test_each_third_needs_thirty_requests(first: int, last: int, judged: bool) -> None:
    criterion = rising(shares((0, first), (0, last)))
    assert (criterion.state != "not_judged") is judged
    if not judged:
        assert "needs 30 each" in criterion.reason
        assert criterion.figures["needs"].startswith("needs about ")


def test_the_minutes_a_short_run_needs() -> None:
    span = Span(0.0, 120.0)  # 2 minutes: 40 s a third
    assert _latency_needs("requests", 10, span) == (
        "needs about 4 more minutes of load at this rate (15.0 requests/min in the sparser "
        "third)")  # 90 at 0.25/s take 360 s, 240 more
    assert _latency_needs("requests", 0, span) == (
        "needs requests in every third of the load; none came in one")


def criterion_of(first: tuple[float, float], last: tuple[float, float],
                 windows: list[tuple[float, float]]) -> Criterion:
    """_rising on counts given exactly: (slow, count) per third and per window 0 to 11."""
    found = _Shares(slow=[first[0], 0.0, last[0]], count=[first[1], 0.0, last[1]],
                    window_slow=[float(s) for s, _ in windows],
                    window_count=[float(c) for _, c in windows])
    return rising(found)


QUIET = [(0, 0)] * 4


def test_a_rise_in_words_and_figures() -> None:
    first = [(30, 250), (31, 250), (31, 250), (31, 249)]  # 123 of 999: 12.3123 %
    last = [(60, 251), (64, 249), (66, 250), (67, 251)]  # 257 of 1001: 25.6743 %
    criterion = criterion_of((123, 999), (257, 1001), first + QUIET + last)
    assert (criterion.name, criterion.title, criterion.state) == (
        "latency", "slow-request share not rising", "fail")
    xs = [(w + 0.5) / 12 for w in (0, 1, 2, 3, 8, 9, 10, 11)]
    ys = [s / c for s, c in first + last]
    slope = theil_sen(xs, ys, 2.33)[0]
    pooled = 380 / 2000
    z = (257 / 1001 - 123 / 999) / math.sqrt(pooled * (1 - pooled) * (1 / 999 + 1 / 1001))
    assert criterion.figures == {
        "slow_share": {"first": 0.1231, "last": 0.2567,
                       "windows": [0.12, 0.124, 0.124, 0.1245, None, None, None, None,
                                   0.239, 0.257, 0.264, 0.2669]},
        "compared": {"first": 999, "last": 1001}, "z": round(z, 2),
        "trend_per_hour": round(slope, 4), "held_to_the_end": True}
    assert round(z, 2) != round(z, 3) and round(slope, 4) != round(slope, 5)
    assert criterion.reason == (f"rising: slow requests 12.3% in the first third, 25.7% in "
                                f"the last (z {z:.1f}; above the first third in every window "
                                f"of the last; trend {slope:+.1%}/h)")


def test_a_creep_and_a_steady_share_in_words() -> None:
    creeping = criterion_of((100, 1000), (170, 1000), [(25, 250)] * 4 + QUIET
                            + [(40, 250), (45, 250), (40, 250), (45, 250)])
    assert (creeping.name, creeping.title, creeping.state) == (
        "latency", "slow-request share not rising", "watch")
    assert creeping.reason == ("creeping up: slow requests 10.0% in the first third, 17.0% in "
                               "the last (z 4.6; above the first third in every window of the "
                               "last; trend +9.0%/h)")
    steady = criterion_of((100, 1000), (100, 1000), [(25, 250)] * 4 + QUIET
                          + [(25, 250), (25, 250), (25, 250), (25, 250)])
    assert (steady.name, steady.title, steady.state) == (
        "latency", "slow-request share not rising", "ok")
    assert steady.reason == ("not rising: slow requests 10.0% in the first third, 10.0% in "
                             "the last (z 0.0; not above the first third in every window of "
                             "the last; trend +0.0%/h)")
    assert steady.figures["trend_per_hour"] == 0.0


def test_a_share_of_nothing_slow_is_zero_not_missing() -> None:
    from_zero = criterion_of((0, 30), (30, 30), [(0, 10)] * 3 + [(0, 0)] * 5 + [(10, 10)] * 3
                             + [(0, 0)])
    assert from_zero.figures["slow_share"] == {
        "first": 0.0, "last": 1.0, "windows": [0.0] * 3 + [None] * 5 + [1.0] * 3 + [None]}
    assert from_zero.figures["z"] == 7.75 and from_zero.state == "fail"
    to_zero = criterion_of((30, 30), (0, 30), [(10, 10)] * 3 + [(0, 0)] * 5 + [(0, 10)] * 3
                           + [(0, 0)])
    assert to_zero.figures["slow_share"]["last"] == 0.0 and to_zero.state == "ok"
    assert to_zero.figures["z"] == -7.75


@pytest.mark.parametrize(("slow1", "n1", "slow3", "n3", "z"), [
    (0, 30, 0, 30, 0.0), (30, 30, 30, 30, 0.0),  # nothing to tell apart: no rise
    # a difference whose standard error underflows to 0: infinitely significant, no crash
    (0, 10, 1e-322, 10, math.inf), (1e-322, 10, 0, 10, -math.inf),
    (10, 100, 20, 100, 0.1 / math.sqrt(0.15 * 0.85 * 0.02)),
    (10, 50, 60, 200, 0.1 / math.sqrt(0.28 * 0.72 * (1 / 50 + 1 / 200)))])
def test_the_two_proportion_z(slow1: float, n1: float, slow3: float, n3: float,
                              z: float) -> None:
    assert _two_proportion_z(slow1, n1, slow3, n3) == pytest.approx(z, rel=1e-12)


def test_a_rise_of_ten_points_short_by_a_float_digit_is_ten_points() -> None:
    windows = [(25, 250)] * 4 + QUIET + [(50, 250)] * 4
    criterion = criterion_of((100, 1000), (199.99999995, 1000), windows)
    assert criterion.state == "fail"  # 0.09999999995 rounds to ten points at 9 digits
    assert criterion_of((100, 1000), (199.9999995, 1000), windows).state == "watch"


@pytest.mark.parametrize(("z", "state"), [
    (Z, "fail"), (Z - 1e-9, "watch"), (Z_WATCH, "watch"), (Z_WATCH - 1e-9, "ok")])
def test_the_z_thresholds_exactly(monkeypatch: pytest.MonkeyPatch, z: float,
                                  state: str) -> None:
    monkeypatch.setattr(latency, "_two_proportion_z", lambda *counts: z)
    criterion = criterion_of((100, 1000), (250, 1000), [(25, 250)] * 4 + QUIET
                             + [(60, 250)] * 4)
    assert criterion.state == state


def test_too_few_in_words() -> None:
    criterion = rising(shares((0, 29), (0, 300)))
    assert (criterion.name, criterion.title, criterion.state) == (
        "latency", "slow-request share not rising", "not_judged")
    needs = _latency_needs("requests", 29, SPAN)
    assert criterion.reason == ("too few requests to compare: 29 in the first third, 300 in "
                                f"the last (needs 30 each): {needs}")
    assert criterion.figures == {"needs": needs}
    assert needs == ("needs about 3 more minutes of load at this rate (1.4 requests/min in "
                     "the sparser third)")


def test_the_minutes_at_one_and_two_requests_a_third() -> None:
    assert _latency_needs("requests", 2, SPAN).startswith(
        "needs about 840 more minutes")  # 90 at 1/600 s: 54,000 s, 50,400 more
    assert _latency_needs("requests", 1, SPAN).startswith("needs about 1740 more minutes")


def test_the_sign_test_at_the_first_thirds_share_and_at_five_requests() -> None:
    def held(last: list[tuple[float, float]]) -> bool:
        slow = sum(s for s, _ in last)
        count = sum(c for _, c in last)
        return bool(criterion_of((10, 100), (slow, count), [(2, 25)] * 4 + QUIET + last)
                    .figures["held_to_the_end"])
    assert held([(30, 100)] * 4)
    assert not held([(30, 100)] * 3 + [(10, 100)])  # exactly the first third's 10 %
    assert held([(30, 100)] * 3 + [(11, 100)])
    assert not held([(30, 100)] * 2 + [(0, 5), (0, 5)])  # five requests are enough to say
    assert held([(30, 100)] * 3 + [(0, 4)])  # four are not
    assert not held([(30, 100)] * 3 + [(0, 5)])


def test_the_trend_needs_three_windows_of_five_requests() -> None:
    def slope(windows: list[tuple[float, float]]) -> float | None:
        found = _Shares(window_slow=[float(s) for s, _ in windows] + [0.0] * (12 - len(windows)),
                        window_count=[float(c) for _, c in windows] + [0.0] * (12 - len(windows)))
        return _window_slope(found, SPAN)
    assert slope([(1, 5), (2, 5)]) is None
    assert slope([(1, 5), (2, 5), (3, 4)]) is None  # four requests are too few to say
    assert slope([(1, 5), (2, 5), (3, 5)]) == pytest.approx(0.2 / (1 / 12))
    assert slope([(1, 10), (4, 10), (9, 10), (10, 10)]) == pytest.approx(
        theil_sen([(w + 0.5) / 12 for w in range(4)], [0.1, 0.4, 0.9, 1.0], Z)[0])


def test_a_share_of_an_empty_third_is_none() -> None:
    found = _Shares()
    found.add(SPAN, 0.0, 1.0)
    assert (found.share(0), found.share(1)) == (1.0, None)


def rows(*records: tuple) -> RequestTable:
    """(t, class, status, ttft, tpot, total) per request."""
    table = RequestTable()
    for i, (t, cls, status, ttft, tpot, total) in enumerate(records):
        table.add(RequestRecord(i + 1, 1, cls, t, 0.0, status, 100, 10, ttft_s=ttft,
                                tpot_s=tpot, total_s=total))
    return table


def test_slow_at_the_thresholds() -> None:
    limits = {0: (1.0, 0.1)}
    table = rows((0, "c", "ok", 1.0, 0.1, 2.0), (0, "c", "ok", 1.0000001, 0.1, 2.0),
                 (0, "c", "ok", 1.0, 0.1000001, 2.0), (0, "c", "ok", None, None, 2.0),
                 (0, "c", "cut", 1.0, None, 5.0), (0, "c", "cut", 1.0000001, None, 5.0),
                 (0, "c", "cut", 0.5, None, 5.0),  # answered in time, cut while streaming
                 (0, "c", "cut", None, None, 1.0), (0, "c", "cut", None, None, 1.0000001),
                 (0, "c", "error", None, None, 0.1), (0, "c", "dropped", None, None, None))
    assert [_slow(table, i, limits) for i in range(len(table))] == [
        False, True, True, False, False, True, False, None, True, True, True]


def test_the_slow_thresholds_per_class_and_pooled() -> None:
    records = [(-5.0, "own", "ok", 50.0, 5.0, 60.0),  # before the load
               (10.0, "own", "cut", 40.0, None, 45.0),  # cut: not an answer
               (10.0, "few", "ok", None, None, 1.0)]  # answered, no timings
    records += [(15.0, "own", "ok", 1.5, None, 2.0)]  # one token: no time per token
    records += [(20.0 + i, "own", "ok", 1.0 + i / 100, 0.01 * (i + 1), 2.0) for i in range(19)]
    records += [(2000.0, "own", "ok", 99.0, 9.0, 100.0)]  # the second third
    records += [(30.0 + i, "few", "ok", 2.0 + i / 100, 0.5, 3.0) for i in range(19)]
    table = rows(*records)
    found = _slow_thresholds(table, SPAN)
    own_ttfts = [1.5] + [1.0 + i / 100 for i in range(19)]
    own = (percentile(own_ttfts, 0.9), percentile([0.01 * (i + 1) for i in range(19)], 0.9))
    pooled = (percentile(own_ttfts + [2.0 + i / 100 for i in range(19)], 0.9),
              percentile([0.01 * (i + 1) for i in range(19)] + [0.5] * 19, 0.9))
    assert found == {0: own, 1: pooled}  # exactly 20 answers: its own; 19: the pooled
    assert pooled[0] > own[0] and pooled[1] > own[1]
    none = rows((10.0, "c", "error", None, None, 1.0), (2000.0, "c", "ok", 1.0, 0.1, 2.0))
    assert _slow_thresholds(none, SPAN) == {0: (math.inf, math.inf)}


def test_the_thirds_quantiles_of_answers_in_the_load() -> None:
    table = rows((-5.0, "c", "ok", 1.0, 0.1, 50.0),  # before the load
                 (10.0, "c", "error", None, None, 70.0),  # failed, with a time
                 (10.0, "c", "ok", 1.0, 0.1, None),
                 (20.0, "c", "ok", 1.0, 0.1, 2.0), (30.0, "c", "ok", 1.0, 0.1, 4.0),
                 (1500.0, "c", "ok", 1.0, 0.1, 9.0),
                 (3000.0, "c", "ok", 1.0, 0.1, 10.0))
    assert _thirds_quantiles(table, table.total, SPAN) == {
        "first": {"p50": 3.0, "p90": 3.8, "p99": 3.98},
        "last": {"p50": 10.0, "p90": 10.0, "p99": 10.0}}


def test_judge_latency_counts_requests_in_the_load_only() -> None:
    records = [(-1.0, "c", "ok", 9.0, 0.9, 10.0)]  # before the load: not compared
    records += [(40.0 * i, "c", "ok", 1.0 + (i % 10) / 10, 0.01 * (1 + i % 10),
                 2.0 + (i % 10) / 10) for i in range(90)]
    records += [(3601.0, "c", "ok", 9.0, 0.9, 10.0)]
    criterion = judge_latency(rows(*records), SPAN)
    assert criterion.figures["compared"] == {"first": 30, "last": 30}
    assert criterion.figures["slow_thresholds"] == {"c": {"ttft_s": 1.81, "tpot_s": 0.091}}
    assert criterion.figures["tpot_s"]["first"] == {"p50": 0.055, "p90": 0.091, "p99": 0.1}
    assert criterion.figures["total_s"]["last"] == {"p50": 2.45, "p90": 2.81, "p99": 2.9}
    assert criterion.figures["ttft_s"]["first"] == {"p50": 1.45, "p90": 1.81, "p99": 1.9}


INF = math.inf


def test_the_histogram_deltas_between_scrapes_in_the_load() -> None:
    series = [(-120.0, [(1.0, 0.0), (INF, 0.0)]),
              (-60.0, [(1.0, 1.0), (INF, 2.0)]),  # before the load
              (0.0, [(1.0, 5.0), (INF, 10.0)]),
              (60.0, [(1.0, 5.0), (INF, 10.0)]),  # nothing new: left out
              (120.0, [(1.0, 6.0), (INF, 11.0)]),  # exactly one observation
              (180.0, [(1.0, 2.0), (INF, 7.0)]),  # a restart: all new
              (240.0, [(1.0, 2.0), (2.0, 3.0), (INF, 4.0)]),  # other buckets: left out
              (300.0, [(1.0, 3.0), (2.0, 3.0), (INF, 5.0)]),
              (360.0, [(1.0, 1.0), (2.0, 1.0), (INF, 4.0)]),  # a restart, fewer in all
              (3660.0, [(1.0, 9.0), (2.0, 9.0), (INF, 9.0)])]  # after the load
    assert _histogram_deltas(series, SPAN) == [
        (0.0, [(1.0, 4.0), (INF, 8.0)]), (120.0, [(1.0, 1.0), (INF, 1.0)]),
        (180.0, [(1.0, 2.0), (INF, 7.0)]), (300.0, [(1.0, 1.0), (2.0, 0.0), (INF, 1.0)]),
        (360.0, [(1.0, 1.0), (2.0, 1.0), (INF, 4.0)])]


def test_adding_buckets_by_bound() -> None:
    assert _add_buckets([[(1.0, 2.0), (INF, 3.0)], [(1.0, 1.0), (INF, 5.0)],
                         [(0.5, 1.0), (INF, 1.0)]]) == [(0.5, 1.0), (1.0, 3.0), (INF, 9.0)]


def per_scrape(slow_share: float) -> list[tuple[float, float]]:
    """One scrape's cumulative buckets in histograms(): 300 observations."""
    fast = 300 * (1 - slow_share)
    counts = (fast * 0.45, fast * 0.9, fast * 0.9, fast, 300.0)
    return list(zip((0.1, 0.5, 1.0, 5.0, INF), counts, strict=True))


def test_the_histograms_figures_from_the_first_and_last_thirds() -> None:
    def share(t: float) -> float:
        return 0.05 if t < 1200 else 0.5 if t < 2400 else 0.25
    criterion = judge_latency_histograms(histograms(lambda t: 5, share), SPAN)
    assert (criterion.name, criterion.title, criterion.state) == (
        "latency", "slow-request share not rising", "fail")
    first = [(b, 19 * c) for b, c in per_scrape(0.05)]  # scrapes at 60 ... 1140 s
    last = [(b, 21 * c) for b, c in per_scrape(0.25)]  # 2400 ... 3600 s
    figures = criterion.figures
    assert figures["ttft_s"] == {
        name: {f"p{q}": round(histogram_quantile(q / 100, b), 6) for q in (50, 90, 99)}
        for name, b in (("first", first), ("last", last))}
    assert figures["ttft_s"]["first"] != figures["ttft_s"]["last"]
    assert figures["slow_thresholds"] == {"all": {"ttft_s": 5.0}}
    assert figures["source"] == "the server's TTFT histogram"
    assert figures["compared"] == {"first": 19 * 300.0, "last": 21 * 300.0}
    assert (figures["slow_share"]["first"], figures["slow_share"]["last"]) == (0.05, 0.25)
    assert criterion.reason.startswith("rising: slow observations 5.0% in the first third, "
                                       "25.0% in the last (z ")


def test_histograms_of_the_first_third_only_are_not_judged() -> None:
    series = [(t, b) for t, b in histograms(lambda t: 5, lambda t: 0.05) if t < 1200]
    criterion = judge_latency_histograms(series, SPAN)
    assert (criterion.name, criterion.title, criterion.state) == (
        "latency", "slow-request share not rising", "not_judged")
    assert criterion.figures["ttft_s"]["last"] is None
    assert criterion.reason == (
        "too few observations to compare: 5700 in the first third, 0 in the last (needs 30 "
        "each): needs observations in every third of the load; none came in one")
    late = [(t, b) for t, b in histograms(lambda t: 5, lambda t: 0.05) if t > 1200]
    criterion = judge_latency_histograms(late, SPAN)
    assert (criterion.name, criterion.title, criterion.state, criterion.reason,
            criterion.figures) == (
        "latency", "slow-request share not rising", "not_judged",
        "the server exported no TTFT observations in the first third", {})


def test_a_scrape_without_the_slow_bound_counts_nothing_slow() -> None:
    series = histograms(lambda t: 5, lambda t: 0.05)
    regrouped = [(t, b if t < 1800 else [(0.1, b[0][1]), (1.0, b[2][1]), (INF, b[4][1])])
                 for t, b in series]  # the server's buckets changed after a restart
    criterion = judge_latency_histograms(regrouped, SPAN)
    assert criterion.figures["slow_thresholds"] == {"all": {"ttft_s": 5.0}}
    assert criterion.figures["slow_share"]["first"] == 0.05
    assert criterion.figures["slow_share"]["last"] == 0.0

"""The latency criterion on made-up runs whose answer is known: the slow share and its
boundaries, the sign test, too few requests, the histograms of a watch-only run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from kvtop.load.driver import RequestRecord
from kvtop.rehearse.criteria import WINDOWS, Criterion, Span
from kvtop.rehearse.latency import (
    Z_WATCH,
    _histogram_deltas,
    _latency_needs,
    _rising,
    _Shares,
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

"""Latency quantiles as a person reads them: PromQL's histogram_quantile on the observations of
the window, and no number at all when the buckets cannot give an honest one."""

from __future__ import annotations

import math

import pytest

from kvtop.collect.reading import Histogram
from kvtop.derive.quantiles import bucket_delta, quantile, quantiles
from kvtop.derive.rates import derive_engine_stats
from tests.scenarios.readings import reading

INF = math.inf


BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, INF)


def histogram(counts: tuple[float, ...], bounds: tuple[float, ...] = BOUNDS) -> Histogram:
    return Histogram(tuple(zip(bounds, counts, strict=True)), counts[-1], None)


def test_window_quantiles_count_only_the_new_observations() -> None:
    before = histogram((0, 0, 0, 0, 10, 20, 30, 40, 50, 50, 50, 50, 50, 50))
    # 100 new observations: 50 in (0.08, 0.1], 40 in (0.1, 0.25], 10 in (0.25, 0.5]
    now = histogram((0, 0, 0, 0, 10, 20, 30, 90, 140, 150, 150, 150, 150, 150))
    q = quantiles(now, before, "window")
    assert q is not None
    assert (q.samples, q.scope) == (100, "window")
    assert q.p50 == pytest.approx(0.1)
    assert q.p90 == pytest.approx(0.25)
    assert q.p99 == pytest.approx(0.25 + 0.25 * 9 / 10)


def test_lifetime_quantiles_without_an_earlier_scrape() -> None:
    now = histogram((0, 0, 0, 0, 10, 20, 30, 90, 140, 150, 150, 150, 150, 150))
    q = quantiles(now, None, "lifetime")
    assert q is not None and (q.samples, q.scope) == (150, "lifetime")
    assert q.p50 == pytest.approx(0.08 + 0.02 * (75 - 30) / 60)


def test_one_observation_in_the_window_is_enough() -> None:
    before = histogram((0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
    now = histogram((0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1))
    q = quantiles(now, before, "window")
    assert q is not None and q.samples == 1
    assert q.p50 == pytest.approx(0.1 + 0.15 * 0.5)  # interpolated inside (0.1, 0.25]


def test_no_observation_in_the_window_is_no_latency_not_zero() -> None:
    counts = (0, 0, 0, 0, 10, 20, 30, 40, 50, 50, 50, 50, 50, 50)
    assert quantiles(histogram(counts), histogram(counts), "window") is None
    assert quantiles(None, histogram(counts), "window") is None


def test_buckets_that_changed_layout_give_no_quantiles() -> None:
    # a server restarted with other buckets between the scrapes: subtracting them is meaningless
    before = histogram((5, 10, 10), (0.1, 1.0, INF))
    more_buckets = histogram((0, 8, 12, 12), (0.05, 0.1, 1.0, INF))
    assert bucket_delta(more_buckets, before) is None
    assert quantiles(more_buckets, before, "window") is None
    moved = histogram((6, 14, 16), (0.2, 1.0, INF))
    assert bucket_delta(moved, before) is None
    assert quantiles(moved, before, "window") is None


def test_bucket_delta_subtracts_bucket_by_bucket() -> None:
    before = histogram((5, 10, 10), (0.1, 1.0, INF))
    now = histogram((7, 15, 16), (0.1, 1.0, INF))
    assert bucket_delta(now, before) == [(0.1, 2), (1.0, 5), (INF, 6)]
    assert bucket_delta(now, None) == [(0.1, 7), (1.0, 15), (INF, 16)]


def test_buckets_without_the_inf_bucket_give_no_quantile() -> None:
    # a truncated exposition: the total count is unknown, any rank would be a guess
    assert quantile(0.5, [(0.1, 5.0), (1.0, 10.0)]) is None
    assert quantile(0.5, []) is None
    q = quantiles(Histogram(((0.1, 5.0), (1.0, 10.0)), None, None), None, "window")
    assert q is not None and (q.p50, q.p90, q.p99) == (None, None, None)


def test_rank_on_a_bucket_edge_is_that_bucket_bound_like_promql() -> None:
    # half the observations are <= 0.1 and none in (0.1, 1.0]: PromQL's p50 is 0.1
    buckets = [(0.1, 5.0), (1.0, 5.0), (INF, 10.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.1)


def test_rank_in_the_first_bucket_interpolates_from_zero() -> None:
    assert quantile(0.5, [(0.2, 10.0), (INF, 10.0)]) == pytest.approx(0.1)


def test_rank_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    assert quantile(0.99, [(0.1, 50.0), (2.5, 90.0), (INF, 100.0)]) == 2.5


def test_a_non_positive_first_bound_is_answered_as_is_like_promql() -> None:
    # PromQL returns the bound of a bucket at or below zero instead of interpolating from 0
    assert quantile(0.25, [(-1.0, 5.0), (1.0, 10.0), (INF, 10.0)]) == -1.0


def test_p50_p90_p99_are_each_their_own_quantile() -> None:
    q = quantiles(histogram((0, 0, 0, 0, 0, 10, 20, 30, 60, 90, 95, 99, 100, 100)), None, "x")
    assert q is not None
    assert q.p50 == pytest.approx(0.1 + 0.15 * 20 / 30)
    assert q.p90 == pytest.approx(0.5)
    assert q.p99 == pytest.approx(1.0)


def test_an_earlier_scrape_cut_before_its_inf_bucket_gives_no_window() -> None:
    # the buckets it has line up with the new ones, but the two are not the same histogram
    before = Histogram(((0.1, 5.0), (1.0, 9.0)), None, None)
    now = histogram((7, 15, 16), (0.1, 1.0, INF))
    assert bucket_delta(now, before) is None
    assert quantiles(now, before, "window") is None


def test_requests_slower_than_every_bucket_still_count() -> None:
    before = histogram((4, 6, 6), (0.1, 1.0, INF))
    now = histogram((4, 6, 16), (0.1, 1.0, INF))  # 10 new, all above 1.0 s
    q = quantiles(now, before, "window")
    assert q is not None and q.samples == 10
    assert (q.p50, q.p90, q.p99) == (1.0, 1.0, 1.0)  # PromQL: the highest finite bound
    only_inf = quantiles(Histogram(((INF, 3.0),), 3.0, 9.0), None, "lifetime")
    assert only_inf is not None and only_inf.samples == 3


def test_a_histogram_without_buckets_gives_no_quantiles() -> None:
    assert quantiles(Histogram((), 5.0, 1.0), None, "lifetime") is None


def test_quantile_interpolates_like_promql() -> None:
    buckets = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (INF, 40.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (20 - 10) / 20)
    assert quantile(0.25, buckets) == pytest.approx(0.1 * 10 / 10)
    assert quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * (39.6 - 30) / 10)
    assert quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None  # no observations
    assert quantile(0.99, [(0.1, 1.0), (INF, 5.0)]) == 0.1  # rank in +Inf: highest bound


def test_latency_quantiles_from_bucket_deltas() -> None:
    before = reading(ttft=Histogram(((0.1, 100.0), (1.0, 100.0), (INF, 100.0)), 100.0, 5.0))
    now = reading(ttft=Histogram(((0.1, 100.0), (1.0, 110.0), (INF, 110.0)), 110.0, 9.0))
    stats = derive_engine_stats(now, before, t=1.0, dt=1.0)
    assert stats.ttft is not None
    # only the 10 new observations count, all in (0.1, 1.0]
    assert stats.ttft.samples == 10 and stats.ttft.scope == "window"
    assert 0.1 < stats.ttft.p50 < 1.0

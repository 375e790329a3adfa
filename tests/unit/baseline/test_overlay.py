"""The live Δ overlay (kvtop/baseline/overlay.py): the last window's KV p50 and TTFT p99
against the baseline's, red (worse) or green (better) from compare's smallest change that
matters, exactly at it and a hair either side; TTFT from the window's own bucket deltas,
since the last restart in it."""

from __future__ import annotations

import pytest

from kvtop.baseline.overlay import Band, _delta, _Window
from kvtop.collect.reading import Histogram
from kvtop.derive.stats import EngineStats


def band(kv_p50: float | None = 0.40, ttft_p99: float | None = 0.5) -> Band:
    return Band("base", 0.1, kv_p50, 0.8, 1000, 4.0, 0.0, 0.3, 100.0, 10.0, 0.1, ttft_p99,
                0.01)


@pytest.mark.parametrize(("kv_now", "worse", "better"), [
    (0.44, True, False),  # +4 points: exactly 10 % of 0.40, over the 3-point floor
    (0.4399, False, False),
    (0.36, False, True),
    (0.3601, False, False),
])
def test_kv_is_marked_from_the_change_that_matters(kv_now: float, worse: bool,
                                                   better: bool) -> None:
    delta = _delta(band(), kv_now, None)
    assert (delta.kv_worse, delta.kv_better) == (worse, better)
    assert delta.kv_points == pytest.approx(kv_now - 0.40)


def test_a_small_pool_share_uses_the_floor() -> None:
    assert _delta(band(kv_p50=0.10), 0.13, None).kv_worse  # 3 points, not 10 % of 0.10
    assert not _delta(band(kv_p50=0.10), 0.1299, None).kv_worse


@pytest.mark.parametrize(("ttft_now", "worse", "better"), [
    (0.6, True, False),  # +20 % of 0.5
    (0.5999, False, False),
    (0.4, False, True),
    (0.4001, False, False),
])
def test_ttft_is_marked_from_the_change_that_matters(ttft_now: float, worse: bool,
                                                     better: bool) -> None:
    delta = _delta(band(), None, ttft_now)
    assert (delta.ttft_worse, delta.ttft_better) == (worse, better)
    assert delta.ttft_change == pytest.approx(ttft_now / 0.5 - 1)


def test_nothing_is_marked_without_both_sides() -> None:
    delta = _delta(band(kv_p50=None, ttft_p99=None), 0.9, 9.0)
    assert not (delta.kv_worse or delta.ttft_worse or delta.kv_better or delta.ttft_better)
    assert delta.kv_points is None and delta.ttft_change is None


def stats(t: float, restarted: bool = False) -> EngineStats:
    return EngineStats("m", "0", t, kv_usage=0.5, restarted=restarted)


def histogram(fast: float, slow: float) -> Histogram:
    return Histogram(((0.1, fast), (10.0, fast + slow), (float("inf"), fast + slow)),
                     fast + slow, 0.0)


def test_the_window_ttft_is_from_its_bucket_deltas_since_a_restart() -> None:
    window = _Window()
    window.add(0.0, stats(0.0), None, 600.0)  # no reading yet
    window.add(10.0, stats(10.0), _reading(histogram(0, 0)), 600.0)
    window.add(20.0, stats(20.0), _reading(histogram(100, 100)), 600.0)  # half slow
    assert window.ttft_p99() is not None and window.ttft_p99() > 1.0  # type: ignore[operator]
    window.add(30.0, stats(30.0, restarted=True), _reading(histogram(0, 0)), 600.0)
    window.add(40.0, stats(40.0), _reading(histogram(100, 0)), 600.0)  # all fast since
    assert window.ttft_p99() is not None and window.ttft_p99() <= 0.1  # type: ignore[operator]


def test_the_window_keeps_only_its_length() -> None:
    window = _Window()
    for t in range(0, 700, 100):
        window.add(float(t), stats(float(t)), None, 600.0)
    assert list(window.times) == [0.0 + 100 * i for i in range(7)]
    window.add(700.0, stats(700.0), None, 600.0)
    assert window.times[0] == 100.0


def _reading(ttft: Histogram) -> object:
    from kvtop.collect.reading import EngineReading

    return EngineReading(model="m", engine="0", ttft=ttft)

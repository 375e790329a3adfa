"""The live Δ overlay (kvtop/baseline/overlay.py): the last window's KV p50 and TTFT p99
against the baseline's, red (worse) or green (better) from compare's smallest change that
matters, exactly at it and a hair either side; TTFT from the window's own bucket deltas,
since the last restart in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtop.baseline import store
from kvtop.baseline.model import Baseline, ConfigValue, EngineSummary, Figure, TargetSummary
from kvtop.baseline.overlay import Band, BaselineOverlay, _delta, _Window, baseline_overlay
from kvtop.collect.reading import EngineReading, Histogram
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.config import ConfigError
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetTracker


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
    marks = (delta.kv_worse, delta.ttft_worse, delta.kv_better, delta.ttft_better)
    assert marks == (False, False, False, False)
    assert delta.kv_points is None and delta.ttft_change is None
    assert _delta(band(), None, None).kv_worse is False


def test_the_limit_holds_within_float_noise_and_not_a_hair_further() -> None:
    """An empty pool in the baseline: the 3-point floor. 1e-9 of the limit under it is at
    it (float noise); 1e-9 of a point under it is not."""
    assert _delta(band(kv_p50=0.0), 0.03 - 1e-9 * 0.03, None).kv_worse
    assert not _delta(band(kv_p50=0.0), 0.03 - 1e-9, None).kv_worse


def stats(t: float, restarted: bool = False) -> EngineStats:
    return EngineStats("m", "0", t, kv_usage=0.5, restarted=restarted)


def histogram(fast: float, slow: float) -> Histogram:
    return Histogram(((0.1, fast), (10.0, fast + slow), (float("inf"), fast + slow)),
                     fast + slow, 0.0)


def p99(window: _Window) -> float:
    got = window.ttft_p99()
    assert got is not None
    return got


def test_the_window_ttft_is_from_its_bucket_deltas_since_a_restart() -> None:
    """From the window's first histogram (100 slow answers, then 1000 fast: p99 slow), not
    from the server's start nor its second; since a restart, from the restart's."""
    window = _Window()
    window.add(0.0, stats(0.0), _reading(histogram(0, 0)), 600.0)
    window.add(10.0, stats(10.0), _reading(histogram(0, 100)), 600.0)
    window.add(20.0, stats(20.0), _reading(histogram(1000, 100)), 600.0)
    assert p99(window) > 1.0
    window.add(30.0, stats(30.0, restarted=True), _reading(histogram(1000, 0)), 600.0)
    assert window.ttft_p99() is None  # no answer since the restart
    window.add(40.0, stats(40.0), _reading(histogram(1100, 0)), 600.0)  # 100, all fast
    assert p99(window) <= 0.1
    started = _Window()  # the server's counts so far are not the window's answers
    started.add(0.0, stats(0.0), _reading(histogram(0, 100)), 600.0)
    started.add(10.0, stats(10.0), _reading(histogram(100, 100)), 600.0)
    assert p99(started) <= 0.1


def test_the_window_ttft_is_unknown_without_two_histograms() -> None:
    never = _Window()
    never.add(0.0, stats(0.0), _reading(None), 600.0)
    never.add(10.0, stats(10.0), _reading(None), 600.0)
    assert never.ttft_p99() is None
    lost = _Window()  # the last scrape has none: nothing to count to
    lost.add(0.0, stats(0.0), _reading(histogram(0, 0)), 600.0)
    lost.add(10.0, stats(10.0), _reading(None), 600.0)
    assert lost.ttft_p99() is None
    one = _Window()
    one.add(0.0, stats(0.0), _reading(histogram(10, 0)), 600.0)
    assert one.ttft_p99() is None
    rebucketed = _Window()
    rebucketed.add(0.0, stats(0.0), _reading(histogram(0, 0)), 600.0)
    rebucketed.add(10.0, stats(10.0), _reading(Histogram(
        ((0.1, 10.0), (1.0, 10.0), (float("inf"), 10.0)), 10.0, 0.0)), 600.0)
    assert rebucketed.ttft_p99() is None


def test_a_restart_alone_in_a_short_window() -> None:
    """A window shorter than the scrape interval holds one scrape: a restart's."""
    window = _Window()
    window.add(0.0, stats(0.0), _reading(histogram(10, 0)), 5.0)
    window.add(10.0, stats(10.0, restarted=True), _reading(histogram(1, 0)), 5.0)
    assert list(window.times) == [10.0] and list(window.restarts) == [10.0]
    assert window.ttft_p99() is None


def test_the_window_keeps_only_its_length() -> None:
    window = _Window()
    for t in range(0, 700, 100):
        window.add(float(t), stats(float(t)), None, 600.0)
    assert list(window.times) == [0.0 + 100 * i for i in range(7)]
    window.add(700.0, stats(700.0), None, 600.0)
    assert window.times[0] == 100.0


def _reading(ttft: Histogram | None) -> EngineReading:
    return EngineReading(model="m", engine="0", ttft=ttft)


# -- the overlay the app holds: baselines by target, bands, windows fed by real scrapes ----

URL, OTHER = "http://127.0.0.1:8000/metrics", "http://127.0.0.1:9000/metrics"
KEY = ("m", "0")


def engine_summary(blocks: ConfigValue = 1000) -> EngineSummary:
    """Every figure the band shows, each a value of its own."""
    figures = {"kv_usage": Figure(0.40, (), {"p5": 0.1, "p95": 0.8}),
               "running": Figure(4.0), "waiting": Figure(0.5), "hit_rate": Figure(0.3),
               "prompt_tps": Figure(100.0), "generation_tps": Figure(10.0),
               "ttft_p50": Figure(0.1), "ttft_p99": Figure(0.5), "itl_p50": Figure(0.01)}
    return EngineSummary("m", "0", config={"blocks_total": blocks}, figures=figures)


def a_baseline(name: str | None = "base", blocks: ConfigValue = 1000) -> Baseline:
    return Baseline(name, "2026-12-01T00:00:00+00:00", "0", {"kind": "live"}, 10.0, 600.0,
                    60.0, targets=[TargetSummary(URL, engines=[engine_summary(blocks)])])


def test_the_band_is_the_matched_engines_baseline() -> None:
    band = BaselineOverlay({}, a_baseline()).band(URL, KEY)
    assert band == Band("base", 0.1, 0.40, 0.8, 1000, 4.0, 0.5, 0.3, 100.0, 10.0, 0.1, 0.5,
                        0.01)


def test_a_band_without_a_name_or_a_whole_pool_says_so() -> None:
    band = BaselineOverlay({}, a_baseline(name=None, blocks=1000.5)).band(URL, KEY)
    assert band is not None and band.name == "baseline" and band.blocks_total is None


def test_no_band_for_another_model_or_a_target_without_a_baseline() -> None:
    overlay = BaselineOverlay({URL: a_baseline()})
    assert overlay.band(URL, ("other", "0")) is None
    assert overlay.band(OTHER, KEY) is None
    band = overlay.band(URL, KEY)
    assert band is not None and overlay.band(URL, KEY) is band  # made once


def test_an_engine_matches_the_baselines_engine_of_its_own_target_first() -> None:
    """A baseline of two servers of one model: each target's band is its own server's."""
    base = a_baseline()
    other = engine_summary()
    other.figures["kv_usage"] = Figure(0.7)
    base.targets.append(TargetSummary(OTHER, engines=[other]))
    overlay = BaselineOverlay({}, base)
    bands = overlay.band(URL, KEY), overlay.band(OTHER, KEY)
    assert [b.kv_p50 if b else None for b in bands] == [0.40, 0.7]


def test_a_usage_as_blocks_of_the_pool_now_else_the_baselines() -> None:
    band = BaselineOverlay({}, a_baseline()).band(URL, KEY)
    assert band is not None
    assert band.blocks(0.25) == 250.0 and band.blocks(0.25, 2000) == 500.0
    assert band.blocks(None) is None
    nameless = BaselineOverlay({}, a_baseline(blocks=None)).band(URL, KEY)
    assert nameless is not None and nameless.blocks(0.25) is None


def test_the_baseline_of_a_target_is_its_own_else_the_default() -> None:
    own, default = a_baseline("own"), a_baseline("default")
    overlay = BaselineOverlay({URL: own}, default)
    assert overlay.baseline_for(URL) is own and overlay.baseline_for(OTHER) is default
    assert BaselineOverlay({URL: own}).baseline_for(OTHER) is None
    assert bool(overlay) and bool(BaselineOverlay({URL: own}))
    assert bool(BaselineOverlay({}, default)) and not BaselineOverlay()


def test_the_app_reads_each_named_baseline_once(data_home: Path) -> None:
    store.save(a_baseline("one"), "one")
    store.save(a_baseline("two"), "two")
    assert baseline_overlay(None, {}) is None
    overlay = baseline_overlay("two", {URL: "one", OTHER: "two"})
    assert overlay is not None
    one, two = overlay.baseline_for(URL), overlay.baseline_for(OTHER)
    assert one is not None and one.name == "one"
    assert two is not None and two.name == "two"
    assert overlay.default is two  # read once, shared
    alone = baseline_overlay(None, {URL: "one"})
    assert alone is not None and alone.default is None


def test_a_baseline_that_cannot_be_read_stops_the_app_with_why(data_home: Path) -> None:
    with pytest.raises(ConfigError, match=r"^baseline: no baseline 'gone' at "):
        baseline_overlay("gone", {})


def scrape_body(usage: float, fast: float, slow: float) -> str:
    """A vLLM engine with ``fast`` answers within 0.1 s and ``slow`` between 1 and 10 s."""
    labels = 'engine="0",model_name="m"'
    ttft = "vllm:time_to_first_token_seconds"
    return "\n".join([
        f"vllm:kv_cache_usage_perc{{{labels}}} {usage}",
        f"vllm:num_requests_running{{{labels}}} 1",
        f"vllm:num_requests_waiting{{{labels}}} 0",
        f'{ttft}_bucket{{{labels},le="0.1"}} {fast}',
        f'{ttft}_bucket{{{labels},le="1.0"}} {fast}',
        f'{ttft}_bucket{{{labels},le="10.0"}} {fast + slow}',
        f'{ttft}_bucket{{{labels},le="+Inf"}} {fast + slow}',
        f"{ttft}_count{{{labels}}} {fast + slow}", f"{ttft}_sum{{{labels}}} 0.0"]) + "\n"


class Fed:
    """A target's tracker, handing each scrape it folds to the overlay, as the app does."""

    def __init__(self, overlay: BaselineOverlay, target: Target) -> None:
        self.overlay, self.target, self.tracker = overlay, target, TargetTracker(target)

    def __call__(self, t: float, body: str) -> None:
        state = self.tracker.update(read_scrape(Scrape(self.target, t, body=body)))
        self.overlay.observe(self.target.url, t, state.engines, self.tracker.readings)


def test_the_delta_is_of_the_scrapes_in_the_window() -> None:
    overlay = BaselineOverlay({}, a_baseline(), window_s=100.0)
    feed = Fed(overlay, Target.from_spec("127.0.0.1:8000"))
    assert overlay.delta(URL, KEY) is None  # nothing seen yet
    feed(0.0, scrape_body(0.90, 0, 0))  # out of the window by the end
    for i, usage in enumerate((0.40, 0.44, 0.50), start=1):
        feed(50.0 * i, scrape_body(usage, 10.0 * i, 0))
    delta = overlay.delta(URL, KEY)
    assert delta is not None
    assert delta.kv_p50 == pytest.approx(0.44) and delta.kv_worse  # +4 points of 0.40
    assert delta.ttft_p99 is not None and delta.ttft_p99 <= 0.1 and delta.ttft_better
    assert overlay.delta(URL, KEY) is delta  # drawn again: not recomputed
    feed(200.0, scrape_body(0.44, 40.0, 40.0))  # half the new ones slow
    later = overlay.delta(URL, KEY)
    assert later is not None and later is not delta
    assert later.ttft_p99 is not None and later.ttft_p99 > 1.0 and later.ttft_worse
    overlay.clear()
    assert overlay.delta(URL, KEY) is None


def test_only_a_target_with_a_baseline_keeps_a_window() -> None:
    overlay = BaselineOverlay({URL: a_baseline()})
    Fed(overlay, Target.from_spec("127.0.0.1:9000"))(0.0, scrape_body(0.4, 1, 0))
    assert overlay._windows == {}
    Fed(overlay, Target.from_spec("127.0.0.1:8000"))(0.0, scrape_body(0.4, 1, 0))
    delta = overlay.delta(URL, KEY)
    assert delta is not None and delta.kv_p50 == 0.4

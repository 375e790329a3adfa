"""Derived numbers: rates over the window, counter resets, hit rate scope, latency quantiles,
and the per-target tracker's statuses."""

from __future__ import annotations

import math

import pytest

from kvtop.collect.reading import EngineReading, Histogram
from kvtop.collect.target import Scrape, Target
from kvtop.derive.quantiles import quantile
from kvtop.derive.rates import derive_engine_stats
from kvtop.derive.tracker import TargetTracker
from tests.derived_fixtures import vllm_08_idle
from tests.paths import fixture_text

INF = math.inf


def reading(**values: object) -> EngineReading:
    r = EngineReading(model="m", engine="0")
    for name, value in values.items():
        setattr(r, name, value)
    return r


def test_rates_over_window() -> None:
    before = reading(
        prompt_tokens_total=1000.0,
        generation_tokens_total=500.0,
        preemptions_total=2.0,
        finished_total={"length": 10.0},
    )
    now = reading(
        prompt_tokens_total=1600.0,
        generation_tokens_total=800.0,
        preemptions_total=5.0,
        finished_total={"length": 13.0, "abort": 1.0},
    )
    stats = derive_engine_stats(now, before, t=10.0, dt=2.0)
    assert (stats.prompt_tps, stats.generation_tps, stats.preemptions_per_s) == (300, 150, 1.5)
    assert stats.finished_per_s == {"length": 1.5, "abort": 0.5}
    assert stats.window_s == 2.0 and not stats.restarted


def test_counter_reset_marks_restart_and_gives_no_negative_rate() -> None:
    before = reading(prompt_tokens_total=1000.0, generation_tokens_total=500.0)
    now = reading(prompt_tokens_total=20.0, generation_tokens_total=600.0)
    stats = derive_engine_stats(now, before, t=10.0, dt=1.0)
    assert stats.restarted
    assert stats.prompt_tps is None and stats.generation_tps is None


def test_hit_rate_is_windowed_then_lifetime() -> None:
    before = reading(prefix_queries_total=1000.0, prefix_hits_total=900.0)
    now = reading(prefix_queries_total=1100.0, prefix_hits_total=910.0)
    stats = derive_engine_stats(now, before, t=1.0, dt=1.0)
    assert (stats.hit_rate, stats.hit_rate_scope) == (pytest.approx(0.1), "window")
    alone = derive_engine_stats(now, None, t=1.0, dt=None)
    assert (alone.hit_rate, alone.hit_rate_scope) == (pytest.approx(910 / 1100), "lifetime")
    idle = derive_engine_stats(now, now, t=2.0, dt=1.0)  # no queries in the window
    assert idle.hit_rate_scope == "lifetime"


def test_hit_rate_null_when_caching_disabled() -> None:
    now = reading(prefix_queries_total=0.0, prefix_hits_total=0.0, prefix_caching=False)
    assert derive_engine_stats(now, None, t=1.0, dt=None).hit_rate is None


def test_blocks_used_from_usage_and_capacity() -> None:
    stats = derive_engine_stats(
        reading(kv_usage=0.25, blocks_total=400, tokens_total=6400), None, t=0.0, dt=None
    )
    assert stats.blocks_used == 100 and stats.tokens_used == 1600


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


TARGET = Target.from_spec("127.0.0.1:8000")


def test_tracker_stale_then_down() -> None:
    tracker = TargetTracker(TARGET, stale_after_s=30)
    body = fixture_text("vllm-0.33.0-v1-twin-under-load.txt")
    assert tracker.update(Scrape(TARGET, 100.0, body=body)).status == "up"
    state = tracker.update(Scrape(TARGET, 110.0, failure="timeout", error="timed out"))
    assert state.status == "stale" and state.engines and state.error == "timed out"
    assert state.age_s(115.0) == 15.0
    state = tracker.update(Scrape(TARGET, 140.0, failure="timeout", error="timed out"))
    assert state.status == "timeout" and state.engines == []


def test_tracker_ignores_a_late_older_scrape() -> None:
    tracker = TargetTracker(TARGET)
    idle = fixture_text("vllm-0.33.0-v1-twin-idle.txt")
    load = fixture_text("vllm-0.33.0-v1-twin-under-load.txt")
    tracker.update(Scrape(TARGET, 200.0, body=idle))
    state = tracker.update(Scrape(TARGET, 190.0, body=load))
    assert state.engines[0].running == 0  # the newer scrape stays on screen


def test_tracker_marks_restart_between_scrapes() -> None:
    tracker = TargetTracker(TARGET)
    tracker.update(Scrape(TARGET, 1.0, body=fixture_text("vllm-0.33.0-v1-twin-idle.txt")))
    state = tracker.update(
        Scrape(TARGET, 2.0, body=fixture_text("vllm-0.33.0-v1-twin-under-load.txt"))
    )
    assert state.restarted_at == 2.0 and state.engines[0].restarted
    assert state.engines[0].prompt_tps is None
    assert len(tracker.history[("twin-llama", "0")]) == 2


def test_an_inferred_version_is_never_read_back_as_exact() -> None:
    # "0.7+" read as exactly 0.7.0 once dropped the null block from the second scrape on
    tracker = TargetTracker(Target.from_spec("127.0.0.1:8000"))
    body = vllm_08_idle()
    for t in (1.0, 2.0, 3.0):
        state = tracker.update(Scrape(tracker.state.target, t, body=body))
        (engine,) = state.engines
        assert (engine.blocks_total, engine.idle_floor_blocks) == (600, 1), t
        assert (state.version, state.version_inferred) == ("0.7+", True)
    # the server's own /version wins, and is exact: 0.8.2 had no null block
    state = tracker.update(Scrape(tracker.state.target, 4.0, body=body, version="0.8.2"))
    assert (state.version, state.version_inferred) == ("0.8.2", False)
    assert state.engines[0].idle_floor_blocks == 0

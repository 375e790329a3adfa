"""Reuse by source and tier, residency and the waiting reasons, from two readings: shares
of the window's prompt tokens (of the server's life without a window), residency "off" or
unknown told apart from none evicted, and nothing made 0 by a family the server lacks."""

from __future__ import annotations

import math

import pytest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.reading import EngineReading, Histogram
from kvtop.derive.cache import mean_prompt, residency, reuse
from kvtop.derive.rates import derive_engine_stats
from kvtop.derive.stats import Quantiles, Residency, Reuse
from tests.scenarios.readings import only, reading
from tests.support.paths import fixture_text

INF = math.inf
SERVED = "vllm-0.33.0-v1-twin-served-kv-cache-metrics.txt"


def by_source(computed: float, hit: float, external: float = 0.0) -> dict[str, float]:
    return {"local_compute": computed, "local_cache_hit": hit, "external_kv_transfer": external}


def test_window_shares_are_of_the_prompt_tokens_between_the_readings() -> None:
    before = reading(prompt_tokens_by_source_total=by_source(1000, 500),
                     cached_tokens_by_tier_total={"device": 500.0, "host": 0.0})
    now = reading(prompt_tokens_by_source_total=by_source(1300, 1100, 200),
                  cached_tokens_by_tier_total={"device": 900.0, "host": 400.0})
    got = reuse(now, before)
    assert got is not None and got.scope == "window" and got.prompt_tokens == 1100
    assert got.by_source == pytest.approx({"local_compute": 300 / 1100,
                                           "local_cache_hit": 600 / 1100,
                                           "external_kv_transfer": 200 / 1100})
    assert got.cached_by_tier == pytest.approx({"device": 400 / 1100, "host": 400 / 1100})
    assert got.reuse_share == pytest.approx(800 / 1100)


def test_without_a_window_the_shares_are_since_the_server_started() -> None:
    served = only(read_exposition(fixture_text(SERVED), version="0.33.0"))
    got = reuse(served, None)
    # local_compute 37178 + local_cache_hit 28160 = 65338 prompt tokens (the fixture)
    assert got is not None and got.scope == "lifetime" and got.prompt_tokens == 65338
    assert got.reuse_share == pytest.approx(28160 / 65338)
    assert got.external_hit_rate is None  # a connector asked nothing: no rate, not 0


def test_a_window_with_no_prompt_falls_back_to_the_lifetime_shares() -> None:
    same = reading(prompt_tokens_by_source_total=by_source(100, 300))
    got = reuse(same, same)
    assert got is not None and got.scope == "lifetime" and got.reuse_share == 0.75


def test_reuse_from_computed_kv_when_sources_are_not_exported() -> None:
    """vLLM 0.13-0.15: request_prefill_kv_computed_tokens without prompt_tokens_by_source."""
    lengths = Histogram(((INF, 4.0),), 4.0, 400.0)
    computed = Histogram(((INF, 4.0),), 4.0, 100.0)
    got = reuse(reading(prompt_lengths=lengths, kv_computed=computed), None)
    assert got is not None and got.by_source is None and got.reuse_share == 0.75


def test_no_source_family_is_no_reuse_not_zero() -> None:
    assert reuse(reading(prompt_tokens_total=500.0), None) is None


def test_the_external_hit_rate_is_over_the_window() -> None:
    before = reading(prompt_tokens_by_source_total=by_source(10, 0),
                     external_queries_total=100.0, external_hits_total=10.0)
    now = reading(prompt_tokens_by_source_total=by_source(20, 0),
                  external_queries_total=200.0, external_hits_total=70.0)
    got = reuse(now, before)
    assert got is not None and got.external_hit_rate == 0.6


def lifetime(counts: tuple[float, ...]) -> Histogram:
    bounds = (1.0, 10.0, INF)
    return Histogram(tuple(zip(bounds, counts, strict=True)), counts[-1], 0.0)


def test_residency_quantiles_are_of_the_blocks_evicted_in_the_window() -> None:
    before = reading(residency="on", block_lifetime=lifetime((10, 10, 10)))
    now = reading(residency="on", block_lifetime=lifetime((10, 30, 30)))
    got = residency(now, before)
    assert got is not None and got.lifetime is not None
    assert got.lifetime.scope == "window" and got.lifetime.samples == 20
    assert 1.0 < got.lifetime.p50 <= 10.0  # all 20 of the window sat in (1, 10]


def test_a_window_that_evicted_nothing_shows_the_lifetime_quantiles() -> None:
    same = reading(residency="on", block_lifetime=lifetime((10, 10, 10)))
    got = residency(same, same)
    assert got is not None and got.lifetime is not None and got.lifetime.scope == "lifetime"
    assert got.idle is None  # not exported at all: none


@pytest.mark.parametrize("state", ["off", None])
def test_residency_off_or_unknown_is_not_an_empty_histogram(state: str | None) -> None:
    got = residency(reading(residency=state), None)
    if state is None:
        assert got is None
    else:
        assert got is not None and got.state == "off" and got.lifetime is None


def test_the_mean_prompt_is_over_the_window_else_since_start() -> None:
    before = reading(prompt_lengths=Histogram((), 10.0, 1000.0))
    now = reading(prompt_lengths=Histogram((), 12.0, 5000.0))
    assert mean_prompt(now, before) == 2000.0
    assert mean_prompt(now, now) == pytest.approx(5000 / 12)  # no prompt in the window
    assert mean_prompt(reading(), None) is None


def test_the_stats_carry_reasons_and_rates_of_rejections_and_evictions() -> None:
    before = reading(admission_rejections_total={"max_num_queued_reqs": 2.0},
                     evicted_tokens_total=100.0)
    now = reading(waiting_by_reason={"capacity": 3.0, "deferred": 1.0},
                  kv_fetch_by_stage={"in_progress": 1.0}, sleep_state="awake",
                  admission_rejections_total={"max_num_queued_reqs": 12.0},
                  evicted_tokens_total=400.0)
    stats = derive_engine_stats(now, before, t=10.0, dt=5.0)
    assert stats.waiting_by_reason == {"capacity": 3.0, "deferred": 1.0}
    assert stats.kv_fetch_by_stage == {"in_progress": 1.0} and stats.sleep_state == "awake"
    assert stats.admission_rejections_per_s == {"max_num_queued_reqs": 2.0}
    assert stats.evicted_tokens_per_s == 60.0
    first = derive_engine_stats(now, None, t=10.0, dt=None)
    assert first.admission_rejections_per_s is None and first.evicted_tokens_per_s is None


def test_a_source_first_seen_in_the_window_counts_whole() -> None:
    before = reading(prompt_tokens_by_source_total={"local_compute": 1000.0,
                                                    "local_cache_hit": 500.0})
    now = reading(prompt_tokens_by_source_total=by_source(1300, 1100, 200))
    assert reuse(now, before) == Reuse(
        "window", 1100.0, {"local_compute": 300 / 1100, "local_cache_hit": 600 / 1100,
                           "external_kv_transfer": 200 / 1100}, None, 1 - 300 / 1100, None)


def test_families_the_earlier_reading_lacks_give_the_lifetime_shares() -> None:
    """A window needs both ends: what started being exported since is read since start."""
    now = reading(prompt_tokens_by_source_total=by_source(300, 100),
                  prompt_tokens_total=400.0, prompt_lengths=Histogram((), 4.0, 400.0))
    assert reuse(now, reading()) == Reuse(
        "lifetime", 400.0, {"local_compute": 0.75, "local_cache_hit": 0.25,
                            "external_kv_transfer": 0.0}, None, 0.25, None)


def test_a_prompt_histogram_gone_since_the_earlier_reading_leaves_the_counter() -> None:
    before = reading(prompt_lengths=Histogram((), 4.0, 400.0), prompt_tokens_total=400.0,
                     cached_tokens_by_tier_total={"device": 0.0})
    now = reading(prompt_tokens_total=1400.0, cached_tokens_by_tier_total={"device": 100.0})
    assert reuse(now, before) == Reuse("window", 1000.0, None, {"device": 0.1}, None, None)


def test_a_prompt_histogram_without_its_sum_leaves_the_counter() -> None:
    before = reading(prompt_lengths=Histogram((), 4.0, 400.0), prompt_tokens_total=400.0,
                     kv_computed=Histogram((), 4.0, 100.0))
    now = reading(prompt_lengths=Histogram((), 8.0, None), prompt_tokens_total=800.0,
                  kv_computed=Histogram((), 8.0, 300.0))
    assert reuse(now, before) == Reuse("window", 400.0, None, None, 0.5, None)


def test_window_prompts_from_the_prompt_histogram_without_a_counter() -> None:
    before = reading(prompt_lengths=Histogram((), 4.0, 400.0),
                     kv_computed=Histogram((), 4.0, 100.0))
    now = reading(prompt_lengths=Histogram((), 8.0, 1000.0),
                  kv_computed=Histogram((), 8.0, 250.0))
    assert reuse(now, before) == Reuse("window", 600.0, None, None, 0.75, None)


def test_a_window_without_prompts_in_the_histogram_falls_back_to_the_lifetime() -> None:
    same = reading(prompt_lengths=Histogram((), 4.0, 400.0),
                   kv_computed=Histogram((), 4.0, 100.0))
    assert reuse(same, same) == Reuse("lifetime", 400.0, None, None, 0.75, None)


def test_tiers_and_the_prompt_counter_alone_give_shares_and_no_reuse_share() -> None:
    """No computed count: how much was not computed is unknown, not 0 or 1."""
    now = reading(prompt_tokens_total=1000.0,
                  cached_tokens_by_tier_total={"device": 300.0, "host": 100.0})
    assert reuse(now, None) == Reuse("lifetime", 1000.0, None, {"device": 0.3, "host": 0.1},
                                     None, None)


def test_a_family_without_any_prompt_count_is_no_reuse() -> None:
    assert reuse(reading(cached_tokens_by_tier_total={"device": 0.0}), None) is None


@pytest.mark.parametrize("computed, expected", [
    (0.0, None),
    (1.0, Reuse("lifetime", 1.0, {"local_compute": 1.0, "local_cache_hit": 0.0,
                                  "external_kv_transfer": 0.0}, None, 0.0, None))])
def test_one_prompt_token_has_shares_none_has_no_reuse(computed: float,
                                                       expected: Reuse | None) -> None:
    assert reuse(reading(prompt_tokens_by_source_total=by_source(computed, 0)), None) == expected


def test_residency_reads_all_three_histograms_each_over_the_window_where_it_can() -> None:
    before = reading(residency="on", block_lifetime=lifetime((10, 10, 10)),
                     block_idle=lifetime((5, 5, 5)), block_reuse_gap=lifetime((0, 2, 2)))
    now = reading(residency="on", block_lifetime=lifetime((10, 30, 30)),
                  block_idle=lifetime((25, 25, 25)), block_reuse_gap=lifetime((0, 2, 2)))
    assert residency(now, before) == Residency(
        "on", Quantiles(5.5, 9.1, 9.91, 20, "window"), Quantiles(0.5, 0.9, 0.99, 20, "window"),
        Quantiles(5.5, 9.1, 9.91, 2, "lifetime"))  # no reuse gap ended in the window


@pytest.mark.parametrize("before", [None, reading(residency="on")])
def test_residency_without_an_earlier_histogram_is_since_start(
        before: EngineReading | None) -> None:
    now = reading(residency="on", block_lifetime=lifetime((0, 2, 2)))
    assert residency(now, before) == Residency(
        "on", Quantiles(5.5, 9.1, 9.91, 2, "lifetime"))


def test_the_mean_prompt_since_start_needs_a_prompt() -> None:
    assert mean_prompt(reading(prompt_lengths=Histogram((), 4.0, 1000.0)), None) == 250.0
    assert mean_prompt(reading(prompt_lengths=Histogram((), 0.0, 0.0)), None) is None


def test_the_stats_carry_reuse_residency_and_mean_prompt_over_the_window() -> None:
    before = reading(prompt_tokens_by_source_total=by_source(100, 0),
                     prompt_lengths=Histogram((), 1.0, 100.0),
                     residency="on", block_lifetime=lifetime((10, 10, 10)))
    now = reading(prompt_tokens_by_source_total=by_source(400, 300),
                  prompt_lengths=Histogram((), 3.0, 700.0),
                  residency="on", block_lifetime=lifetime((10, 30, 30)))
    stats = derive_engine_stats(now, before, t=10.0, dt=5.0)
    assert stats.reuse == Reuse("window", 600.0, {"local_compute": 0.5, "local_cache_hit": 0.5,
                                                  "external_kv_transfer": 0.0}, None, 0.5, None)
    assert stats.residency == Residency("on", Quantiles(5.5, 9.1, 9.91, 20, "window"))
    assert stats.mean_prompt_tokens == 300.0


@pytest.mark.parametrize("dt, evicted_per_s, rejected_per_s", [
    (0.5, 600.0, {"queue": 2.0}), (0.0, None, None), (-1.0, None, None), (None, None, None)])
def test_eviction_rates_need_a_window_of_positive_length(
        dt: float | None, evicted_per_s: float | None,
        rejected_per_s: dict[str, float] | None) -> None:
    before = reading(evicted_tokens_total=100.0, admission_rejections_total={"queue": 1.0})
    now = reading(evicted_tokens_total=400.0, admission_rejections_total={"queue": 2.0})
    stats = derive_engine_stats(now, before, t=10.0, dt=dt)
    assert stats.evicted_tokens_per_s == evicted_per_s
    assert stats.admission_rejections_per_s == rejected_per_s

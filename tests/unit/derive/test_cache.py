"""Reuse by source and tier, residency and the waiting reasons, from two readings: shares
of the window's prompt tokens (of the server's life without a window), residency "off" or
unknown told apart from none evicted, and nothing made 0 by a family the server lacks."""

from __future__ import annotations

import math

import pytest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.reading import Histogram
from kvtop.derive.cache import mean_prompt, residency, reuse
from kvtop.derive.rates import derive_engine_stats
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

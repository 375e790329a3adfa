"""The simulated engine's histograms: vLLM's bucket bounds, Prometheus's cumulative counts."""

from __future__ import annotations

import math

import pytest

from kvtop.collect.exposition import parse
from kvtop.sim.stats import FINISH_REASONS, EngineStats, Histogram, buckets_1_2_5
from tests.support.paths import LOAD, fixture_text

SERVED = "vllm-0.33.0-v1-twin-served-kv-cache-metrics.txt"


def real_bounds(fixture: str, name: str) -> tuple[float, ...]:
    """The finite `le` bounds of one vLLM histogram in a real scrape, in order."""
    les = [s.labels["le"] for s in parse(fixture_text(fixture)).series(f"vllm:{name}_bucket")]
    assert les[-1] == "+Inf"
    return tuple(float(le) for le in les[:-1])


def test_token_buckets_are_vllms_1_2_5_series_up_to_and_including_the_longest_prompt() -> None:
    # The twin's token histograms end at 2000: any max_model_len from 2000 to 4999 gives them
    real = real_bounds(LOAD, "request_prompt_tokens")
    assert real == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
    assert buckets_1_2_5(2000) == real  # a bound equal to the longest prompt is kept
    assert buckets_1_2_5(1999) == real[:-1]
    assert buckets_1_2_5(4999) == real
    assert buckets_1_2_5(5000) == (*real, 5000)
    assert buckets_1_2_5(1) == (1,)
    assert buckets_1_2_5(0) == ()


@pytest.mark.parametrize(("fixture", "name"), [
    (LOAD, "request_prompt_tokens"), (LOAD, "request_generation_tokens"),
    (LOAD, "iteration_tokens_total"), (LOAD, "request_max_num_generation_tokens"),
    (LOAD, "request_params_n"), (LOAD, "request_params_max_tokens"),
    (LOAD, "time_to_first_token_seconds"), (LOAD, "inter_token_latency_seconds"),
    (LOAD, "request_time_per_output_token_seconds"), (LOAD, "e2e_request_latency_seconds"),
    (LOAD, "request_queue_time_seconds"), (LOAD, "request_inference_time_seconds"),
    (LOAD, "request_prefill_time_seconds"), (LOAD, "request_decode_time_seconds"),
    (LOAD, "request_num_preemptions"), (LOAD, "request_prefill_kv_computed_tokens"),
    (SERVED, "kv_block_lifetime_seconds"), (SERVED, "kv_block_idle_before_evict_seconds"),
    (SERVED, "kv_block_reuse_gap_seconds"),
])
def test_every_histogram_has_the_bounds_of_the_real_vllm_0_33(fixture: str, name: str) -> None:
    stats = EngineStats(max_model_len=4096)  # the twin's
    assert stats.hist[name].bounds == real_bounds(fixture, name)


def test_the_engine_has_exactly_the_vllm_histograms_of_vllm_0_33_and_counts_nothing_yet() -> None:
    stats = EngineStats(max_model_len=4096)
    names = {family.removeprefix("vllm:") for fixture in (LOAD, SERVED)
             for family, kind in parse(fixture_text(fixture)).types.items()
             if kind == "histogram" and family.startswith("vllm:")}
    assert set(stats.hist) == names
    assert all(h.count == 0 and h.sum == 0.0 for h in stats.hist.values())
    assert stats.finished == dict.fromkeys(FINISH_REASONS, 0)
    counters = {name: value for name, value in vars(stats).items()
                if name not in ("max_model_len", "finished", "hist")}
    assert counters == {
        "prompt_tokens": 0, "prompt_tokens_cached": 0, "generation_tokens": 0,
        "prefix_queries": 0, "prefix_hits": 0, "prefix_query_blocks": 0,
        "prefix_hit_blocks": 0, "preemptions": 0, "last_batch_hit_rate": 0.0,
        "last_gen_throughput": 0.0}


def test_an_observation_at_a_bound_counts_under_it_and_a_hair_above_under_the_next() -> None:
    hist = Histogram((1, 2))
    for value in (1.0, math.nextafter(1.0, 2.0), 2.0, 2.5, 0.0):
        hist.observe(value)
    assert hist.counts == [2, 2, 1]
    assert hist.cumulative() == [(1.0, 2), (2.0, 4), (math.inf, 5)]
    assert (hist.count, hist.sum) == (5, 1.0 + math.nextafter(1.0, 2.0) + 2.0 + 2.5)


def test_an_empty_histogram_is_its_bounds_and_inf_all_at_zero() -> None:
    assert Histogram((0.5,)).cumulative() == [(0.5, 0), (math.inf, 0)]
    assert Histogram(()).cumulative() == [(math.inf, 0)]


def test_engine_stats_observe_feeds_the_named_histogram_only() -> None:
    stats = EngineStats(max_model_len=100)
    stats.observe("request_prompt_tokens", 100)
    prompt = stats.hist["request_prompt_tokens"]
    assert prompt.cumulative()[-2:] == [(100.0, 1), (math.inf, 1)]
    assert prompt.cumulative()[-3] == (50.0, 0)
    assert sum(h.count for h in stats.hist.values()) == 1

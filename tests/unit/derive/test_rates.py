"""What a person reads for one engine from two readings: the gauges as sent, rates that are
never negative or invented, restarts told apart from idle windows, and hit rates of the right
scope."""

from __future__ import annotations

import math

import pytest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.reading import Histogram, LoraInfo
from kvtop.derive.rates import derive_engine_stats
from kvtop.derive.stats import EngineStats
from tests.scenarios.readings import reading

INF = math.inf


def test_every_gauge_is_shown_as_the_server_sent_it() -> None:
    sent = dict(
        model="llama", engine="3", kv_usage=0.25, blocks_total=400, block_size=16,
        tokens_total=6400, running=5.0, waiting=7.0, swapped=2.0, preemptions_total=11.0,
        prefix_queries_total=1000.0, prefix_hits_total=300.0, idle_floor_blocks=1,
        prefix_caching=True, cache_config={"block_size": "16"}, prefix_unit="tokens",
        cpu_kv_usage=0.125, idle_floor_exact=False,  # a floor inferred, never shown as exact
        lora=LoraInfo(max_lora=2, running=("sql-adapter",), waiting=("chat-adapter",)),
    )
    stats = derive_engine_stats(reading(**sent), None, t=42.0, dt=None)
    assert {name: getattr(stats, name) for name in sent} == sent
    assert stats.t == 42.0


def test_prefix_lookups_per_second_are_over_the_window() -> None:
    """The lookups a second weigh each engine's hit rate in the fleet's: 600 in 10 s."""
    stats = derive_engine_stats(reading(prefix_queries_total=1600.0, prefix_hits_total=500.0),
                                reading(prefix_queries_total=1000.0, prefix_hits_total=200.0),
                                t=10.0, dt=10.0)
    assert stats.prefix_queries_per_s == 60.0


def test_an_idle_window_is_zero_per_second_not_a_restart() -> None:
    counters = dict(prompt_tokens_total=500.0, generation_tokens_total=80.0,
                    preemptions_total=3.0, prefix_queries_total=10.0, prefix_hits_total=4.0,
                    finished_total={"stop": 2.0},
                    ttft=Histogram(((0.1, 2.0), (INF, 2.0)), 2.0, 0.1))
    stats = derive_engine_stats(reading(**counters), reading(**counters), t=2.0, dt=2.0)
    assert not stats.restarted
    assert (stats.prompt_tps, stats.generation_tps, stats.preemptions_per_s) == (0.0, 0.0, 0.0)
    assert stats.finished_per_s == {"stop": 0.0}


@pytest.mark.parametrize("before, now", [
    # only the finished counters are exported, and they went down
    (dict(finished_total={"stop": 50.0}), dict(finished_total={"stop": 3.0})),
    # only a latency histogram is exported, and its count went down
    (dict(ttft=Histogram(((0.1, 40.0), (INF, 40.0)), 40.0, 2.0)),
     dict(ttft=Histogram(((0.1, 1.0), (INF, 1.0)), 1.0, 0.05))),
    (dict(e2e=Histogram(((1.0, 9.0), (INF, 9.0)), 9.0, 4.0)),
     dict(e2e=Histogram(((1.0, 2.0), (INF, 2.0)), 2.0, 1.0))),
])
def test_any_counter_going_down_is_a_restart(before: dict, now: dict) -> None:
    stats = derive_engine_stats(reading(**now), reading(**before), t=5.0, dt=1.0)
    assert stats.restarted
    assert stats.finished_per_s == {} and stats.window_s is None


def test_a_counter_that_stops_being_sent_is_unknown_not_a_restart() -> None:
    before = reading(prompt_tokens_total=100.0, finished_total={"stop": 9.0},
                     ttft=Histogram(((0.1, 9.0), (INF, 9.0)), 9.0, 0.5))
    now = reading(prompt_tokens_total=160.0)
    stats = derive_engine_stats(now, before, t=5.0, dt=2.0)
    assert not stats.restarted
    assert stats.prompt_tps == 30.0 and stats.ttft is None


def test_a_counter_that_starts_being_sent_has_no_rate_yet() -> None:
    before = reading(prompt_tokens_total=100.0)
    now = reading(prompt_tokens_total=160.0, generation_tokens_total=40.0, preemptions_total=1.0)
    stats = derive_engine_stats(now, before, t=5.0, dt=2.0)
    assert not stats.restarted
    assert stats.prompt_tps == 30.0
    assert stats.generation_tps is None and stats.preemptions_per_s is None


def test_a_restart_other_counters_hide_never_gives_a_negative_rate() -> None:
    # The server restarted and did more work since than before: every summed counter is higher,
    # but one finish reason's count is lower. That reason's rate is 0, never negative.
    before = reading(prompt_tokens_total=100.0, finished_total={"stop": 10.0, "length": 0.0})
    now = reading(prompt_tokens_total=900.0, finished_total={"stop": 4.0, "length": 30.0})
    stats = derive_engine_stats(now, before, t=5.0, dt=2.0)
    assert stats.finished_per_s == {"stop": 0.0, "length": 15.0}


def test_two_scrapes_at_the_same_instant_give_no_rates_and_no_error() -> None:
    histogram = Histogram(((0.1, 4.0), (1.0, 8.0), (INF, 8.0)), 8.0, 3.0)
    before = reading(prompt_tokens_total=100.0, ttft=histogram)
    now = reading(prompt_tokens_total=160.0, ttft=histogram)
    stats = derive_engine_stats(now, before, t=5.0, dt=0.0)
    assert stats.prompt_tps is None and stats.window_s is None
    assert stats.ttft is not None and stats.ttft.scope == "lifetime"


def test_first_scrape_latency_is_the_lifetime_estimate() -> None:
    now = reading(ttft=Histogram(((0.1, 10.0), (0.5, 30.0), (INF, 40.0)), 40.0, 9.0),
                  itl=Histogram(((0.01, 5.0), (INF, 5.0)), 5.0, 0.02))
    stats = derive_engine_stats(now, None, t=1.0, dt=None)
    assert stats.ttft is not None and stats.itl is not None and stats.e2e is None
    assert (stats.ttft.scope, stats.ttft.samples) == ("lifetime", 40.0)
    assert stats.ttft.p50 == pytest.approx(0.1 + 0.4 * (20 - 10) / 20)
    assert stats.itl.p50 == pytest.approx(0.005)


def test_usage_without_capacity_gives_no_block_count() -> None:
    stats = derive_engine_stats(reading(kv_usage=0.5), None, t=0.0, dt=None)
    assert stats.blocks_used is None and stats.tokens_used is None
    stats = derive_engine_stats(reading(blocks_total=100), None, t=0.0, dt=None)
    assert stats.blocks_used is None


def test_tokens_the_server_counts_itself_win_over_an_estimate() -> None:
    # SGLang reports tokens in use directly; the usage fraction is rounded and must not win
    now = reading(tokens_used=1234.0, kv_usage=0.3, tokens_total=4000, blocks_total=4000)
    assert derive_engine_stats(now, None, t=0.0, dt=None).tokens_used == 1234.0
    now = reading(tokens_used=1234.0)
    assert derive_engine_stats(now, None, t=0.0, dt=None).tokens_used == 1234.0


def test_hit_rate_is_not_shown_when_prefix_caching_is_off() -> None:
    # a server with caching off still counts queries; 0 % hits would read as a cold cache
    before = reading(prefix_caching=False, prefix_queries_total=100.0, prefix_hits_total=0.0)
    now = reading(prefix_caching=False, prefix_queries_total=180.0, prefix_hits_total=0.0)
    stats = derive_engine_stats(now, before, t=1.0, dt=1.0)
    assert (stats.hit_rate, stats.hit_rate_scope) == (None, None)


def test_hit_rate_is_shown_when_prefix_caching_is_on() -> None:
    before = reading(prefix_caching=True, prefix_queries_total=100.0, prefix_hits_total=10.0)
    now = reading(prefix_caching=True, prefix_queries_total=180.0, prefix_hits_total=70.0)
    stats = derive_engine_stats(now, before, t=1.0, dt=1.0)
    assert (stats.hit_rate, stats.hit_rate_scope) == (pytest.approx(0.75), "window")


def test_one_query_in_the_window_is_enough_for_a_window_hit_rate() -> None:
    before = reading(prefix_queries_total=100.0, prefix_hits_total=10.0)
    now = reading(prefix_queries_total=101.0, prefix_hits_total=11.0)
    stats = derive_engine_stats(now, before, t=1.0, dt=1.0)
    assert (stats.hit_rate, stats.hit_rate_scope) == (1.0, "window")


def test_a_server_that_never_had_a_query_has_no_hit_rate() -> None:
    now = reading(prefix_queries_total=0.0, prefix_hits_total=0.0)
    stats = derive_engine_stats(now, None, t=1.0, dt=None)
    assert (stats.hit_rate, stats.hit_rate_scope) == (None, None)


def test_hit_rate_the_server_reports_is_used_when_it_has_no_counters() -> None:
    stats = derive_engine_stats(reading(reported_hit_rate=0.4), None, t=1.0, dt=None)
    assert (stats.hit_rate, stats.hit_rate_scope) == (0.4, "reported")


def test_no_prefix_data_at_all_means_no_hit_rate_and_no_scope() -> None:
    stats = derive_engine_stats(reading(), None, t=1.0, dt=None)
    assert (stats.hit_rate, stats.hit_rate_scope) == (None, None)


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


T0M = 1_700_000_040.0  # on a minute: buckets start with the series


LABELS = '{model_name="m",engine="0"}'


def exposition(*, finished_prompt: str | None = "1200", deferred: str = "2") -> str:
    lines = [f"vllm:num_requests_running{LABELS} 3", f"vllm:num_requests_waiting{LABELS} 5",
             'vllm:num_requests_waiting_by_reason{model_name="m",engine="0",reason="capacity"}'
             " 3",
             f'vllm:num_requests_waiting_by_reason{{model_name="m",engine="0",reason="deferred"}}'
             f" {deferred}",
             f"vllm:prompt_tokens_total{LABELS} 5000", f"vllm:generation_tokens_total{LABELS} 900",
             f"vllm:request_generation_tokens_sum{LABELS} 300"]
    if finished_prompt is not None:
        lines.append(f"vllm:request_prompt_tokens_sum{LABELS} {finished_prompt}")
    return "\n".join(lines) + "\n"


def engine_stats(body: str) -> EngineStats:
    (engine,) = read_exposition(body, version="0.33.0").engines
    return derive_engine_stats(engine, None, T0M, None)


def test_tokens_in_flight_are_the_tokens_counted_less_those_of_finished_requests() -> None:
    stats = engine_stats(exposition())
    assert stats.tokens_in_flight == 5000 + 900 - 1200 - 300
    assert stats.waiting_deferred == 2


def test_without_a_finished_requests_sum_there_are_no_tokens_in_flight() -> None:
    assert engine_stats(exposition(finished_prompt=None)).tokens_in_flight is None


def test_an_impossible_finished_sum_is_left_out() -> None:
    assert engine_stats(exposition(finished_prompt="-5")).tokens_in_flight is None
    assert engine_stats(exposition(deferred="-1")).waiting_deferred is None

"""A run folded into a baseline (kvtop/baseline/collect.py), on scrapes built from a few
numbers: latency quantiles per minute from that minute's own bucket deltas (p99 from p99s),
the idle floor only from scrapes with nothing running and nothing waiting, minutes counted
only when their scrape windows cover half of them, no window across a restart, and the
arrivals that compare matches runs on; and the KV-anatomy figures (docs/baseline-format.md):
the share of prompt tokens found cached, block lifetimes from the residency histogram's
deltas, and how often the KV pool held the queue back, each over the run and per minute;
unknown where the server does not say."""

from __future__ import annotations

import pytest

from kvtop.baseline.collect import summarise
from kvtop.baseline.model import EngineSummary
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target

TARGET = Target.from_spec("127.0.0.1:8000")
T0 = 1_767_225_600.0
BOUNDS = (0.1, 1.0, 10.0)


def body(*, usage: float = 0.2, running: float = 1, waiting: float = 0, prompt: float = 0.0,
         generated: float = 0.0, finished: float = 0.0,
         ttft: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> str:
    """A vLLM engine: ``ttft`` counts at or under 0.1 s, 1 s and 10 s (cumulative)."""
    labels = 'engine="0",model_name="m"'
    lines = [f'vllm:cache_config_info{{{labels},num_gpu_blocks="1000",block_size="16"}} 1.0',
             f"vllm:kv_cache_usage_perc{{{labels}}} {usage}",
             f"vllm:num_requests_running{{{labels}}} {running}",
             f"vllm:num_requests_waiting{{{labels}}} {waiting}",
             f"vllm:prompt_tokens_total{{{labels}}} {prompt}",
             f"vllm:generation_tokens_total{{{labels}}} {generated}",
             f'vllm:request_success_total{{{labels},finished_reason="length"}} {finished}']
    for bound, count in zip(BOUNDS, ttft, strict=True):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{bound}"}} {count}')
    lines.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {ttft[-1]}')
    lines.append(f"vllm:time_to_first_token_seconds_count{{{labels}}} {ttft[-1]}")
    lines.append(f"vllm:time_to_first_token_seconds_sum{{{labels}}} 0.0")
    return "\n".join(lines) + "\n"


def summarised(bodies: list[tuple[float, str]]) -> EngineSummary:
    scrapes = [read_scrape(Scrape(TARGET, T0 + t, body=text)) for t, text in bodies]
    run = summarise(scrapes, name=None, source={}, interval_s=10.0)
    ((_, engine),) = run.engines()
    return engine


def test_per_minute_p99_comes_from_each_minutes_p99_not_its_p50() -> None:
    """Each 10 s window: 9 answers within 0.1 s, 1 between 1 and 10 s. The minute's p50 is
    under 0.1 s, its p99 in the slow bucket."""
    bodies = [(10.0 * i, body(ttft=(9.0 * i, 9.0 * i, 10.0 * i), generated=10.0 * i,
                              prompt=10.0 * i)) for i in range(19)]
    engine = summarised(bodies)
    p50, p99 = engine.figure("ttft_p50"), engine.figure("ttft_p99")
    assert len(p99.values) == 3 and all(v > 1.0 for v in p99.values)
    assert all(v < 0.1 for v in p50.values)
    assert engine.minute_index["ttft_p99"] == (0, 1, 2)


def test_the_idle_floor_counts_only_scrapes_with_nothing_running_or_waiting() -> None:
    bodies = []
    for i in range(18):
        if i % 3 == 0:
            bodies.append((10.0 * i, body(usage=0.01, running=0, waiting=0)))  # idle
        elif i % 3 == 1:
            bodies.append((10.0 * i, body(usage=0.30, running=0, waiting=2)))  # queued
        else:
            bodies.append((10.0 * i, body(usage=0.50, running=3, waiting=0)))
    idle = summarised(bodies).figure("idle_kv_usage")
    assert idle.value == pytest.approx(0.01) and idle.summary["samples"] == 6
    assert idle.values == (pytest.approx(0.01),) * 3


def test_a_minute_counts_only_when_its_windows_cover_half_of_it() -> None:
    """Scrapes every 10 s from 0 to 130: minute 0 has 50 s of windows, minute 1 60 s, and
    minute 2 only the 10 s to 120 and 10 s to 130: under half, so no value."""
    bodies = [(10.0 * i, body(prompt=100.0 * i, generated=10.0 * i)) for i in range(14)]
    engine = summarised(bodies)
    assert engine.figure("prompt_tps").values == (pytest.approx(10.0), pytest.approx(10.0))
    assert engine.minute_index["prompt_tps"] == (0, 1)
    longer = summarised([*bodies, (140.0, body(prompt=1400.0, generated=140.0))])
    assert longer.minute_index["prompt_tps"] == (0, 1, 2)  # 30 s: half of it


def test_no_window_spans_a_restart() -> None:
    """Counters fall at 30 s (the server restarted): the window to it counts nothing and no
    time; 3000 prompt tokens over the 30 s before it and 1000 over the 10 s after."""
    counts = [0.0, 1000.0, 2000.0, 3000.0, 100.0, 1100.0]
    bodies = [(10.0 * i, body(prompt=c, generated=c / 10)) for i, c in enumerate(counts)]
    bodies[4] = (40.0, body(prompt=100.0, generated=10.0))
    engine = summarised(bodies)
    assert engine.restarts == 1
    assert engine.figure("prompt_tps").value == pytest.approx(4000 / 40)  # not 4000 / 50


def test_arrivals_are_the_finished_and_the_change_in_those_held() -> None:
    """Each 10 s: 5 requests finish and the queue grows by 1: 6 arrived, 0.6 a second."""
    bodies = [(10.0 * i, body(running=4, waiting=float(i), finished=5.0 * i, prompt=10.0 * i,
                              generated=1.0 * i)) for i in range(13)]
    arrivals = summarised(bodies).figure("arrivals_per_s")
    assert arrivals.value == pytest.approx(0.6)
    assert arrivals.values == (pytest.approx(0.6), pytest.approx(0.6))


LABELS = 'engine="0",model_name="m"'


def anatomy_body(t: int, *, sources: bool = True, lifetime: bool = True) -> str:
    """Second ``t`` of a run: 100 prompt tokens a second, 25 of them found cached; 2
    blocks evicted a second after 3 s; the pool 95 % used with a queue in odd seconds."""
    full = t % 2 == 1
    lines = [f"vllm:num_requests_running{{{LABELS}}} 4.0",
             f"vllm:num_requests_waiting{{{LABELS}}} {3.0 if full else 0.0}",
             f'vllm:num_requests_waiting_by_reason{{{LABELS},reason="capacity"}} '
             f"{3.0 if full else 0.0}",
             f"vllm:kv_cache_usage_perc{{{LABELS}}} {0.95 if full else 0.5}",
             f"vllm:prompt_tokens_total{{{LABELS}}} {100.0 * t}"]
    if sources:
        lines += [f'vllm:prompt_tokens_by_source_total{{{LABELS},source="local_compute"}} '
                  f"{75.0 * t}",
                  f'vllm:prompt_tokens_by_source_total{{{LABELS},source="local_cache_hit"}} '
                  f"{25.0 * t}"]
    if lifetime:
        evicted = 2.0 * t
        lines += [f'vllm:kv_block_lifetime_seconds_bucket{{{LABELS},le="1.0"}} 0.0',
                  f'vllm:kv_block_lifetime_seconds_bucket{{{LABELS},le="5.0"}} {evicted}',
                  f'vllm:kv_block_lifetime_seconds_bucket{{{LABELS},le="+Inf"}} {evicted}',
                  f"vllm:kv_block_lifetime_seconds_count{{{LABELS}}} {evicted}",
                  f"vllm:kv_block_lifetime_seconds_sum{{{LABELS}}} {3.0 * evicted}"]
    return "\n".join(lines) + "\n"


def figures(**kwargs: bool) -> dict:
    scrapes = [read_scrape(Scrape(TARGET, 1000.0 + t, body=anatomy_body(t, **kwargs)))
               for t in range(1, 181)]
    run = summarise(scrapes, name="b", source={"kind": "recording"}, interval_s=1.0)
    return run.targets[0].engines[0].figures


def test_the_reuse_share_is_the_cached_part_of_the_prompts() -> None:
    got = figures()["reuse_share"]
    assert got.value == pytest.approx(0.25)
    assert got.values == pytest.approx((0.25, 0.25, 0.25))  # one a minute


def test_block_lifetimes_are_of_the_blocks_evicted_in_the_run() -> None:
    got = figures()
    assert 1.0 < got["block_lifetime_p50"].value <= 5.0  # every one in (1, 5]
    assert got["block_lifetime_p99"].value == pytest.approx(4.96)


def test_how_often_kv_capacity_held_the_queue_and_the_other_limits() -> None:
    got = figures()["kv_limited"]
    assert got.value == pytest.approx(0.5)  # odd seconds: 95 % used with 3 waiting
    assert got.summary == {"limit_kv_capacity": pytest.approx(0.5),
                           "limit_none": pytest.approx(0.5)}


def test_figures_the_server_does_not_export_stay_unknown() -> None:
    got = figures(sources=False, lifetime=False)
    assert got["reuse_share"].value is None and got["reuse_share"].values == ()
    assert got["block_lifetime_p50"].value is None

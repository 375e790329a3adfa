"""A run folded into a baseline (kvtop/baseline/collect.py), on scrapes built from a few
numbers: latency quantiles per minute from that minute's own bucket deltas (p99 from p99s),
the idle floor only from scrapes with nothing running and nothing waiting, minutes counted
only when their scrape windows cover half of them, no window across a restart, and the
arrivals that compare matches runs on; and the KV-anatomy figures (docs/baseline-format.md):
the share of prompt tokens found cached, block lifetimes from the residency histogram's
deltas, and how often the KV pool held the queue back, each over the run and per minute;
unknown where the server does not say."""

from __future__ import annotations

from datetime import datetime

import pytest

from kvtop import __version__
from kvtop.baseline.collect import Collector, summarise
from kvtop.baseline.model import EngineSummary, Figure, ProbeSummary
from kvtop.collect.gpu import GpuReading
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.leak_params import LeakParams
from tests.scenarios.gpu import DCGM_T4, gpu_fixture
from tests.support.paths import fixture_text

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
    hair = summarised([*bodies, (139.5, body(prompt=1395.0, generated=139.5))])
    assert hair.minute_index["prompt_tps"] == (0, 1)  # 29.5 s: a hair under half


def test_no_window_spans_a_restart() -> None:
    """Counters fall at 40 s and again at 60 s (the server restarted twice): the windows to
    them count nothing and no time; 3000 prompt tokens over the 30 s before the first,
    1000 over the 10 s after it and 500 over the 10 s after the second."""
    counts = [0.0, 1000.0, 2000.0, 3000.0, 100.0, 1100.0, 50.0, 550.0]
    bodies = [(10.0 * i, body(prompt=c, generated=c / 10)) for i, c in enumerate(counts)]
    engine = summarised(bodies)
    assert engine.restarts == 2
    assert engine.figure("prompt_tps").value == pytest.approx(4500 / 50)  # not 4500 / 70


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


# -- every figure of one busy run, from an engine that exports them all -------------------

def exposition(values: dict[str, float], config: str = "") -> str:
    """One vLLM engine's /metrics: each key a metric name with any labels of its own
    (``name{le="1.0"}``), the engine's labels added; ``config`` the cache_config_info labels."""
    lines = [f"vllm:cache_config_info{{{LABELS}{config}}} 1.0"] if config else []
    for key, value in values.items():
        name, _, own = key.partition("{")
        lines.append(f"{name}{{{LABELS}{',' + own.rstrip('}') if own else ''}}} {value}")
    return "\n".join(lines) + "\n"


def histogram(name: str, bounds: tuple[float, ...], counts: tuple[float, ...]
              ) -> dict[str, float]:
    """Cumulative ``counts`` at ``bounds``; none above the last."""
    series = {f'{name}_bucket{{le="{bound}"}}': count
              for bound, count in zip(bounds, counts, strict=True)}
    return series | {f'{name}_bucket{{le="+Inf"}}': counts[-1], f"{name}_count": counts[-1],
                     f"{name}_sum": 0.0}


# (running, waiting, KV usage) of the six scrapes of each minute: two idle, one with only a
# queue (not idle), three busy
PHASES = ((0, 0, 0.02), (0, 0, 0.04), (0, 2, 0.30), (4, 0, 0.50), (4, 1, 0.60), (2, 0, 0.40))
CONFIG = (',num_gpu_blocks="1000",block_size="16",cache_dtype="fp8",'
          'gpu_memory_utilization="0.85",enable_prefix_caching="True"')
# each histogram's bounds: TTFT's, the others' scaled, so a figure taken from the wrong
# histogram shows
LATENCIES = (("ttft", "vllm:time_to_first_token_seconds", 1.0),
             ("itl", "vllm:inter_token_latency_seconds", 0.1),
             ("e2e", "vllm:e2e_request_latency_seconds", 10.0),
             ("block_lifetime", "vllm:kv_block_lifetime_seconds", 100.0))


def busy(i: int) -> str:
    """Scrape i (every 10 s): each window 1 preemption, 100 prompt tokens (25 hit in the
    prefix cache, 40 found cached by source), 20 generated, 3 finished; and in each
    histogram 8 observations under its first bound, 1 under the second, 1 under the third."""
    running, waiting, usage = PHASES[i % 6]
    values = {"vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting,
              "vllm:kv_cache_usage_perc": usage, "vllm:num_preemptions_total": i,
              "vllm:prompt_tokens_total": 100 * i, "vllm:generation_tokens_total": 20 * i,
              "vllm:prefix_cache_queries_total": 100 * i, "vllm:prefix_cache_hits_total": 25 * i,
              'vllm:prompt_tokens_by_source_total{source="local_compute"}': 60 * i,
              'vllm:prompt_tokens_by_source_total{source="local_cache_hit"}': 40 * i,
              'vllm:request_success_total{finished_reason="stop"}': 3 * i}
    for _, name, scale in LATENCIES:
        values |= histogram(name, (0.1 * scale, scale, 10 * scale), (8 * i, 9 * i, 10 * i))
    return exposition(values, CONFIG)


def test_every_figure_of_a_busy_run() -> None:
    """19 scrapes, 0 to 180 s: minute 0 has 50 s of windows, minutes 1 and 2 have 60 s,
    minute 3 only 10 s (no value); two failed scrapes count as failed, nothing else."""
    scrapes = [read_scrape(Scrape(TARGET, T0 + 10 * i, body=busy(i))) for i in range(19)]
    failed = [Scrape(TARGET, T0 + t, failure="down", error="refused") for t in (45.0, 95.0)]
    run = summarise([*scrapes, *failed], name="busy", source={"kind": "recording"},
                    interval_s=10.0)
    assert (run.name, run.source, run.interval_s, run.minute_s) == (
        "busy", {"kind": "recording"}, 10.0, 60.0)
    assert run.duration_s == 180.0 and run.kvtop_version == __version__
    assert datetime.fromisoformat(run.created).tzinfo is not None and run.gpus == []
    (target,) = run.targets
    assert (target.target, target.kind, target.scrapes, target.failed_scrapes) == (
        TARGET.url, "vllm", 19, 2)
    assert target.version == "0.10.2+" and target.version_inferred  # from the metric names
    (engine,) = target.engines
    assert (engine.model, engine.engine, engine.samples, engine.minutes) == ("m", "0", 19, 3)
    assert (engine.duration_s, engine.restarts) == (180.0, 0)
    # vLLM keeps one block of the pool back (its null block)
    assert engine.config == {"num_gpu_blocks": 1000, "blocks_total": 999, "block_size": 16,
                             "kv_tokens_total": 16000, "prefix_caching": True,
                             "cache_dtype": "fp8", "gpu_memory_utilization": 0.85}
    assert set(engine.minute_index.values()) == {(0, 1, 2)}
    assert set(engine.minute_index) == set(engine.figures)
    # per minute: each value over that minute's windows; the run's over all of them
    expected = {
        "preemptions_per_min": (6.0, (6.0, 6.0, 6.0)),
        "prompt_tps": (10.0, (10.0, 10.0, 10.0)),
        "generation_tps": (2.0, (2.0, 2.0, 2.0)),
        "hit_rate": (0.25, (0.25, 0.25, 0.25)),
        "reuse_share": (0.4, (0.4, 0.4, 0.4)),
        # 3 finished a window, and the change in those running or waiting: +2 over
        # minute 0's windows (0 to 2 held), none over a whole cycle
        "arrivals_per_s": (0.3, (17 / 50, 0.3, 0.3)),
        "kv_usage": (0.30, (0.31, 0.31, 0.31)),  # the run's median; each minute's mean
        "idle_kv_usage": (0.02, (0.03, 0.03, 0.03)),  # medians: 4 of 7 at 0.02; 0.02, 0.04
        "running": (30 / 19, (10 / 6,) * 3), "waiting": (9 / 19, (0.5,) * 3),
        # waiting while preempting: the KV pool's doing, 2 scrapes of 6 (and of the last 1)
        "kv_limited": (6 / 19, (1 / 3,) * 3),
    }
    # 8 of 10 under 0.1 s, 1 in (0.1, 1], 1 in (1, 10]: interpolated within the bucket
    for key, _, scale in LATENCIES:
        for label, quantile in (("p50", 0.0625), ("p90", 1.0), ("p99", 9.1)):
            expected[f"{key}_{label}"] = (quantile * scale, (quantile * scale,) * 3)
    assert set(engine.figures) == set(expected)
    for key, (value, values) in expected.items():
        figure = engine.figure(key)
        assert (figure.value, figure.values) == (pytest.approx(value), pytest.approx(values)), key
    for key, _, _ in LATENCIES:
        for label in ("p50", "p90", "p99"):
            assert engine.figure(f"{key}_{label}").summary == {"observations": 180.0}
    assert engine.figure("kv_usage").summary == pytest.approx({
        "p5": 0.02, "p50": 0.30, "p95": 0.60, "max": 0.60, "mean": 5.60 / 19, "samples": 19})
    assert engine.figure("running").summary == pytest.approx({
        "p5": 0, "p50": 0, "p95": 4, "max": 4, "mean": 30 / 19, "samples": 19})
    assert engine.figure("waiting").summary == pytest.approx({
        "p5": 0, "p50": 0, "p95": 2, "max": 2, "mean": 9 / 19, "samples": 19})
    assert engine.figure("idle_kv_usage").summary == pytest.approx({
        "max": 0.04, "samples": 7, "blocks": 19.98})  # 2 % of 999 blocks
    assert engine.figure("preemptions_per_min").summary == {"total": 18.0}
    assert engine.figure("kv_limited").summary == pytest.approx({
        "limit_kv_capacity": 6 / 19, "limit_none": 13 / 19})
    for key in ("hit_rate", "reuse_share", "prompt_tps", "generation_tps", "arrivals_per_s"):
        assert engine.figure(key).summary == {}


def test_series_that_come_and_go_count_only_between_two_scrapes_that_have_them() -> None:
    """The waiting count is missing at 0 s and 20 s, request_success_total until 10 s, the
    preemption counter and the TTFT histogram until 10 s (then still): a window counts a
    figure only where both its scrapes have it, so the counts already there at their first
    scrape are not taken as the window's."""
    waiting = (0.0, 0.0, None, 0.0, 2.0, 0.0, 1.0, 0.0)
    finished = (None, 0.0, 10.0, 10.0, 10.0, 16.0, 16.0, 20.0)
    bodies = []
    for i in range(8):
        values: dict[str, float] = {"vllm:num_requests_running": 1.0,
                                    "vllm:kv_cache_usage_perc": 0.5,
                                    "vllm:prompt_tokens_total": 100.0}  # never moves
        if waiting[i] is not None:
            values["vllm:num_requests_waiting"] = waiting[i]  # type: ignore[assignment]
        if finished[i] is not None:
            values['vllm:request_success_total{finished_reason="stop"}'] = finished[i]  # type: ignore[assignment]
        if i >= 1:
            values["vllm:num_preemptions_total"] = 7.0
            values |= histogram("vllm:time_to_first_token_seconds", (0.1, 1.0, 10.0),
                                (100.0, 100.0, 100.0))
        bodies.append((10.0 * i, exposition(values)))
    engine = summarised(bodies)
    assert engine.figure("prompt_tps").value == 0.0
    assert engine.figure("preemptions_per_min").value == 0.0
    assert engine.figure("preemptions_per_min").summary == {"total": 0.0}
    assert engine.figure("ttft_p50").value is None  # no answer since it first showed
    # from 30 s: 0 + 2, 6 - 2, 0 + 1, 4 - 1 arrived: 10 in 40 s
    assert engine.figure("arrivals_per_s").value == pytest.approx(0.25)
    assert engine.figure("arrivals_per_s").values == (pytest.approx(0.3),)  # 30 s to 50 s


def test_a_minutes_latency_needs_five_answers() -> None:
    """Minute 0 has 5 answers (2 under 0.1 s, 2 in (1, 10], 1 over 10 s), minute 1 has 4:
    only minute 0 has a p50. The run's own needs one answer."""
    counts = [(0, 0, 0, 0)] * 5 + [(2, 2, 4, 5)] + [(2, 2, 4, 5)] * 5 + [(4, 4, 6, 9)] * 3
    bodies = []
    for i, (fast, under_1, under_10, total) in enumerate(counts):
        values = {"vllm:num_requests_running": 1.0, "vllm:num_requests_waiting": 0.0,
                  "vllm:kv_cache_usage_perc": 0.5}
        values |= histogram("vllm:time_to_first_token_seconds", (0.1, 1.0, 10.0),
                            (fast, under_1, under_10))
        values['vllm:time_to_first_token_seconds_bucket{le="+Inf"}'] = total
        values["vllm:time_to_first_token_seconds_count"] = total
        bodies.append((10.0 * i, exposition(values)))
    engine = summarised(bodies)
    p50 = engine.figure("ttft_p50")
    assert p50.values == (pytest.approx(1.0 + 9.0 * 0.5 / 2),)  # rank 2.5 of 5
    assert engine.minute_index["ttft_p50"] == (0,)
    assert p50.summary == {"observations": 9.0}
    one = summarised([(0.0, bodies[0][1]), (10.0, exposition(
        histogram("vllm:time_to_first_token_seconds", (0.1, 1.0, 10.0), (1.0, 1.0, 1.0))
        | {"vllm:num_requests_running": 1.0, "vllm:kv_cache_usage_perc": 0.5}))])
    assert one.figure("ttft_p50").value == pytest.approx(0.05)


def test_prefix_caching_off_is_a_hit_rate_of_0_wherever_prompts_came_in() -> None:
    """The server says it caches nothing: 0, from prompt tokens or else prefix queries; no
    figure where neither moved."""
    config = ',num_gpu_blocks="1000",block_size="16",enable_prefix_caching="False"'

    def run(counters: dict[str, float]) -> EngineSummary:
        return summarised([(10.0 * i, exposition(
            {"vllm:num_requests_running": 1.0, "vllm:kv_cache_usage_perc": 0.5}
            | {name: i * step for name, step in counters.items()}, config))
            for i in range(7)])

    prompts = run({"vllm:prompt_tokens_total": 100.0})
    assert prompts.config["prefix_caching"] is False
    assert prompts.figure("hit_rate").value == 0.0
    assert prompts.figure("hit_rate").values == (0.0,)
    assert run({"vllm:prefix_cache_queries_total": 100.0}).figure("hit_rate").value == 0.0
    assert run({"vllm:prompt_tokens_total": 0.0}).figure("hit_rate").value is None
    assert run({}).figure("hit_rate").value is None


def test_with_prefix_caching_on_hits_are_a_share_of_the_queries() -> None:
    """No hits counted: 0 of the queries; no queries: unknown."""
    def run(queries: float, hits: float | None) -> EngineSummary:
        counters = {"vllm:prefix_cache_queries_total": queries}
        if hits is not None:
            counters["vllm:prefix_cache_hits_total"] = hits
        return summarised([(10.0 * i, exposition(
            {"vllm:num_requests_running": 1.0, "vllm:kv_cache_usage_perc": 0.5}
            | {name: i * step for name, step in counters.items()})) for i in range(7)])

    assert run(100.0, 20.0).figure("hit_rate").value == pytest.approx(0.2)
    assert run(100.0, None).figure("hit_rate").value == 0.0
    assert run(0.0, 0.0).figure("hit_rate").value is None


def computed_kv_body(i: int, *, computed_from: int = 0) -> str:
    """Without prompt_tokens_by_source: no prompt until 10 s, then 1000 prompt tokens a
    window of which 300 computed afresh; the computed-KV histogram only from scrape
    ``computed_from`` (None: never)."""
    values = {"vllm:num_requests_running": 1.0, "vllm:kv_cache_usage_perc": 0.5}
    served = max(0, i - 1)
    for name, total in (("vllm:request_prompt_tokens", 1000.0),
                        ("vllm:request_prefill_kv_computed_tokens", 300.0)):
        if name.endswith("prompt_tokens") or i >= computed_from:
            values |= histogram(name, (100.0, 1000.0, 10000.0), (0.0, 0.0, 2.0 * served))
            values[f"{name}_sum"] = total * served
    return exposition(values)


def test_the_reuse_share_from_vllms_computed_kv_histogram() -> None:
    """The prompt-length and computed-KV histograms' sums: 70 % reused; the first window,
    with no prompt, adds nothing; a window before the computed-KV histogram shows, nothing."""
    engine = summarised([(10.0 * i, computed_kv_body(i)) for i in range(7)])
    assert engine.figure("reuse_share").value == pytest.approx(0.7)
    assert engine.figure("reuse_share").values == (pytest.approx(0.7),)
    later = summarised([(10.0 * i, computed_kv_body(i, computed_from=2)) for i in range(7)])
    assert later.figure("reuse_share").value == pytest.approx(0.7)
    never = summarised([(10.0 * i, computed_kv_body(i, computed_from=99)) for i in range(7)])
    assert never.figure("reuse_share").value is None  # prompt lengths alone say nothing


def test_a_source_first_counted_mid_run_counts_from_zero() -> None:
    """vLLM shows a prompt-token source once it first counts one: the counter first shows
    at 10 s (no window to it), local_compute at 20 s with 60, a share computed afresh in
    that window like any other: 40 of each 100 prompt tokens found cached."""
    def body(i: int) -> str:
        values = {"vllm:num_requests_running": 1.0, "vllm:kv_cache_usage_perc": 0.5}
        if i:
            values['vllm:prompt_tokens_by_source_total{source="local_cache_hit"}'] = 40.0 * i
        if i > 1:
            values['vllm:prompt_tokens_by_source_total{source="local_compute"}'] = 60.0 * (
                i - 1)
        return exposition(values)

    assert summarised([(10.0 * i, body(i)) for i in range(7)]).figure(
        "reuse_share").value == pytest.approx(0.4)
    cached = summarised([(10.0 * i, exposition({
        "vllm:num_requests_running": 1.0, "vllm:kv_cache_usage_perc": 0.5,
        'vllm:prompt_tokens_by_source_total{source="local_cache_hit"}': 40.0 * i}))
        for i in range(7)])
    assert cached.figure("reuse_share").value == 1.0  # no source computed any


def test_a_scrape_at_the_time_of_the_last_adds_no_window() -> None:
    """A recording holding two scrapes of one instant: no window of 0 s (its counts would
    land in no time); the next window counts from the later of the two."""
    bodies = [(0.0, body(prompt=0.0)), (10.0, body(prompt=100.0)),
              (10.0, body(prompt=150.0)), (20.0, body(prompt=200.0))]
    assert summarised(bodies).figure("prompt_tps").value == pytest.approx(150 / 20)


def test_recorded_scrapes_are_taken_in_time_order_unless_streamed_so() -> None:
    """A recording read whole is sorted; a streamed one (in_time_order) is taken as it
    comes, and a scrape older than one already folded is dropped, as the tracker does."""
    scrapes = [read_scrape(Scrape(TARGET, T0 + 10.0 * i, body=body(prompt=100.0 * i)))
               for i in range(7)]
    shuffled = [*scrapes[3:], *scrapes[:3]]
    (_, sorted_run), = summarise(shuffled, name=None, source={}, interval_s=10.0).engines()
    assert sorted_run.samples == 7 and sorted_run.figure("prompt_tps").value == 10.0
    streamed = summarise(shuffled, name=None, source={}, interval_s=10.0, in_time_order=True)
    assert streamed.targets[0].scrapes == 4 and streamed.targets[0].failed_scrapes == 3


def test_the_leak_verdict_is_the_worst_the_detector_reached_with_its_parameters() -> None:
    """vLLM's twin holding 827 blocks at idle for 400 s: a LEAK by the defaults, only WATCH
    when a residual must be held 6000 s; a run too short for a verdict says so."""
    idle = fixture_text("vllm-0.33.0-v1-twin-leaking-idle.txt")
    scrapes = [read_scrape(Scrape(TARGET, T0 + 10.0 * i, body=idle)) for i in range(40)]

    def engine(params: LeakParams | None, count: int = 40) -> EngineSummary:
        run = summarise(scrapes[:count], name=None, source={}, interval_s=10.0,
                        leak_params=params)
        return run.engines()[0][1]

    leak = engine(None)
    assert (leak.leak, leak.leak_reason) == (
        "leak", "827 blocks held with nothing running or waiting")
    watch = engine(LeakParams(idle_leak_s=6000.0))
    assert (watch.leak, watch.leak_reason) == ("watch", "827 blocks held at idle (confirming)")
    short = engine(None, count=1)
    assert (short.leak, short.leak_reason) == ("unknown", "not enough data for a verdict")
    assert (short.model, short.engine) == ("twin-llama", "0")


def test_without_a_waiting_count_idle_arrivals_and_limits_are_unknown() -> None:
    """A server that exports no waiting count: never idle, no arrivals, no limit share."""
    engine = summarised([(10.0 * i, exposition({
        "vllm:num_requests_running": 0.0, "vllm:kv_cache_usage_perc": 0.1,
        'vllm:request_success_total{finished_reason="stop"}': 5.0 * i})) for i in range(7)])
    for key in ("idle_kv_usage", "arrivals_per_s", "kv_limited", "waiting"):
        assert engine.figure(key).value is None, key
    assert engine.figure("kv_limited").summary == {}
    assert engine.figure("idle_kv_usage").summary == {"max": None, "samples": 0.0,
                                                      "blocks": None}


@pytest.mark.parametrize(("labels", "blocks", "utilization"), [
    (',num_gpu_blocks="1000.0",gpu_memory_utilization="0.9"', 1000, 0.9),
    (',num_gpu_blocks="many",gpu_memory_utilization="high"', None, None),
    (',num_gpu_blocks="1000",gpu_memory_utilization="NaN"', 1000, None),
    (',num_gpu_blocks="1000",gpu_memory_utilization="inf"', 1000, None),
    (',block_size="16"', None, None),
])
def test_the_cache_config_labels_kept_are_numbers_or_unknown(
        labels: str, blocks: int | None, utilization: float | None) -> None:
    text = exposition({"vllm:num_requests_running": 1.0, "vllm:kv_cache_usage_perc": 0.5},
                      labels)
    config = summarised([(0.0, text)]).config
    assert (config["num_gpu_blocks"], config["gpu_memory_utilization"]) == (
        blocks, utilization)
    assert config["cache_dtype"] is None


GIB = 2**30


def gpu(used_gib: float | None, uuid: str = "GPU-0", index: int = 0) -> GpuReading:
    return GpuReading(index=index, name="NVIDIA H100", uuid=uuid,
                      memory_used_bytes=None if used_gib is None else int(used_gib * GIB),
                      memory_total_bytes=80 * GIB, util_percent=None, temperature_c=None,
                      power_w=None)


def test_gpu_memory_is_kept_per_minute_of_the_run() -> None:
    """NVML readings every 20 s, beside the scrapes: 10 then 20 GiB used in minute 0, 30
    in minute 1, unknown in minute 2; a reading older than the last scrape does not move
    the run's end."""
    collector = Collector()
    collector.feed(read_scrape(Scrape(TARGET, T0, body=body())))
    for t, used in ((0.0, 10), (20.0, 20), (60.0, 30), (80.0, 30), (120.0, None)):
        collector.feed_gpus(T0 + t, [gpu(used)])
    collector.feed(read_scrape(Scrape(TARGET, T0 + 130.0, body=body())))
    collector.feed_gpus(T0 + 125.0, [gpu(40, uuid="GPU-1", index=1),
                                     gpu(None, uuid="GPU-2", index=2)])
    run = collector.baseline(name=None, source={}, interval_s=20.0)
    assert run.duration_s == 130.0
    first, second, unread = run.gpus
    assert (first.index, first.name, first.uuid, first.memory_total_bytes) == (
        0, "NVIDIA H100", "GPU-0", 80 * GIB)
    assert (first.host, first.source) == (None, "nvml")
    assert first.memory_used.value == 25 * GIB  # the median of 10, 20, 30 and 30
    assert first.memory_used.values == (15 * GIB, 30 * GIB)
    assert first.memory_used.summary == {"max": 30 * GIB, "samples": 4.0}
    assert second.uuid == "GPU-1" and second.memory_used.values == (40 * GIB,)
    assert unread.memory_used == Figure(None, (), {"max": None, "samples": 0.0})


def test_an_exporters_gpus_count_like_the_local_ones() -> None:
    """dcgm-exporter's two T4s, each on the host its Hostname label names (one without a
    memory reading: kept, its memory unknown)."""
    exporter = Target(url="http://gpu-host:9400/metrics")
    text = gpu_fixture(DCGM_T4)
    run = summarise([read_scrape(Scrape(exporter, T0 + 10.0 * i, body=text))
                     for i in range(7)], name=None, source={}, interval_s=10.0)
    assert [(g.source, g.name, g.host) for g in run.gpus] == [
        ("dcgm", "Tesla T4", "424773df46e0"), ("dcgm", "Tesla T4", "551bdf382151")]
    read, unread = run.gpus
    assert read.memory_used.summary == {"max": 0.0, "samples": 7.0}
    assert read.memory_used.values == (0.0, 0.0) and unread.memory_used.value is None
    assert run.targets[0].engines == []


def test_a_probe_and_a_target_never_answered_are_kept() -> None:
    """A target named up front that never answered is in the baseline with no scrapes;
    the probe's summary is kept with its target."""
    silent = Target.from_spec("127.0.0.1:8001")
    probe = ProbeSummary("m", "text", 64, 512, requests=3, failed=1)
    collector = Collector()
    collector.set_probe(TARGET, probe)
    collector.add_target(silent)
    run = collector.baseline(name="p", source={}, interval_s=10.0)
    assert [(t.target, t.probe, t.scrapes) for t in run.targets] == [
        (TARGET.url, probe, 0), (silent.url, None, 0)]
    assert run.duration_s == 0.0
    named = summarise([], targets=[silent], name=None, source={}, interval_s=10.0)
    assert [(t.target, t.engines) for t in named.targets] == [(silent.url, [])]


def test_a_histogram_whose_buckets_change_counts_no_window_across_the_change() -> None:
    """The TTFT buckets change at 30 s (another bucket set, no restart): that window's
    answers cannot be told apart and are left out; 10 fast answers a window either side."""
    def ttft(i: int) -> dict[str, float]:
        bounds = (0.1, 1.0, 10.0) if i < 3 else (0.1, 0.5, 1.0, 10.0)
        return histogram("vllm:time_to_first_token_seconds", bounds,
                         (10.0 * i,) * len(bounds))

    engine = summarised([(10.0 * i, exposition(
        {"vllm:num_requests_running": 1.0, "vllm:kv_cache_usage_perc": 0.5} | ttft(i)))
        for i in range(7)])
    assert engine.figure("ttft_p50").summary == {"observations": 50.0}  # 60 less the 10


def ttft_run(sets: list[tuple[tuple[float, ...], float, float]]) -> EngineSummary:
    """Each (bounds, under, over): two scrapes 10 s apart with those TTFT bounds, and between
    them ``under`` answers under the first bound and ``over`` above the last; the counts go
    on from the answers before."""
    bodies, before = [], 0.0
    for k, (bounds, under, over) in enumerate(sets):
        for j, (count, total) in enumerate(((before, before), (before + under,
                                                               before + under + over))):
            ttft = histogram("vllm:time_to_first_token_seconds", bounds, (count,) * len(bounds))
            ttft['vllm:time_to_first_token_seconds_bucket{le="+Inf"}'] = total
            bodies.append((20.0 * k + 10.0 * j, exposition(
                {"vllm:num_requests_running": 1.0, "vllm:kv_cache_usage_perc": 0.5} | ttft)))
        before += under + over
    return summarised(bodies)


def test_two_bucket_sets_are_merged_on_their_bounds_not_added_bound_by_bound() -> None:
    """20 answers within 0.5 s under bounds (0.5, 10), then the bounds become (1, 10) and 30
    answers come between 1 and 10 s. The 25th answer is the 5th of those 30: p50 = 1 + 9 *
    5/30 = 2.5 s, p90 (the 45th) 1 + 9 * 25/30 = 8.5 s. Added bound by bound, bound 1 held
    the second set's 0 under the first set's 20 and p50 read 5.5 s."""
    def ttft(i: int) -> dict[str, float]:
        if i < 3:
            return histogram("vllm:time_to_first_token_seconds", (0.5, 10.0), (10.0 * i,) * 2)
        return histogram("vllm:time_to_first_token_seconds", (1.0, 10.0),
                         (20.0, 20.0 + 10.0 * (i - 3)))

    engine = summarised([(10.0 * i, exposition(
        {"vllm:num_requests_running": 1.0, "vllm:kv_cache_usage_perc": 0.5} | ttft(i)))
        for i in range(7)])
    p50, p90 = engine.figure("ttft_p50"), engine.figure("ttft_p90")
    assert (p50.value, p90.value) == (pytest.approx(2.5), pytest.approx(8.5))
    assert p50.summary == {"observations": 50.0}
    # minute 0 (the window that ends at 60 s starts minute 1): 20 answers of each set, the
    # 36th the 16th of the second's 20 in (1, 10]
    assert p90.values == (pytest.approx(1.0 + 9.0 * 16 / 20),)


def test_a_fifth_bucket_set_is_folded_into_the_fullest() -> None:
    """Sets (b, 10 s) one after another: 12 answers within 0.6 s and 8 above 10 s (the
    fullest, 20), 13 within 0.7 s (more under 10 s, fewer in all, and the larger bounds), then
    5 within each of 0.3, 0.4 and 0.5 s. Four sets are kept apart; the fifth, (0.5, 10), is
    folded into the fullest, where its answers count as within 0.6 s. p50, the 24th of 48:
    0.4 + 0.2 * 14/17 s. Kept apart: 0.575 s; only three kept: 0.559 s; folded into the set
    with the most under 10 s or the larger bounds (0.7 s): 0.611 s; into the emptiest: 0.615 s."""
    engine = ttft_run([((0.6, 10.0), 12.0, 8.0), ((0.7, 10.0), 13.0, 0.0)]
                      + [((b, 10.0), 5.0, 0.0) for b in (0.3, 0.4, 0.5)])
    ttft = engine.figure("ttft_p50")
    assert ttft.value == pytest.approx(0.4 + 0.2 * 14 / 17)
    assert ttft.summary == {"observations": 48.0}

"""Values no server can mean are left out of what kvtop shows, counted and named
(docs/snapshot-json.md ``impossible_values``), and values at the edge of possible are kept:
a pool exactly full or empty, a fraction rounded a hair past 0 or 1, counters at zero,
as many prefix hits as queries."""

from __future__ import annotations

import pytest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.adapters.plausible import MAX_VALUE, SLACK
from kvtop.collect.reading import ServerReading

ENGINE = 'engine="0",model_name="m"'


def vllm(*lines: str) -> ServerReading:
    body = [f"vllm:num_requests_running{{{ENGINE}}} 1.0"]
    return read_exposition("\n".join(body + list(lines)) + "\n")


def engine_of(reading: ServerReading):  # type: ignore[no-untyped-def]
    [engine] = reading.engines
    return engine


@pytest.mark.parametrize("usage", [0.0, 1.0, 1.0000005, -0.0000005, 0.5])
def test_a_usage_within_0_to_1_or_a_rounding_past_is_kept(usage: float) -> None:
    reading = vllm(f"vllm:kv_cache_usage_perc{{{ENGINE}}} {usage!r}")
    assert engine_of(reading).kv_usage == usage
    assert (reading.impossible_values, reading.notes) == (0, [])


@pytest.mark.parametrize("usage", [1.01, 1.7, -0.01, 3.0])
def test_a_usage_outside_0_to_1_is_left_out_and_named(usage: float) -> None:
    reading = vllm(f"vllm:kv_cache_usage_perc{{{ENGINE}}} {usage!r}")
    assert engine_of(reading).kv_usage is None
    assert reading.impossible_values == 1
    assert reading.notes == [f"impossible values left out: m/0: kv_usage {usage:g} "
                             "(not within 0..1)"]


@pytest.mark.parametrize(("line", "field", "why"), [
    (f"vllm:num_requests_waiting{{{ENGINE}}} -1", "waiting", "not a count"),
    (f"vllm:num_preemptions_total{{{ENGINE}}} -5", "preemptions_total", "not a counter's value"),
    (f"vllm:prompt_tokens_total{{{ENGINE}}} 1e300", "prompt_tokens_total",
     "not a counter's value"),
])
def test_a_negative_or_huge_count_is_left_out(line: str, field: str, why: str) -> None:
    reading = vllm(line)
    assert getattr(engine_of(reading), field) is None
    assert reading.impossible_values == 1 and reading.notes[0].endswith(f" ({why})")


def test_counts_at_zero_and_at_the_largest_exact_float_are_kept() -> None:
    reading = vllm(f"vllm:num_requests_waiting{{{ENGINE}}} 0",
                   f"vllm:prompt_tokens_total{{{ENGINE}}} 9007199254740992")
    engine = engine_of(reading)
    assert (engine.waiting, engine.prompt_tokens_total) == (0, 2.0**53)
    assert reading.impossible_values == 0


def test_a_finished_count_at_the_largest_exact_float_is_kept() -> None:
    reading = vllm(f'vllm:request_success_total{{{ENGINE},finished_reason="stop"}} {MAX_VALUE!r}')
    assert engine_of(reading).finished_total == {"stop": MAX_VALUE}


def test_a_nan_a_server_sends_directly_is_no_value_and_not_counted() -> None:
    # llama.cpp's values are read as sent (one series each): NaN reaches the check
    reading = read_exposition("llamacpp:requests_processing 1\nllamacpp:kv_cache_usage_ratio NaN\n")
    assert engine_of(reading).kv_usage is None
    assert (reading.impossible_values, reading.notes) == (0, [])


def test_finished_requests_per_reason_keep_the_possible_ones() -> None:
    reading = vllm(f'vllm:request_success_total{{{ENGINE},finished_reason="stop"}} 7',
                   f'vllm:request_success_total{{{ENGINE},finished_reason="length"}} -2',
                   f'vllm:request_success_total{{{ENGINE},finished_reason="abort"}} 0')
    assert engine_of(reading).finished_total == {"stop": 7.0, "abort": 0.0}
    assert reading.impossible_values == 1
    assert "request_success_total -2" in reading.notes[0]


def prefix(queries: float, hits: float) -> ServerReading:
    return vllm(f"vllm:prefix_cache_queries_total{{{ENGINE}}} {queries!r}",
                f"vllm:prefix_cache_hits_total{{{ENGINE}}} {hits!r}")


def test_as_many_prefix_hits_as_queries_is_a_full_hit_rate() -> None:
    engine = engine_of(prefix(100.0, 100.0))
    assert (engine.prefix_queries_total, engine.prefix_hits_total) == (100.0, 100.0)


def test_prefix_hits_a_rounding_above_the_queries_are_kept() -> None:
    hits = 1e6 * (1 + SLACK)
    reading = prefix(1e6, hits)
    assert engine_of(reading).prefix_hits_total == hits and reading.impossible_values == 0


def test_more_prefix_hits_than_queries_leaves_the_cache_counters_out() -> None:
    reading = prefix(100.0, 101.0)
    engine = engine_of(reading)
    assert (engine.prefix_queries_total, engine.prefix_hits_total, engine.prefix_unit) == (
        None, None, None)
    assert reading.impossible_values == 1
    assert "prefix cache hits 101 above queries 100" in reading.notes[0]


def histogram(*buckets: tuple[str, float], count: float = 3, total: float = 0.5) -> list[str]:
    name = "vllm:time_to_first_token_seconds"
    lines = [f'{name}_bucket{{{ENGINE},le="{le}"}} {n!r}' for le, n in buckets]
    return [*lines, f"{name}_count{{{ENGINE}}} {count!r}", f"{name}_sum{{{ENGINE}}} {total!r}"]


def test_a_histogram_whose_buckets_never_go_down_is_kept() -> None:
    engine = engine_of(vllm(*histogram(("0.1", 0), ("1", 3), ("+Inf", 3))))
    assert engine.ttft is not None and engine.ttft.count == 3


@pytest.mark.parametrize("lines", [
    histogram(("0.1", 0), ("+Inf", 0), count=0, total=0),  # nothing observed yet
    histogram(("0.1", 0), ("+Inf", MAX_VALUE), count=MAX_VALUE, total=MAX_VALUE),
])
def test_a_histogram_at_the_edges_of_possible_is_kept(lines: list[str]) -> None:
    reading = vllm(*lines)
    assert engine_of(reading).ttft is not None and reading.impossible_values == 0


@pytest.mark.parametrize(("lines", "why"), [
    (histogram(("0.1", 2), ("1", 1), ("+Inf", 3)), "cumulative buckets go down, 2 then 1 at le=1"),
    (histogram(("0.1", -1), ("+Inf", 3)), "a bucket count of -1"),
    (histogram(("0.1", 1), ("+Inf", 3), count=-3), "a count of -3"),
    (histogram(("0.1", 1), ("+Inf", 3), total=-0.5), "a sum of -0.5"),
    (histogram(("NaN", 1), ("+Inf", 3)), "a bucket bound that is not a number"),
])
def test_a_histogram_no_server_can_have_is_left_out_whole(lines: list[str], why: str) -> None:
    reading = vllm(*lines)
    assert engine_of(reading).ttft is None
    assert reading.impossible_values == 1 and f"ttft histogram ({why})" in reading.notes[0]


def test_the_note_names_three_and_counts_the_rest() -> None:
    reading = vllm(f"vllm:kv_cache_usage_perc{{{ENGINE}}} 2",
                   f"vllm:num_requests_waiting{{{ENGINE}}} -1",
                   f"vllm:num_preemptions_total{{{ENGINE}}} -1",
                   f"vllm:prompt_tokens_total{{{ENGINE}}} -1",
                   f"vllm:generation_tokens_total{{{ENGINE}}} -1")
    assert reading.impossible_values == 5
    [note] = reading.notes
    assert note.count("m/0: ") == 3 and note.endswith(" and 2 more")


# NaN and ±Inf are "no value" (the series is left out), never an impossible value

@pytest.mark.parametrize("odd", ["NaN", "+Inf", "-Inf"])
def test_a_rank_without_a_value_does_not_hide_the_others(odd: str) -> None:
    reading = vllm(f'vllm:kv_cache_usage_perc{{{ENGINE},rank="0"}} {odd}',
                   f'vllm:kv_cache_usage_perc{{{ENGINE},rank="1"}} 0.5')
    assert engine_of(reading).kv_usage == 0.5
    assert (reading.impossible_values, reading.notes) == (0, [])


@pytest.mark.parametrize("odd", ["NaN", "+Inf", "-Inf"])
def test_a_finished_series_without_a_value_leaves_the_reasons_others(odd: str) -> None:
    reading = vllm(f'vllm:request_success_total{{{ENGINE},finished_reason="stop",api="a"}} 5',
                   f'vllm:request_success_total{{{ENGINE},finished_reason="stop",api="b"}} {odd}')
    assert engine_of(reading).finished_total == {"stop": 5.0}
    assert (reading.impossible_values, reading.notes) == (0, [])

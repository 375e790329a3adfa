"""What kvtop reads from SGLang, llama.cpp and Triton/TRT-LLM (shared/reference/vllm-metrics.md
§1c), and the rules every adapter shares: ranks of one engine are one pool, histograms sum
over other labels, rows come in a stable order, the engine is recognised by its names."""

from __future__ import annotations

import pytest

from kvtop.collect.adapters import WANTED, llamacpp, names_for, read_exposition, sglang, vllm
from kvtop.collect.adapters.common import MAX_ENGINES
from kvtop.collect.reading import EngineReading, ServerReading


def only(reading: ServerReading) -> EngineReading:
    assert len(reading.engines) == 1, reading.engines
    return reading.engines[0]


# --- SGLang --------------------------------------------------------------------------------

def sglang_ranks(extra: str = "") -> str:
    """An SGLang 0.5.x engine on two TP ranks: each rank reports the same pool."""
    lines = []
    for rank in ("0", "1"):
        labels = f'model_name="q",tp_rank="{rank}"'
        lines += [f"sglang:token_usage{{{labels}}} 0.{rank}5",
                  f"sglang:num_used_tokens{{{labels}}} 1{rank}00",
                  f"sglang:num_running_reqs{{{labels}}} {3 + int(rank)}",
                  f"sglang:num_queue_reqs{{{labels}}} 2",
                  f"sglang:prompt_tokens_total{{{labels}}} 500",
                  f"sglang:generation_tokens_total{{{labels}}} 70"]
    return "\n".join(lines) + "\n" + extra


def test_sglang_ranks_of_one_engine_are_one_pool() -> None:
    e = only(read_exposition(sglang_ranks()))
    assert (e.model, e.engine) == ("q", None)
    assert (e.kv_usage, e.tokens_used, e.running, e.waiting) == (0.15, 1100, 4, 2)
    assert (e.prompt_tokens_total, e.generation_tokens_total) == (1000, 140)  # counters add


def test_sglang_capacity_comes_from_max_total_num_tokens() -> None:
    extra = ('sglang:max_total_num_tokens{model_name="q",tp_rank="0"} 200000\n'
             'sglang:max_total_num_tokens{model_name="q",tp_rank="1"} 200000\n'
             'sglang:max_total_num_tokens{tp_rank="0"} 99\n')  # no model name: no engine
    reading = read_exposition(sglang_ranks(extra))
    assert only(reading).tokens_total == 200000
    assert reading.notes == []


def test_sglang_without_capacity_says_which_release_has_it() -> None:
    reading = read_exposition(sglang_ranks())
    assert only(reading).tokens_total is None
    assert reading.notes == [
        "KV capacity not exported (sglang:max_total_num_tokens needs SGLang 0.5.6+)"]


def test_sglang_prefix_hits_are_cached_tokens_of_the_prompt_tokens() -> None:
    extra = ('sglang:cached_tokens_total{model_name="q",tp_rank="0"} 150\n'
             'sglang:cached_tokens_total{model_name="q",tp_rank="1"} 150\n')
    e = only(read_exposition(sglang_ranks(extra)))
    assert (e.prefix_hits_total, e.prefix_queries_total, e.prefix_unit) == (300, 1000, "tokens")


def test_sglang_cached_tokens_without_prompt_tokens_give_no_hit_counters() -> None:
    text = ('sglang:num_running_reqs{model_name="q"} 1\n'
            'sglang:cached_tokens_total{model_name="q"} 150\n')
    e = only(read_exposition(text))
    assert (e.prefix_hits_total, e.prefix_queries_total, e.prefix_unit) == (None, None, None)


def test_sglang_data_parallel_ranks_are_separate_engines() -> None:
    text = ('sglang:num_running_reqs{dp_rank="0",model_name="q"} 1\n'
            'sglang:num_running_reqs{dp_rank="1",model_name="q"} 4\n')
    assert [(e.engine, e.running) for e in read_exposition(text).engines] == [("0", 1), ("1", 4)]


def test_sglang_series_without_a_model_name_are_not_an_engine() -> None:
    text = ('sglang:num_running_reqs{model_name="q"} 1\n'
            'sglang:num_queue_reqs 3\n')  # a rank label only: no engine to show it in
    e = only(read_exposition(text))
    assert (e.running, e.waiting) == (1, None)


def sglang_histogram(name: str, count: int) -> str:
    return (f'{name}_bucket{{model_name="q",le="0.1"}} {count}\n'
            f'{name}_bucket{{model_name="q",le="+Inf"}} {count}\n'
            f'{name}_count{{model_name="q"}} {count}\n{name}_sum{{model_name="q"}} 1.5\n')


def test_sglang_itl_new_name_is_preferred_over_the_old() -> None:
    text = ('sglang:num_running_reqs{model_name="q"} 1\n'
            + sglang_histogram("sglang:inter_token_latency_seconds", 9)
            + sglang_histogram("sglang:time_per_output_token_seconds", 4))
    e = only(read_exposition(text))
    assert e.itl is not None and e.itl.count == 9


def test_a_version_from_the_server_is_kept() -> None:
    assert read_exposition(sglang_ranks(), version="0.5.6").version == "0.5.6"
    assert read_exposition("llamacpp:requests_processing 1\n", version="b1234").version == "b1234"
    text = 'nv_trt_llm_request_metrics{model="t",request_type="active"} 1\n'
    assert read_exposition(text, version="24.05").version == "24.05"
    assert read_exposition("up 1\n", version="9.9").version == "9.9"


# --- llama.cpp -----------------------------------------------------------------------------

def test_llamacpp_builds_with_kv_metrics_report_usage_and_tokens() -> None:
    text = ("llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n"
            "llamacpp:kv_cache_usage_ratio 0.375\nllamacpp:kv_cache_tokens 1536\n")
    reading = read_exposition(text)
    e = only(reading)
    assert (e.kv_usage, e.tokens_used, e.running, e.waiting) == (0.375, 1536, 2, 1)
    assert reading.notes == []


def test_llamacpp_without_kv_metrics_says_so() -> None:
    reading = read_exposition("llamacpp:requests_processing 0\n")
    assert reading.notes == ["this llama.cpp build exports no KV occupancy (llama.cpp#23632)"]


def test_llamacpp_cached_prompt_tokens_are_hits_and_part_of_the_queries() -> None:
    # builds that count cached tokens leave them out of prompt_tokens_total
    text = "llamacpp:prompt_tokens_total 700\nllamacpp:prompt_tokens_cached_total 300\n"
    e = only(read_exposition(text))
    assert (e.prefix_hits_total, e.prefix_queries_total, e.prefix_unit) == (300, 1000, "tokens")
    e = only(read_exposition("llamacpp:prompt_tokens_cached_total 300\n"))
    assert (e.prefix_hits_total, e.prefix_queries_total) == (None, None)


# --- Triton + TensorRT-LLM ------------------------------------------------------------------

def trt(model: str, **kinds: float) -> str:
    return "".join(
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="{kind}",model="{model}",'
        f'version="1"}} {value}\n' for kind, value in kinds.items())


def test_trtllm_usage_is_used_over_max_and_capacity_in_tokens() -> None:
    text = trt("t", max=1000, used=250, tokens_per=64, fraction=0.9)
    e = only(read_exposition(text))
    assert (e.blocks_total, e.block_size, e.tokens_total) == (1000, 64, 64000)
    assert e.kv_usage == 0.25  # not the exported fraction


def test_trtllm_without_a_pool_size_has_no_usage_or_capacity() -> None:
    for kinds in ({"used": 5.0, "tokens_per": 64.0}, {"max": 0.0, "used": 0.0}):
        e = only(read_exposition(trt("t", **kinds)))
        assert (e.blocks_total, e.kv_usage, e.tokens_total) == (None, None, None), kinds
    e = only(read_exposition(trt("t", max=1000)))
    assert (e.blocks_total, e.kv_usage) == (1000, None)
    e = only(read_exposition(trt("t", max=1.0, used=1.0)))  # a one-block pool is a pool
    assert (e.blocks_total, e.kv_usage) == (1, 1.0)


def test_trtllm_requests_and_blocks_of_one_model_are_one_engine() -> None:
    text = (trt("t", max=100, used=10)
            + 'nv_trt_llm_request_metrics{model="t",request_type="active",version="1"} 3\n'
            + 'nv_trt_llm_request_metrics{model="t",request_type="waiting",version="1"} 2\n'
            + 'nv_trt_llm_request_metrics{model="r",request_type="active",version="1"} 1\n'
            + trt("b", max=50))
    engines = {e.model: e for e in read_exposition(text).engines}
    assert sorted(engines) == ["b", "r", "t"]
    assert (engines["t"].running, engines["t"].waiting, engines["t"].kv_usage) == (3, 2, 0.1)
    assert (engines["r"].running, engines["r"].blocks_total) == (1, None)
    assert (engines["b"].running, engines["b"].blocks_total) == (None, 50)


def test_trtllm_a_series_without_its_kind_label_is_not_taken_for_one() -> None:
    text = trt("t", max=100, used=10) + 'nv_trt_llm_kv_cache_block_metrics{model="t"} 7\n'
    e = only(read_exposition(text))
    assert (e.blocks_total, e.kv_usage) == (100, 0.1)


# --- shared rules ---------------------------------------------------------------------------

def test_rows_are_ordered_by_model_then_engine_number() -> None:
    lines = [f'vllm:num_requests_running{{engine="{engine}",model_name="{model}"}} 1'
             for model, engine in [("b", "0"), ("a", "10"), ("a", "9"), ("a", "B"), ("a", "A"),
                                   ("a", "0")]]
    lines.append('vllm:num_requests_running{model_name="a"} 1')
    reading = read_exposition("\n".join(lines) + "\n")
    assert [(e.model, e.engine) for e in reading.engines] == [
        ("a", None), ("a", "A"), ("a", "B"), ("a", "0"), ("a", "9"), ("a", "10"), ("b", "0")]
    no_model = 'nv_trt_llm_request_metrics{request_type="active"} 1\n'
    text = trt("Qwen", max=1) + trt("B", max=1) + no_model
    assert [e.model for e in read_exposition(text).engines] == [None, "B", "Qwen"]


def test_engine_numbers_sort_as_numbers_up_to_18_digits_and_longer_ones_as_text() -> None:
    # past 18 digits a name is no engine index (and int() of thousands of digits is slow)
    long18, long19 = "1" + "0" * 17, "1" + "0" * 18
    lines = [f'vllm:num_requests_running{{engine="{engine}",model_name="m"}} 1'
             for engine in ("10", long19, long18, "9", "x")]
    reading = read_exposition("\n".join(lines) + "\n")
    assert [e.engine for e in reading.engines] == [long19, "x", "9", "10", long18]


def test_a_gauge_in_several_series_is_the_largest_whatever_their_order() -> None:
    text = ('sglang:token_usage{model_name="q",tp_rank="0"} 0.7\n'
            'sglang:token_usage{model_name="q",tp_rank="1"} 0.2\n'
            'sglang:token_usage{model_name="q",tp_rank="2"} NaN\n')
    assert only(read_exposition(text)).kv_usage == 0.7


def test_a_count_in_several_series_is_their_sum_without_nan() -> None:
    text = ('vllm:num_requests_running{engine="0",model_name="m",server="a"} 2\n'
            'vllm:num_requests_running{engine="0",model_name="m",server="b"} 5\n'
            'vllm:num_requests_running{engine="0",model_name="m",server="c"} NaN\n')
    assert only(read_exposition(text)).running == 7


def test_histogram_buckets_sum_over_other_labels_and_skip_unreadable_bounds() -> None:
    name = "vllm:time_to_first_token_seconds"
    text = "\n".join([
        'vllm:num_requests_running{engine="0",model_name="m"} 1',
        f'{name}_bucket{{engine="0",model_name="m",le="bad",server="a"}} 99',
        f'{name}_bucket{{engine="0",model_name="m",le="0.5",server="a"}} 2',
        f'{name}_bucket{{engine="0",model_name="m",le="+Inf",server="a"}} 3',
        f'{name}_bucket{{engine="0",model_name="m",le="0.5",server="b"}} 4',
        f'{name}_bucket{{engine="0",model_name="m",le="+Inf",server="b"}} 6',
        f'{name}_count{{engine="0",model_name="m",server="a"}} 3',
        f'{name}_count{{engine="0",model_name="m",server="b"}} 6',
        f'{name}_sum{{engine="0",model_name="m",server="a"}} 1.25',
        f'{name}_sum{{engine="0",model_name="m",server="b"}} 2.5',
    ]) + "\n"
    ttft = only(read_exposition(text)).ttft
    assert ttft is not None
    assert ttft.buckets == ((0.5, 6.0), (float("inf"), 9.0))
    assert (ttft.count, ttft.sum) == (9, 3.75)


def test_an_unknown_server_is_told_plainly() -> None:
    reading = read_exposition("up 1\n")
    assert reading.notes == [
        "no inference-server metrics found: not vLLM, SGLang, llama.cpp or TRT-LLM "
        "(or vLLM started with --disable-log-stats)"]


def test_a_broken_line_in_a_metric_kvtop_does_not_read_is_not_held_against_the_server() -> None:
    text = ('python_gc_objects_collected_total{generation="0" 17\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 1\n')
    reading = read_exposition(text)
    assert (reading.parse_errors, reading.notes) == (0, [])
    assert only(reading).running == 1


@pytest.mark.parametrize("body, names", [
    ('vllm:num_requests_running{model_name="m"} 1\n', vllm.NAMES),
    ('sglang:num_running_reqs{model_name="q"} 1\n', sglang.NAMES),
    ("llamacpp:requests_processing 1\n", llamacpp.NAMES),
    ("up 1\n", WANTED),
])
def test_a_narrowed_read_asks_for_the_names_of_the_recognised_server(body: str,
                                                                      names: frozenset) -> None:
    assert names_for(body) == names


# --- values no pool has, and more engines than kvtop shows ----------------------------------

@pytest.mark.parametrize(("text", "refused"), [
    ('sglang:num_running_reqs{model_name="q"} 1\nsglang:max_total_num_tokens{model_name="q"} '
     "1e300\n", "sglang:max_total_num_tokens is not a usable count"),
    (trt("t", max=float("inf"), used=1.0), "nv_trt_llm_kv_cache_block_metrics max=inf is not a "
                                           "usable count"),
    (trt("t", max=100.0, tokens_per=1e300), "nv_trt_llm_kv_cache_block_metrics "
                                            "tokens_per=1e+300 is not a usable count"),
])
def test_a_capacity_no_pool_has_refuses_the_answer_and_names_it(text: str, refused: str) -> None:
    reading = read_exposition(text)
    assert reading.engines == [] and reading.refused == refused


@pytest.mark.parametrize("kind", ["sglang", "trtllm"])
def test_engines_past_the_cap_are_counted(kind: str) -> None:
    count = MAX_ENGINES + 3
    if kind == "sglang":
        text = "".join(f'sglang:num_running_reqs{{model_name="q",dp_rank="{i}"}} 1\n'
                       for i in range(count))
    else:
        text = "".join(trt(f"model-{i}", max=10.0) for i in range(count))
    reading = read_exposition(text)
    assert (reading.kind, len(reading.engines), reading.engines_over_cap) == (
        kind, MAX_ENGINES, 3)

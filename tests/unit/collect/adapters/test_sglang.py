"""What kvtop reads from SGLang: ranks of one engine as one pool, capacity from
max_total_num_tokens, prefix hits from cached tokens, data-parallel ranks apart, the
newer ITL histogram first."""

from __future__ import annotations

from kvtop.collect.adapters import read_exposition
from tests.scenarios.exposition import sglang_histogram, sglang_ranks
from tests.scenarios.readings import only


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


def test_sglang_itl_new_name_is_preferred_over_the_old() -> None:
    text = ('sglang:num_running_reqs{model_name="q"} 1\n'
            + sglang_histogram("sglang:inter_token_latency_seconds", 9)
            + sglang_histogram("sglang:time_per_output_token_seconds", 4))
    e = only(read_exposition(text))
    assert e.itl is not None and e.itl.count == 9

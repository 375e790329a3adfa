"""What kvtop reads from llama.cpp's server: KV usage and tokens where the build exports
them, a plain note where it does not, cached prompt tokens as prefix hits."""

from __future__ import annotations

from kvtop.collect.adapters import read_exposition
from tests.scenarios.readings import only


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

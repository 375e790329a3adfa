"""What kvtop reads from Triton's TensorRT-LLM backend: usage as used over max blocks,
capacity in tokens, one engine per model, a series without its kind label left alone."""

from __future__ import annotations

from kvtop.collect.adapters import read_exposition
from tests.scenarios.exposition import trt
from tests.scenarios.readings import only


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

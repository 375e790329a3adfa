"""Every real scrape in tests/fixtures/metrics, read through kvtop's adapters. The
expected values were read off each file by hand (the lines are quoted in comments)."""

from __future__ import annotations

import pytest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.reading import EngineReading, ServerReading
from tests.paths import FIXTURES, fixture_text


def only_engine(reading: ServerReading) -> EngineReading:
    assert len(reading.engines) == 1, reading.engines
    return reading.engines[0]


def test_every_fixture_is_covered_here() -> None:
    names = {p.name for p in FIXTURES.glob("*.txt")}
    assert names <= set(EXPECTED) | {"INDEX.md"}, names - set(EXPECTED)


def check_033_under_load(e: EngineReading) -> None:
    # kv_cache_usage_perc{engine="0",model_name="twin-llama"} 0.9816360601001669
    assert e.kv_usage == pytest.approx(0.9816360601001669)
    # num_gpu_blocks="600": 0.33 divides by 600 - 1 (the null block)
    assert e.blocks_total == 599 and e.idle_floor_blocks == 0
    assert e.kv_usage * e.blocks_total == pytest.approx(588)  # 11 of 599 free (INDEX.md)
    assert (e.running, e.waiting) == (30, 149)
    assert e.preemptions_total == 6
    assert (e.prefix_queries_total, e.prefix_hits_total, e.prefix_unit) == (17016, 6400, "tokens")
    assert e.finished_total["length"] == 21
    assert e.ttft is not None and e.ttft.count == 51  # time_to_first_token_seconds_count 51.0


def check_033_idle(e: EngineReading) -> None:
    assert e.kv_usage == 0.0 and e.blocks_total == 599
    assert (e.running, e.waiting) == (0, 0)
    assert (e.prefix_queries_total, e.prefix_hits_total) == (65720, 24320)
    assert e.preemptions_total == 68 and e.finished_total["length"] == 200


def check_033_leaking(e: EngineReading) -> None:
    assert e.kv_usage == pytest.approx(0.8278278278278278)  # as written in the file
    assert e.blocks_total == 999 and round(e.kv_usage * e.blocks_total) == 999 - 172
    assert (e.running, e.waiting) == (0, 0)
    assert (e.prefix_queries_total, e.prefix_hits_total) == (52105, 0)


def check_0101_under_load(e: EngineReading) -> None:
    # both gpu_cache_usage_perc and kv_cache_usage_perc 0.9816666666666667: not added
    assert e.kv_usage == pytest.approx(0.9816666666666667)
    # 0.10.1 divides by num_gpu_blocks and counts the null block as used
    assert e.blocks_total == 600 and e.idle_floor_blocks == 1
    # prefix_cache_* and gpu_prefix_cache_* both 35165 / 16000: counted once
    assert (e.prefix_queries_total, e.prefix_hits_total) == (35165, 16000)
    assert (e.running, e.waiting, e.preemptions_total) == (30, 149, 6)


def check_0101_idle(e: EngineReading) -> None:
    assert e.kv_usage * e.blocks_total == pytest.approx(1)  # exactly the null block
    assert (e.prefix_queries_total, e.prefix_hits_total) == (269733, 124800)


def check_0101_leaking(e: EngineReading) -> None:
    assert e.blocks_total == 1000 and round(e.kv_usage * e.blocks_total) == 1000 - 172


def check_029(e: EngineReading) -> None:
    assert e.model == "qwen2.5-1.5b" and e.engine == "0"
    assert e.kv_usage == 0.0
    assert e.blocks_total == 20183 and e.block_size == 16  # num_gpu_blocks="20184"
    assert e.tokens_total == 322944  # kv_cache_size_tokens, here also 20184 blocks x 16
    assert (e.prefix_queries_total, e.prefix_hits_total) == (530, 432)
    assert (e.prompt_tokens_total, e.generation_tokens_total) == (530, 584)
    assert e.preemptions_total == 0 and e.finished_total["length"] == 10
    assert e.prefix_caching is True


def check_v0(e: EngineReading) -> None:
    assert e.model == "Qwen/Qwen2.5-Coder-1.5B-Instruct" and e.engine is None
    assert e.kv_usage == 0.0 and e.cpu_kv_usage == 0.0 and e.swapped == 0
    assert e.blocks_total == 81767 and e.tokens_total == 81767 * 16
    # gpu_prefix_cache_hit_rate -1.0 and enable_prefix_caching="False"
    assert e.prefix_caching is False and e.reported_hit_rate is None
    assert e.prefix_queries_total is None  # V0 has no prefix counters: not exported, not 0
    assert (e.prompt_tokens_total, e.generation_tokens_total) == (148, 955)
    assert e.finished_total == {"stop": 4}
    assert e.ttft is None  # the doc sample is cut before the TTFT histogram


def check_sglang(e: EngineReading) -> None:
    assert e.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert e.kv_usage == 0.28 and e.tokens_used == 123859
    assert (e.running, e.waiting) == (162, 2826)
    assert e.tokens_total is None and e.blocks_total is None  # no max_total_num_tokens
    assert e.reported_hit_rate == pytest.approx(0.007507552643049313)
    assert e.prompt_tokens_total == 8128902 and e.generation_tokens_total == 7557572
    assert e.ttft is not None and e.ttft.count == 11008
    assert e.itl is not None and e.itl.count == 7400757  # time_per_output_token (<= 0.4.3)


def check_llamacpp(e: EngineReading) -> None:
    assert (e.running, e.waiting) == (0, 0)
    assert (e.prompt_tokens_total, e.generation_tokens_total) == (33065, 7801)
    assert e.kv_usage is None  # this build exports no KV occupancy


def check_trtllm(e: EngineReading) -> None:
    assert e.model == "tensorrt_llm"
    assert e.blocks_total == 6239 and e.block_size == 64
    assert e.kv_usage == pytest.approx(1 / 6239)  # used/max, not the inconsistent fraction
    assert (e.running, e.waiting) == (0, 1)


EXPECTED = {
    "vllm-0.33.0-v1-twin-under-load.txt": ("vllm", "0.10.2+", check_033_under_load),
    "vllm-0.33.0-v1-twin-idle.txt": ("vllm", "0.10.2+", check_033_idle),
    "vllm-0.33.0-v1-twin-leaking-idle.txt": ("vllm", "0.10.2+", check_033_leaking),
    "vllm-0.10.1.1-v1-twin-under-load.txt": ("vllm", "0.9.2+", check_0101_under_load),
    "vllm-0.10.1.1-v1-twin-idle.txt": ("vllm", "0.9.2+", check_0101_idle),
    "vllm-0.10.1.1-v1-twin-leaking-idle.txt": ("vllm", "0.9.2+", check_0101_leaking),
    "vllm-0.29.0-v1-inferstack-t4-capture.txt": ("vllm", "0.10.2+", check_029),
    "vllm-0.7.x-v0-aibrix-runtime-doc.txt": ("vllm", "V0", check_v0),
    "sglang-0.3.x-docs-production-metrics.txt": ("sglang", None, check_sglang),
    "llamacpp-2025-build-zh-doc.txt": ("llamacpp", None, check_llamacpp),
    "trtllm-triton-inflight-batcher-readme.txt": ("trtllm", None, check_trtllm),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture(name: str) -> None:
    kind, version, check = EXPECTED[name]
    reading = read_exposition(fixture_text(name))
    assert reading.kind == kind
    assert reading.version == version
    assert reading.parse_errors == 0
    check(only_engine(reading))


def test_version_from_server_overrides_inference() -> None:
    text = fixture_text("vllm-0.10.1.1-v1-twin-idle.txt")
    # a 0.10.1 server says so on /version: null block counted, denominator 600
    e = only_engine(read_exposition(text, version="0.10.1.1"))
    assert (e.blocks_total, e.idle_floor_blocks) == (600, 1)
    e = only_engine(
        read_exposition(fixture_text("vllm-0.29.0-v1-inferstack-t4-capture.txt"), version="0.29.0")
    )
    assert (e.blocks_total, e.idle_floor_blocks) == (20183, 0)


def test_kv_cache_size_tokens_wins_over_blocks_times_block_size() -> None:
    # The 0.29 capture's two agree (322944 = 20184 x 16); where vLLM sizes the cache
    # otherwise (hybrid attention, sliding windows) its own token count is the one shown.
    text = fixture_text("vllm-0.29.0-v1-inferstack-t4-capture.txt")
    label = 'kv_cache_size_tokens="322944",'
    assert text.count(label) == 1
    sized = only_engine(read_exposition(text.replace(label, 'kv_cache_size_tokens="300000",')))
    assert (sized.tokens_total, sized.blocks_total) == (300000, 20183)
    unsized = only_engine(read_exposition(text.replace(label, "")))
    assert unsized.tokens_total == 20184 * 16  # num_gpu_blocks x block_size, null block too


def test_data_parallel_engines_are_separate_rows() -> None:
    text = fixture_text("vllm-0.33.0-v1-twin-under-load.txt")
    engine_1 = "\n".join(
        line.replace('engine="0"', 'engine="1"')
        for line in text.splitlines()
        if line and not line.startswith("#")
    )
    reading = read_exposition(text + "\n" + engine_1)
    assert [(e.model, e.engine) for e in reading.engines] == [
        ("twin-llama", "0"),
        ("twin-llama", "1"),
    ]
    assert all(e.blocks_total == 599 for e in reading.engines)  # cache_config per engine
    assert [e.running for e in reading.engines] == [30, 30]  # not summed across engines


def test_unknown_server_is_labelled_not_zeroed() -> None:
    reading = read_exposition("# TYPE http_requests_total counter\nhttp_requests_total 7\n")
    assert reading.kind == "unknown" and reading.engines == []
    assert "no inference-server metrics" in reading.notes[0]


def test_vllm_without_log_stats_has_no_engines() -> None:
    reading = read_exposition('python_info{version="3.12"} 1\n')
    assert reading.kind == "unknown"


def test_garbage_lines_are_counted_and_rest_kept() -> None:
    text = fixture_text("vllm-0.33.0-v1-twin-idle.txt")
    broken = text.replace(
        'vllm:num_requests_running{engine="0",model_name="twin-llama"} 0.0',
        'vllm:num_requests_running{engine="0",model_name="twin-llama} 0.0',
    )
    reading = read_exposition(broken)
    assert reading.parse_errors == 1 and "malformed" in reading.notes[-1]
    e = only_engine(reading)
    assert e.running is None  # the broken line is missing, not 0
    assert e.waiting == 0 and e.blocks_total == 599


def test_nan_gauge_is_unknown() -> None:
    text = fixture_text("vllm-0.33.0-v1-twin-idle.txt").replace(
        'vllm:kv_cache_usage_perc{engine="0",model_name="twin-llama"} 0.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="twin-llama"} NaN',
    )
    assert only_engine(read_exposition(text)).kv_usage is None

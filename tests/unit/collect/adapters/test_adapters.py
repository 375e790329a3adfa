"""Every real scrape in tests/fixtures/metrics, read through kvtop's adapters. The
expected values were read off each file by hand (the lines are quoted in comments).

``adapt``: one answer in, one ServerReading out, never an exception. A body over the
parser's limits, too many series handed over by Prometheus, a value no pool has, or an
adapter bug each refuse that target's answer with a message that says why, keeping the
server version; skipped lines and impossible values are said in the notes.

The rules every adapter shares: rows in a stable order, gauges and counts over several
series, histograms summed over other labels, the server recognised by its names, a
version from the server kept, engines past the cap counted."""

from __future__ import annotations

import logging
import math

import pytest

from kvtop.collect.adapters import (
    NOTED_VALUES,
    WANTED,
    adapt,
    llamacpp,
    names_for,
    read_exposition,
    sglang,
    vllm,
)
from kvtop.collect.adapters.common import MAX_ENGINES
from kvtop.collect.exposition import MAX_ERRORS, MAX_WANTED_LINES, Exposition, Sample
from kvtop.collect.reading import EngineReading, ServerReading
from tests.scenarios.exposition import sglang_ranks, trt
from tests.scenarios.readings import only
from tests.support.paths import FIXTURES, fixture_text

INF = math.inf


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


def check_033_served_residency(e: EngineReading) -> None:
    """The served twin with --kv-cache-metrics --kv-cache-metrics-sample 1.0 (INDEX.md)."""
    assert e.blocks_total == 299 and e.tokens_total == 4800  # num_gpu_blocks="300"
    # num_requests_waiting_by_reason ... reason="capacity"} 0.0 and "deferred"} 0.0
    assert e.waiting_by_reason == {"capacity": 0.0, "deferred": 0.0}
    assert e.sleep_state == "awake"  # sleep_state="awake"} 1.0, the other two 0.0
    assert e.kv_fetch_by_stage is None  # not a KV-transfer consumer: not exported, not 0
    assert e.admission_rejections_total == {"max_num_queued_reqs": 0.0,
                                            "max_num_queued_tokens": 0.0}
    # prompt_tokens_by_source_total local_compute 37178, local_cache_hit 28160, external 0
    assert e.prompt_tokens_by_source_total == {
        "local_compute": 37178.0, "local_cache_hit": 28160.0, "external_kv_transfer": 0.0}
    assert e.cached_tokens_by_tier_total == {"device": 28160.0, "host": 0.0, "p2p": 0.0,
                                             "disk": 0.0, "external_unspecified": 0.0}
    assert (e.external_queries_total, e.external_hits_total) == (0.0, 0.0)
    assert e.prompt_lengths is not None and (e.prompt_lengths.count, e.prompt_lengths.sum) == (
        200.0, 65338.0)
    assert e.kv_computed is not None and e.kv_computed.sum == 37178.0
    assert e.residency == "on"
    assert e.block_lifetime is not None and e.block_idle is not None
    # kv_block_lifetime_seconds_bucket{le="0.01"} 26.0 ... {le="+Inf"} 4631.0
    assert e.block_lifetime.buckets[3] == (0.01, 26.0) and e.block_lifetime.count == 4631
    assert e.block_idle.count == 4631
    assert e.block_reuse_gap is not None and e.block_reuse_gap.buckets[-1] == (INF, 87.0)


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
    "vllm-0.33.0-v1-twin-served-kv-cache-metrics.txt": ("vllm", "0.10.2+",
                                                        check_033_served_residency),
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


def test_a_body_the_parser_refused_is_refused_with_its_reason() -> None:
    body = "".join(f"vllm:num_requests_running{{engine=\"0\" {i}\n" for i in range(MAX_ERRORS + 1))
    reading = read_exposition(body, version="0.9.1")
    assert (reading.kind, reading.engines, reading.version) == ("unknown", [], "0.9.1")
    assert reading.refused is not None and "malformed lines" in reading.refused


def test_more_series_than_one_server_has_are_refused() -> None:
    samples = [Sample("vllm:num_requests_running", {"engine": str(i), "model_name": "m"}, 1.0)
               for i in range(MAX_WANTED_LINES + 1)]
    reading = adapt(Exposition(samples=samples), version="0.9.1")
    assert (reading.kind, reading.engines, reading.version) == ("unknown", [], "0.9.1")
    assert reading.refused == (f"{MAX_WANTED_LINES + 1:,} series; more than "
                               f"{MAX_WANTED_LINES:,} is not one server's")


def test_exactly_the_most_series_one_server_has_are_read() -> None:
    samples = [Sample("vllm:num_requests_running", {"engine": "0", "model_name": "m",
                                                     "n": str(i)}, 1.0)
               for i in range(MAX_WANTED_LINES)]
    reading = adapt(Exposition(samples=samples))
    assert reading.refused is None and reading.engines[0].running == MAX_WANTED_LINES


def test_a_value_no_pool_has_refuses_the_answer_and_keeps_the_version() -> None:
    body = ('vllm:num_requests_running{model_name="m"} 1\n'
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="inf"} 1\n')
    reading = read_exposition(body, version="0.9.1")
    assert (reading.kind, reading.engines, reading.version) == ("vllm", [], "0.9.1")
    assert reading.refused is not None and "num_gpu_blocks" in reading.refused


def test_an_adapter_bug_fails_that_answer_not_kvtop(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    def broken(expo: Exposition, version: str | None = None) -> None:
        raise KeyError("x" * 500)

    monkeypatch.setattr(sglang, "adapt", broken)
    with caplog.at_level(logging.ERROR, logger="kvtop.collect.adapters"):
        reading = read_exposition('sglang:num_running_reqs{model_name="q"} 1\n', version="0.5")
    assert (reading.kind, reading.engines, reading.version) == ("sglang", [], "0.5")
    assert reading.refused is not None
    cut = "'" + "x" * 119  # the exception's text, cut to 120 characters
    assert reading.refused == (f"kvtop could not read this answer (KeyError: {cut}); a bug in "
                               "kvtop, please report it")
    assert [r.getMessage() for r in caplog.records] == ["the sglang adapter failed"]


def test_an_unknown_server_says_what_kvtop_reads() -> None:
    reading = read_exposition("process_cpu_seconds_total 5\n", version="1.0")
    assert (reading.kind, reading.engines, reading.version, reading.refused) == (
        "unknown", [], "1.0", None)
    assert reading.notes == ["no inference-server metrics found: not vLLM, SGLang, llama.cpp or "
                             "TRT-LLM (or vLLM started with --disable-log-stats)"]


def test_skipped_lines_are_counted_and_the_first_one_named() -> None:
    body = ('vllm:num_requests_running{model_name="m"} 1\n'
            "vllm:num_requests_waiting{model_name=\"m\"} one\n"
            "vllm:num_requests_swapped{\n")
    reading = read_exposition(body)
    assert reading.parse_errors == 2
    assert reading.notes[-1].startswith("2 malformed line(s) skipped; first at line 2: ")


def usage_of(model: str, value: float) -> str:
    return f'vllm:kv_cache_usage_perc{{model_name="{model}",engine="0"}} {value}\n'


def test_exactly_three_impossible_values_are_all_named_and_none_more() -> None:
    body = "".join(usage_of(f"m{i}", 2.0) for i in range(NOTED_VALUES))
    reading = read_exposition(body)
    assert reading.impossible_values == NOTED_VALUES
    [note] = reading.notes
    assert note.count("kv_usage 2") == NOTED_VALUES and "more" not in note


def test_a_long_model_name_is_cut_to_60_characters_in_the_note() -> None:
    model = "a" * 70
    [note] = read_exposition(usage_of(model, 2.0)).notes
    assert note == f"impossible values left out: {'a' * 60}/0: kv_usage 2 (not within 0..1)"


def test_each_impossible_value_is_named_with_its_engine_unless_it_has_no_name() -> None:
    body = usage_of("m", 2.0) + 'vllm:num_requests_waiting{model_name="m",engine="0"} -1\n'
    [note] = read_exposition(body).notes
    assert note == ("impossible values left out: m/0: kv_usage 2 (not within 0..1); "
                    "m/0: waiting -1 (not a count)")
    # llama.cpp serves one model and names no engine
    [note] = read_exposition("llamacpp:requests_processing 1\n"
                             "llamacpp:kv_cache_usage_ratio 2\n").notes
    assert note == "impossible values left out: kv_usage 2 (not within 0..1)"


def test_a_version_from_the_server_is_kept() -> None:
    assert read_exposition(sglang_ranks(), version="0.5.6").version == "0.5.6"
    assert read_exposition("llamacpp:requests_processing 1\n", version="b1234").version == "b1234"
    text = 'nv_trt_llm_request_metrics{model="t",request_type="active"} 1\n'
    assert read_exposition(text, version="24.05").version == "24.05"
    assert read_exposition("up 1\n", version="9.9").version == "9.9"


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


# -- KV anatomy families (docs/kv-anatomy.md) ---------------------------------------------

RESIDENCY_FIXTURE = "vllm-0.33.0-v1-twin-served-kv-cache-metrics.txt"


def without_residency(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if "kv_block_" not in line) + "\n"


@pytest.mark.parametrize("version, state", [
    ("0.12.0", "off"),  # the first release with --kv-cache-metrics: the flag is off
    ("0.33.0", "off"),
    ("0.11.2", None),  # before it: not in this version, never "off"
    (None, None),  # an inferred era ("0.10.2+") cannot tell
])
def test_residency_without_the_histograms_is_off_only_where_the_version_has_them(
        version: str | None, state: str | None) -> None:
    text = without_residency(fixture_text(RESIDENCY_FIXTURE))
    e = only_engine(read_exposition(text, version=version))
    assert e.residency == state
    assert e.block_lifetime is None and e.block_idle is None and e.block_reuse_gap is None


def test_families_an_older_vllm_lacks_are_none_not_zero() -> None:
    e = only_engine(read_exposition(fixture_text("vllm-0.29.0-v1-inferstack-t4-capture.txt")))
    # 0.29 has waiting reasons and sources, but no tiers (0.32+) and no rejections (0.32+)
    assert e.cached_tokens_by_tier_total is None and e.admission_rejections_total is None
    e = only_engine(read_exposition(fixture_text("vllm-0.10.1.1-v1-twin-idle.txt")))
    assert (e.waiting_by_reason, e.prompt_tokens_by_source_total, e.sleep_state,
            e.residency, e.kv_computed) == (None, None, None, None, None)


def sleep_body(awake: float, offloaded: float, discarded: float) -> str:
    line = 'vllm:engine_sleep_state{{engine="0",model_name="m",sleep_state="{}"}} {}\n'
    return ('vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
            + line.format("awake", awake) + line.format("weights_offloaded", offloaded)
            + line.format("discard_all", discarded))


@pytest.mark.parametrize("values, state", [
    ((1.0, 0.0, 0.0), "awake"),
    ((0.0, 1.0, 0.0), "weights_offloaded"),
    ((0.0, 0.0, 1.0), "discard_all"),
    ((0.0, 1.0, 1.0), "discard_all"),  # the deepest level set wins
    ((0.0, 0.0, 0.0), None),  # none set: the server does not say
])
def test_the_sleep_state_is_the_deepest_level_set(values: tuple[float, float, float],
                                                 state: str | None) -> None:
    assert only_engine(read_exposition(sleep_body(*values))).sleep_state == state


def test_a_server_inventing_reasons_keeps_seven_and_sums_the_rest_as_other() -> None:
    lines = ['vllm:num_requests_running{engine="0",model_name="m"} 1.0']
    lines += [f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="m",'
              f'reason="r{i}{"x" * 60}"}} 1.0' for i in range(20)]
    reasons = only_engine(read_exposition("\n".join(lines) + "\n")).waiting_by_reason
    assert reasons is not None and len(reasons) == 8
    assert reasons["other"] == 13.0 and sum(reasons.values()) == 20.0
    assert all(len(name) <= 40 for name in reasons)


def test_kv_fetch_stages_are_read_per_engine() -> None:
    body = ('vllm:num_requests_running{engine="1",model_name="m"} 0.0\n'
            'vllm:num_requests_kv_fetch_by_stage{engine="1",model_name="m",'
            'stage="in_progress"} 3.0\n'
            'vllm:num_requests_kv_fetch_by_stage{engine="1",model_name="m",'
            'stage="waiting_to_start"} 2.0\n')
    e = only_engine(read_exposition(body))
    assert e.kv_fetch_by_stage == {"in_progress": 3.0, "waiting_to_start": 2.0}


@pytest.mark.parametrize("field, line", [
    ("waiting_by_reason",
     'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} -2.0'),
    ("cached_tokens_by_tier_total",
     'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="host"} -1.0'),
])
def test_a_negative_count_in_a_family_leaves_the_family_out(field: str, line: str) -> None:
    body = 'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n' + line + "\n"
    reading = read_exposition(body)
    assert getattr(only_engine(reading), field) is None
    assert reading.impossible_values == 1 and field in reading.notes[0]


def test_external_hits_above_lookups_are_left_out() -> None:
    body = ('vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
            'vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 10.0\n'
            'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 11.0\n')
    e = only_engine(read_exposition(body))
    assert (e.external_queries_total, e.external_hits_total) == (None, None)


def test_a_residency_histogram_going_down_is_left_out() -> None:
    text = fixture_text(RESIDENCY_FIXTURE).replace(
        'kv_block_lifetime_seconds_bucket{engine="0",le="0.02",model_name="twin-llama"} 110.0',
        'kv_block_lifetime_seconds_bucket{engine="0",le="0.02",model_name="twin-llama"} 1.0')
    e = only_engine(read_exposition(text, version="0.33.0"))
    assert e.block_lifetime is None and e.block_idle is not None


def test_llamacpp_deferred_requests_wait_for_a_slot() -> None:
    e = only_engine(read_exposition("llamacpp:requests_processing 4\n"
                                    "llamacpp:requests_deferred 3\n"))
    assert e.waiting_by_reason == {"slots": 3.0}
    e = only_engine(read_exposition("llamacpp:requests_processing 4\n"))
    assert e.waiting is None and e.waiting_by_reason is None


def test_sglang_evicted_tokens_are_read() -> None:
    body = ('sglang:num_running_reqs{model_name="m"} 1.0\n'
            'sglang:evicted_tokens_total{model_name="m",tp_rank="0"} 300.0\n'
            'sglang:evicted_tokens_total{model_name="m",tp_rank="1"} 300.0\n')
    assert only_engine(read_exposition(body)).evicted_tokens_total == 600.0

"""What kvtop reads from a vLLM server of each era (shared/reference/vllm-metrics.md §1a, §1b):
the pool and its idle floor by release, prefix counters in the right unit and never counted
twice, V0's hit-rate gauge, finish reasons, latency histograms under their old and new names.

LoRA adapters from vLLM's ``lora_requests_info``, on a real scrape with the gauge written
the way vLLM 0.33 writes it (vllm/v1/metrics/loggers.py): prometheus_client's Gauge with
labels max_lora, waiting_lora_adapters and running_lora_adapters (names joined by ","),
set to the current time at every stats interval; a label set, once made, is never removed,
so a scrape carries every set the server ever had, the newest with the latest time."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.adapters.common import MAX_COUNT, MAX_ENGINES
from kvtop.collect.adapters.vllm import NAMES
from kvtop.collect.adapters.vllm import NAMES as VLLM_NAMES
from kvtop.collect.reading import EngineReading, LoraInfo, ServerReading
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker
from tests.support.paths import fixture_text

OLD_HELP_BLOCKS = ("# HELP vllm:gpu_prefix_cache_queries GPU prefix cache queries, in terms of "
                   "number of queried blocks.")


OLD_HELP_TOKENS = ("# HELP vllm:gpu_prefix_cache_queries GPU prefix cache queries, in terms of "
                   "number of queried tokens.")


def only(reading: ServerReading) -> EngineReading:
    assert len(reading.engines) == 1, reading.engines
    return reading.engines[0]


def v1_08(config: str = 'block_size="16",num_gpu_blocks="1000",enable_prefix_caching="True"',
          help_line: str = OLD_HELP_BLOCKS) -> str:
    """A V1 0.8.x scrape: no `engine` label, the old usage and prefix names (blocks)."""
    return "\n".join([
        help_line,
        'vllm:gpu_prefix_cache_queries_total{model_name="m"} 120.0',
        'vllm:gpu_prefix_cache_hits_total{model_name="m"} 30.0',
        'vllm:num_requests_running{model_name="m"} 2.0',
        'vllm:num_requests_waiting{model_name="m"} 0.0',
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.1',
        f"vllm:cache_config_info{{{config}}} 1.0",
    ]) + "\n"


def v1_090() -> str:
    """0.9.0/0.9.1: the `engine` label, still the old names (now tokens), one cache_config
    without an engine label."""
    return "\n".join([
        OLD_HELP_TOKENS,
        'vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 500.0',
        'vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 200.0',
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25',
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="800"} 1.0',
    ]) + "\n"


def v0(hit_rate: str) -> str:
    return "\n".join([
        'vllm:num_requests_running{model_name="m"} 0.0',
        'vllm:num_requests_swapped{model_name="m"} 0.0',
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.0',
        f'vllm:gpu_prefix_cache_hit_rate{{model_name="m"}} {hit_rate}',
        'vllm:gpu_prefix_cache_hit_rate{model_name="other"} 0.9',  # no engine of that name
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="500"} 1.0',
    ]) + "\n"


@pytest.mark.parametrize("version, blocks_total, idle_floor", [
    ("0.8.0", 1000, 0),  # no null block yet
    ("0.8.2", 1000, 0),
    ("v0.8.2", 1000, 0),  # /version with a leading v
    ("0.8.3", 1000, 1),  # the null block, still in the denominator
    ("0.9.0", 1000, 1),
    ("0.10.1", 1000, 1),
    ("0.10.2", 999, 0),  # the denominator leaves the null block out
    ("0.11.0", 999, 0),
])
def test_the_server_version_decides_the_pool(version: str, blocks_total: int,
                                              idle_floor: int) -> None:
    e = only(read_exposition(v1_08(), version=version))
    assert (e.blocks_total, e.idle_floor_blocks) == (blocks_total, idle_floor)


@pytest.mark.parametrize("version", ["0.8.2", "0.9.0", "0.10.1", "0.11.0"])
def test_a_floor_from_the_servers_own_version_is_exact(version: str) -> None:
    assert only(read_exposition(v1_08(), version=version)).idle_floor_exact is True
    assert only(read_exposition(v0("0.5"), version=version)).idle_floor_exact is True


def test_without_a_version_only_names_that_fix_the_floor_make_it_exact() -> None:
    # V0's names: no null block ever; the new ITL name: 0.10.2+, whose usage leaves it out
    assert only(read_exposition(v0("0.5"))).idle_floor_exact is True
    v1_new = v1_090() + "\n".join(histogram("vllm:inter_token_latency_seconds", 4)) + "\n"
    reading = read_exposition(v1_new)
    assert reading.version == "0.10.2+"
    assert (only(reading).blocks_total, only(reading).idle_floor_blocks,
            only(reading).idle_floor_exact) == (799, 0, True)
    # 0.7+ spans 0.8.0-0.8.2 (no null block) and 0.8.3-0.10.1 (one): the larger, assumed
    assert only(read_exposition(v1_08())).idle_floor_exact is False


@pytest.mark.parametrize("label", ["0.7+", " 0.7+ ", "0.10.2+", "0.9.2+"])
def test_an_era_label_kvtop_inferred_is_not_a_version(label: str) -> None:
    # a recording or a replay carries the label kvtop showed when the server had no /version:
    # read back, it is still a guess, never the release it names
    e = only(read_exposition(v1_08(), version=label))
    assert (e.blocks_total, e.idle_floor_blocks, e.idle_floor_exact) == (1000, 1, False)


@pytest.mark.parametrize("version", ["main", "dev", "unknown", "v", "0", "x0.10.2"])
def test_a_version_with_no_release_number_is_no_version(version: str) -> None:
    # /version of a source build or a proxy: read as if there were none, never a failure
    reading = read_exposition(v1_08(), version=version)
    assert reading.version == version and reading.refused is None
    e = only(reading)
    assert (e.blocks_total, e.idle_floor_blocks, e.idle_floor_exact) == (1000, 1, False)


def test_without_a_version_an_08_scrape_is_read_as_holding_the_null_block() -> None:
    reading = read_exposition(v1_08())
    assert reading.version == "0.7+"
    assert (only(reading).blocks_total, only(reading).idle_floor_blocks) == (1000, 1)


def test_a_v0_engine_never_has_a_null_block() -> None:
    for version in (None, "0.8.5", "0.9.0"):
        e = only(read_exposition(v0("0.5"), version=version))
        assert (e.blocks_total, e.idle_floor_blocks) == (500, 0), version


def test_the_release_range_is_inferred_from_the_names() -> None:
    assert read_exposition(v1_090()).version == "0.9.0+"
    with_new_usage = v1_090() + 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
    assert read_exposition(with_new_usage).version == "0.9.2+"
    assert read_exposition(v1_08()).version == "0.7+"


def test_capacity_labels_of_none_or_zero_are_unknown_not_numbers() -> None:
    e = only(read_exposition(v1_08('block_size="16",num_gpu_blocks="None"')))
    assert (e.blocks_total, e.idle_floor_blocks, e.tokens_total) == (None, 0, None)
    assert e.block_size == 16 and e.kv_usage == pytest.approx(0.1)
    e = only(read_exposition(v1_08('block_size="0",num_gpu_blocks="0"')))
    assert (e.blocks_total, e.block_size, e.tokens_total) == (None, None, None)
    e = only(read_exposition(v1_08('block_size="1",num_gpu_blocks="1000"')))
    assert (e.block_size, e.tokens_total) == (1, 1000)


@pytest.mark.parametrize("blocks", ["inf", "1e308", "9" * 50])
def test_a_capacity_no_pool_has_refuses_the_answer_and_names_the_label(blocks: str) -> None:
    reading = read_exposition(v1_08(f'block_size="16",num_gpu_blocks="{blocks}"'))
    assert reading.engines == []
    assert reading.refused == (f"vllm:cache_config_info num_gpu_blocks={blocks[:40]!r} is not "
                               "a usable count")


def test_the_largest_capacity_taken_is_2_to_the_40() -> None:
    e = only(read_exposition(v1_08(f'block_size="1",num_gpu_blocks="{MAX_COUNT}"')))
    assert e.blocks_total == MAX_COUNT


def test_engines_past_the_cap_are_counted_and_said() -> None:
    body = "".join(f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1.0\n'
                   for i in range(MAX_ENGINES + 7))
    reading = read_exposition(body)
    assert len(reading.engines) == MAX_ENGINES and reading.engines_over_cap == 7
    assert any(note.startswith(f"too many engines: {MAX_ENGINES + 7}") for note in reading.notes)


def test_the_servers_own_token_capacity_wins_over_blocks_times_block_size() -> None:
    # hybrid models size their KV cache in tokens that are not blocks x block size
    config = 'block_size="16",num_gpu_blocks="1000",kv_cache_size_tokens="12000"'
    assert only(read_exposition(v1_08(config))).tokens_total == 12000
    assert only(read_exposition(v1_08())).tokens_total == 16000


def test_cache_config_labels_are_kept_and_prefix_caching_read_from_them() -> None:
    e = only(read_exposition(v1_08('block_size="16",num_gpu_blocks="1000",'
                                   'enable_prefix_caching="False",cache_dtype="fp8"')))
    assert e.prefix_caching is False
    assert e.cache_config == {"block_size": "16", "num_gpu_blocks": "1000",
                              "enable_prefix_caching": "False", "cache_dtype": "fp8"}
    e = only(read_exposition(v1_08('block_size="16",num_gpu_blocks="1000"')))
    assert e.prefix_caching is None  # the server does not say


def test_no_cache_config_means_no_capacity_and_no_error() -> None:
    text = ('vllm:num_requests_running{model_name="m"} 2.0\n'
            'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n')
    e = only(read_exposition(text))
    assert (e.kv_usage, e.blocks_total, e.block_size, e.cache_config) == (0.5, None, None, {})


def test_one_cache_config_without_an_engine_label_applies_to_every_engine() -> None:
    e = only(read_exposition(v1_090()))
    assert (e.engine, e.blocks_total, e.block_size) == ("0", 800, 16)


def test_each_data_parallel_engine_gets_its_own_cache_config() -> None:
    text = "\n".join([
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="600"} 1.0',
        'vllm:cache_config_info{block_size="32",engine="1",num_gpu_blocks="900"} 1.0',
    ]) + "\n"
    engines = read_exposition(text, version="0.33.0").engines
    assert [(e.engine, e.blocks_total, e.block_size) for e in engines] == [
        ("0", 599, 16), ("1", 899, 32)]


@pytest.mark.parametrize("name", ["vllm:num_requests_running", "vllm:num_requests_waiting",
                                  "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                                  "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"])
def test_an_engine_is_recognised_from_any_of_its_core_series(name: str) -> None:
    reading = read_exposition(f'{name}{{engine="0",model_name="m"}} 0.5\n')
    assert [(e.model, e.engine) for e in reading.engines] == [("m", "0")]
    assert reading.notes == []


def test_a_vllm_server_with_no_engine_series_says_why() -> None:
    reading = read_exposition('vllm:cache_config_info{block_size="16"} 1.0\n')
    assert (reading.kind, reading.engines) == ("vllm", [])
    assert reading.notes == ["vLLM without engine series (started with --disable-log-stats?)"]


def test_old_prefix_counters_before_090_count_blocks() -> None:
    e = only(read_exposition(v1_08()))
    assert (e.prefix_queries_total, e.prefix_hits_total, e.prefix_unit) == (120, 30, "blocks")


def test_old_prefix_counters_read_without_help_text_still_count_blocks() -> None:
    # through Prometheus there is no HELP: the release range alone decides
    e = only(read_exposition(v1_08(help_line="")))
    assert e.prefix_unit == "blocks"


def test_old_prefix_counters_from_090_count_tokens() -> None:
    e = only(read_exposition(v1_090()))
    assert (e.prefix_queries_total, e.prefix_hits_total, e.prefix_unit) == (500, 200, "tokens")


def test_new_prefix_counters_are_preferred_and_never_added_to_the_old() -> None:
    # 0.9.2 - 0.11 export both names; the old ones may lag or be hidden
    text = v1_090() + "\n".join([
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 700.0',
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 350.0',
    ]) + "\n"
    e = only(read_exposition(text))
    assert (e.prefix_queries_total, e.prefix_hits_total, e.prefix_unit) == (700, 350, "tokens")


def test_queries_without_a_hits_series_are_zero_hits() -> None:
    text = ('vllm:prefix_cache_queries_total{engine="0",model_name="m"} 40.0\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n')
    e = only(read_exposition(text))
    assert (e.prefix_queries_total, e.prefix_hits_total) == (40, 0.0)


def test_v0_hit_rate_gauge_is_the_lifetime_rate_and_says_caching_is_on() -> None:
    e = only(read_exposition(v0("0.42")))
    assert (e.prefix_caching, e.reported_hit_rate) == (True, 0.42)


def test_v0_hit_rate_of_zero_is_caching_on_with_no_hits_yet() -> None:
    e = only(read_exposition(v0("0.0")))
    assert (e.prefix_caching, e.reported_hit_rate) == (True, 0.0)


def test_v0_hit_rate_of_minus_one_is_caching_off() -> None:
    reading = read_exposition(v0("-1.0"))
    e = only(reading)
    assert (e.prefix_caching, e.reported_hit_rate) == (False, None)
    assert (reading.impossible_values, reading.notes) == (0, [])  # -1 is a setting, not a fault


def test_finished_counts_of_one_reason_are_added_across_series() -> None:
    text = "\n".join([
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
        # two API servers (or re-exporters) each with their own series of one reason
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m",server="a"} 5',
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m",server="b"} 7',
        'vllm:request_success_total{engine="0",model_name="m"} 2',  # no reason label
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} NaN',
        'vllm:request_success_total{engine="9",finished_reason="stop",model_name="m"} 1',
    ]) + "\n"
    reading = read_exposition(text)
    assert only(reading).finished_total == {"stop": 12, "unknown": 2}


def histogram(name: str, count: int, engine: str = "0") -> list[str]:
    labels = f'engine="{engine}",model_name="m"'
    return [f'{name}_bucket{{{labels},le="0.1"}} {count}',
            f'{name}_bucket{{{labels},le="+Inf"}} {count}',
            f"{name}_count{{{labels}}} {count}", f"{name}_sum{{{labels}}} 0.5"]


def test_itl_is_read_from_the_new_name_when_the_server_has_it() -> None:
    # 0.10.2 - 0.14 export both; the old one is deprecated and may be hidden or frozen
    text = "\n".join(['vllm:num_requests_running{engine="0",model_name="m"} 1.0',
                      *histogram("vllm:inter_token_latency_seconds", 40),
                      *histogram("vllm:time_per_output_token_seconds", 7)]) + "\n"
    e = only(read_exposition(text))
    assert e.itl is not None and e.itl.count == 40


def test_itl_is_read_from_the_old_name_on_older_servers() -> None:
    text = "\n".join(['vllm:num_requests_running{engine="0",model_name="m"} 1.0',
                      *histogram("vllm:time_per_output_token_seconds", 7),
                      *histogram("vllm:time_to_first_token_seconds", 3),
                      *histogram("vllm:e2e_request_latency_seconds", 2)]) + "\n"
    e = only(read_exposition(text))
    assert e.itl is not None and e.itl.count == 7
    assert e.ttft is not None and e.ttft.count == 3
    assert e.e2e is not None and e.e2e.count == 2


def test_a_histogram_of_an_engine_without_other_series_is_ignored() -> None:
    text = "\n".join(['vllm:num_requests_running{engine="0",model_name="m"} 1.0',
                      *histogram("vllm:time_to_first_token_seconds", 3, engine="5")]) + "\n"
    e = only(read_exposition(text))
    assert e.ttft is None


def test_usage_of_one_engine_in_several_series_is_their_maximum_not_their_sum() -> None:
    # one pool reported once per worker (tensor-parallel ranks, a re-exporter's extra labels)
    text = "\n".join([
        'vllm:kv_cache_usage_perc{engine="0",model_name="m",rank="0"} 0.4',
        'vllm:kv_cache_usage_perc{engine="0",model_name="m",rank="1"} 0.6',
        'vllm:num_requests_running{engine="0",model_name="m",rank="0"} 3.0',
    ]) + "\n"
    assert only(read_exposition(text)).kv_usage == 0.6


def lora_gauge(max_lora: str, running: str = "", waiting: str = "") -> str:
    return (f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters="{running}",'
            f'waiting_lora_adapters="{waiting}"}} 1.7672256e+09\n')


def test_lora_on_with_no_adapter_loaded_is_still_lora_on() -> None:
    e = only(read_exposition(v1_090() + lora_gauge("4")))
    assert e.lora == LoraInfo(4, (), ())


def test_lora_adapters_are_shown_even_when_max_lora_is_unreadable() -> None:
    e = only(read_exposition(v1_090() + lora_gauge("None", running="sql", waiting="chat,sum")))
    assert e.lora == LoraInfo(None, ("sql",), ("chat", "sum"))
    assert only(read_exposition(v1_090() + lora_gauge("None"))).lora is None


UNDER_LOAD = "vllm-0.33.0-v1-twin-under-load.txt"


T0 = 1_767_225_600.0


def lora_gauge_text(history: list[tuple[list[str], list[str]]], max_loras: int = 4) -> str:
    """The gauge after vLLM logged each (running, waiting) adapter set in turn."""
    registry = CollectorRegistry()
    gauge = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                  labelnames=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                  registry=registry, multiprocess_mode="sum")
    for second, (running, waiting) in enumerate(history):
        # set_to_current_time() is set(time.time()): explicit times keep the order certain
        gauge.labels(max_lora=max_loras, waiting_lora_adapters=",".join(waiting),
                     running_lora_adapters=",".join(running)).set(T0 + second)
    return generate_latest(registry).decode()


def scrape_with_lora(history: list[tuple[list[str], list[str]]]) -> str:
    return fixture_text(UNDER_LOAD) + lora_gauge_text(history)


def test_the_newest_label_set_is_what_runs_now() -> None:
    text = scrape_with_lora([
        (["sql-lora"], []),
        (["sql-lora", "chat-lora"], ["summarise-lora"]),
        (["chat-lora"], []),  # now: the other two finished
    ])
    assert text.count("vllm:lora_requests_info{") == 3  # old label sets stay in the scrape
    [engine] = read_exposition(text).engines
    assert engine.lora == LoraInfo(4, ("chat-lora",), ())


def test_several_adapters_running_and_waiting() -> None:
    [engine] = read_exposition(scrape_with_lora([
        (["a"], []), (["a", "b", "c"], ["d", "e"])])).engines
    assert engine.lora == LoraInfo(4, ("a", "b", "c"), ("d", "e"))


def test_no_lora_when_the_server_has_it_off() -> None:
    [engine] = read_exposition(fixture_text(UNDER_LOAD)).engines  # no series at all
    assert engine.lora is None
    # V0 always wrote the gauge: max_lora 0 and no adapter is LoRA off, not "0 adapters"
    [v0] = read_exposition(fixture_text("vllm-0.7.x-v0-aibrix-runtime-doc.txt")).engines
    assert v0.lora is None


def test_lora_reaches_the_engine_stats_and_the_narrowed_read_asks_for_it() -> None:
    assert "vllm:lora_requests_info" in NAMES  # prometheus_client's name[] filter keeps it
    tracker = TargetTracker(Target.from_spec("h:8000"))
    tracker.update(read_scrape(Scrape(tracker.state.target, T0,
                          scrape_with_lora([(["sql-lora"], ["chat-lora"])]))))
    [stats] = tracker.state.engines
    assert stats.lora == LoraInfo(4, ("sql-lora",), ("chat-lora",))


def test_the_narrowed_scrape_asks_for_the_sums_not_the_buckets() -> None:
    # ~10 KB for the families kvtop reads: the sums are one sample each, the buckets ~20
    assert {"vllm:request_prompt_tokens_sum", "vllm:request_generation_tokens_sum",
            "vllm:num_requests_waiting_by_reason"} <= VLLM_NAMES
    assert "vllm:request_prompt_tokens_bucket" not in VLLM_NAMES

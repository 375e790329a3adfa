"""The rendered /metrics text: parseable, named and labelled like the real servers."""

from __future__ import annotations

import gc
import math
import platform
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from kvtop.collect.exposition import Exposition, Sample, parse
from kvtop.sim.engine import Engine, EngineConfig
from kvtop.sim.exposition import fmt, render
from kvtop.sim.faults import malform
from kvtop.sim.simulation import Simulation
from kvtop.sim.workloads import synthetic
from tests.support.paths import LOAD, fixture_text


def busy_simulation(**engine: object) -> Simulation:
    config = EngineConfig(num_gpu_blocks=600, **engine)  # type: ignore[arg-type]
    sim = Simulation(config, synthetic(seed=1))
    sim.advance_to(30.0)
    return sim


def shape(text: str) -> dict[tuple[str, str, str], set[tuple[str, ...]]]:
    """(family, type, sample name) -> label key sets, without histogram `le`."""
    out: dict[tuple[str, str, str], set[tuple[str, ...]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            keys = tuple(sorted(k for k in s.labels if k != "le"))
            out.setdefault((family.name, family.type, s.name), set()).add(keys)
    return out


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(parsed: dict, name: str, **labels: str) -> float:
    matches = [v for (n, lab), v in parsed.items()
               if n == name and labels.items() <= dict(lab).items()]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


def test_v1_has_the_families_and_label_keys_of_vllm_0_33() -> None:
    fixture = fixture_text("vllm-0.33.0-v1-twin-under-load.txt")
    text = render(busy_simulation().engine, model_name="twin-llama")
    assert shape(text) == shape(fixture)
    ours = {k: v for (n, k), v in samples(text).items() if n == "vllm:cache_config_info"}
    theirs = {k: v for (n, k), v in samples(fixture).items() if n == "vllm:cache_config_info"}
    assert [dict(k).keys() for k in ours] == [dict(k).keys() for k in theirs]


def test_v1_values_are_the_engine_state() -> None:
    sim = busy_simulation()
    truth = sim.truth()
    assert truth.running > 0 and truth.prefix_hits > 0
    parsed = samples(render(sim.engine, model_name="m"))
    assert value(parsed, "vllm:kv_cache_usage_perc") == truth.kv_usage
    assert value(parsed, "vllm:num_requests_running") == truth.running
    assert value(parsed, "vllm:num_requests_waiting") == truth.waiting
    assert value(parsed, "vllm:num_requests_waiting_by_reason", reason="capacity") == truth.waiting
    assert value(parsed, "vllm:prefix_cache_queries_total") == truth.prefix_queries
    assert value(parsed, "vllm:prefix_cache_hits_total") == truth.prefix_hits
    assert value(parsed, "vllm:num_preemptions_total") == truth.preemptions
    assert value(parsed, "vllm:prompt_tokens_total") == truth.prompt_tokens
    assert value(parsed, "vllm:generation_tokens_total") == truth.generation_tokens
    for reason, n in truth.finished.items():
        assert value(parsed, "vllm:request_success_total", finished_reason=reason) == n
    info = next(dict(lab) for (n, lab) in parsed if n == "vllm:cache_config_info")
    assert info["num_gpu_blocks"] == "600" and info["block_size"] == "16"
    assert info["enable_prefix_caching"] == "True" and info["kv_cache_size_tokens"] == "9600"
    assert value(parsed, "vllm:prompt_tokens_created") == sim.engine.created


def test_v1_histograms_are_consistent() -> None:
    text = render(busy_simulation().engine, model_name="m")
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        buckets = [s.value for s in family.samples if s.name.endswith("_bucket")]
        count = next(s.value for s in family.samples if s.name.endswith("_count"))
        assert buckets == sorted(buckets) and buckets[-1] == count, family.name
    ttft = next(f for f in text_string_to_metric_families(text)
            if f.name == "vllm:time_to_first_token_seconds")
    bounds = [s.labels["le"] for s in ttft.samples if s.name.endswith("_bucket")]
    fixture = fixture_text("vllm-0.33.0-v1-twin-under-load.txt")
    expected = [line.split('le="')[1].split('"')[0] for line in fixture.splitlines()
                if line.startswith("vllm:time_to_first_token_seconds_bucket")]
    assert bounds == expected


def test_v0_names() -> None:
    sim = busy_simulation()
    truth = sim.truth()
    parsed = samples(render(sim.engine, model_name="m", names="v0"))
    # V0 has no null block: usage divides by num_gpu_blocks
    assert value(parsed, "vllm:gpu_cache_usage_perc") == truth.used_blocks / truth.num_gpu_blocks
    assert value(parsed, "vllm:num_requests_swapped") == 0
    rate = value(parsed, "vllm:gpu_prefix_cache_hit_rate")
    assert 0 < rate < 1
    assert not any("engine" in dict(lab) or n.endswith("_created") for n, lab in parsed)
    assert not any(n.startswith("vllm:kv_cache_usage") for n, _ in parsed)
    off = busy_simulation(enable_prefix_caching=False)
    assert value(samples(render(off.engine, model_name="m", names="v0")),
                 "vllm:gpu_prefix_cache_hit_rate") == -1.0


def test_sglang_names() -> None:
    sim = busy_simulation()
    truth = sim.truth()
    parsed = samples(render(sim.engine, model_name="m", names="sglang"))
    assert value(parsed, "sglang:num_running_reqs") == truth.running
    assert value(parsed, "sglang:num_queue_reqs") == truth.waiting
    assert value(parsed, "sglang:max_total_num_tokens") == 599 * 16
    assert value(parsed, "sglang:num_used_tokens") == truth.used_blocks * 16
    assert value(parsed, "sglang:token_usage") == pytest.approx(truth.kv_usage)
    assert value(parsed, "sglang:cached_tokens_total") <= value(parsed,
                                                                "sglang:prompt_tokens_total")
    assert not any(n.startswith("vllm:") for n, _ in parsed)


def test_unknown_name_set() -> None:
    with pytest.raises(ValueError):
        render(busy_simulation().engine, model_name="m", names="tgi")  # type: ignore[arg-type]


def test_malformed_text_does_not_parse() -> None:
    text = malform(render(busy_simulation().engine, model_name="m"))
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(text))


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_floats_are_written_as_prometheus_client_writes_them(x: float) -> None:
    expected = floatToGoString(x)
    assert fmt(x) == expected
    if not math.isnan(x):
        assert float(fmt(x).replace("+Inf", "inf").replace("-Inf", "-inf")) == x


# --- line for line against the real scrapes (tests/fixtures/metrics) -------------------------

SERVED = "vllm-0.33.0-v1-twin-served-kv-cache-metrics.txt"
V0_DOC = "vllm-0.7.x-v0-aibrix-runtime-doc.txt"
# The under-load twin's process start, a hair past the hundredths its scrape keeps
TWIN_START = 1796002943.9712


def pressed_simulation() -> Simulation:
    """30 s of the synthetic load on 200 blocks: requests wait, some were preempted."""
    sim = Simulation(EngineConfig(num_gpu_blocks=200), synthetic(seed=1))
    sim.advance_to(30.0)
    return sim


def twin_engine(num_gpu_blocks: int = 600, **config: object) -> Engine:
    """An idle engine configured as the twin ran (max_model_len 4096, blocks of 16)."""
    return Engine(EngineConfig(num_gpu_blocks=num_gpu_blocks, max_model_len=4096,
                               **config), created=TWIN_START)  # type: ignore[arg-type]


def layout(text: str) -> list[str]:
    """Each line without its value; python_info's and cache_config_info's labels (this
    interpreter's version; the server's settings) are checked on their own."""
    out = []
    for line in text.splitlines():
        if not line.startswith("#"):
            line = line.rsplit(" ", 1)[0]
            if line.startswith(("python_info{", "vllm:cache_config_info{")):
                line = line.partition("{")[0]
        out.append(line)
    return out


@pytest.mark.parametrize(("fixture", "blocks", "residency"),
                         [(LOAD, 600, False), (SERVED, 300, True)])
def test_v1_is_the_twins_scrape_line_for_line_but_for_its_values(
        fixture: str, blocks: int, residency: bool) -> None:
    ours = layout(render(twin_engine(blocks, kv_cache_metrics=residency),
                         model_name="twin-llama"))
    theirs = layout(fixture_text(fixture))
    assert ours == theirs[:len(ours)]
    # what follows the engine's families is the HTTP server's (its instrumentator), not ours
    assert all(line.removeprefix("# HELP ").removeprefix("# TYPE ").startswith("http_")
               for line in theirs[len(ours):])


COMPUTED = ("block_size", "num_gpu_blocks", "enable_prefix_caching", "kv_cache_size_tokens",
            "kv_cache_max_concurrency", "engine")


def cache_config(text: str) -> dict[str, str]:
    (info,) = parse(text).series("vllm:cache_config_info")
    assert info.value == 1.0
    return info.labels


def test_v1_cache_config_sizes_the_cache_as_the_served_twin_and_keeps_vllms_defaults() -> None:
    ours = cache_config(render(twin_engine(300), model_name="m"))
    theirs = cache_config(fixture_text(SERVED))
    # 300 blocks of 16 tokens: 4800 tokens, 4800 / 4096 = 1.171875 requests of the longest
    assert {k: ours[k] for k in COMPUTED} == {k: theirs[k] for k in COMPUTED}
    defaults = cache_config(fixture_text(LOAD))  # the twin under load ran on vLLM's defaults
    assert {k: v for k, v in ours.items() if k not in COMPUTED} == {
        k: v for k, v in defaults.items() if k not in COMPUTED}
    off = cache_config(render(twin_engine(600, enable_prefix_caching=False), model_name="m"))
    assert (off["enable_prefix_caching"], off["kv_cache_size_tokens"],
            off["kv_cache_max_concurrency"]) == ("False", "9600", "2.34375")


def test_process_series_are_the_twins_constants_and_its_start_time_to_the_hundredth() -> None:
    def process_lines(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("process_")]

    ours = process_lines(render(twin_engine(), model_name="twin-llama"))
    assert ours == process_lines(fixture_text(LOAD))
    assert "process_start_time_seconds 1.79600294397e+09" in ours


def test_python_series_are_this_interpreters() -> None:
    gc.disable()  # no collection between the render and the read below
    try:
        text = render(twin_engine(), model_name="m")
        stats = gc.get_stats()
    finally:
        gc.enable()
    expo = parse(text)
    for family, key in (("python_gc_objects_collected_total", "collected"),
                        ("python_gc_objects_uncollectable_total", "uncollectable"),
                        ("python_gc_collections_total", "collections")):
        assert {s.labels["generation"]: s.value for s in expo.series(family)} == {
            str(g): float(s[key]) for g, s in enumerate(stats)}
    (info,) = expo.series("python_info")
    v = sys.version_info
    assert (info.labels, info.value) == ({
        "implementation": platform.python_implementation(), "major": str(v.major),
        "minor": str(v.minor), "patchlevel": str(v.micro),
        "version": platform.python_version()}, 1.0)


def v1_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """vllm: samples other than histograms, `_created` gauges and the cache config."""
    expo = parse(text)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in expo.samples
            if s.name.startswith("vllm:") and not s.name.endswith("_created")
            and expo.types.get(s.name) in ("gauge", "counter")
            and s.name != "vllm:cache_config_info"}


def test_v1_every_counter_and_gauge_is_the_engine_state_or_what_the_twin_reads_there() -> None:
    sim = pressed_simulation()
    st, truth = sim.engine.stats, sim.truth()
    assert st.prompt_tokens_cached > 0 and truth.preemptions > 0 and truth.waiting > 0
    base = (("engine", "0"), ("model_name", "m"))

    def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return name, tuple(sorted((*base, *labels.items())))

    expected = {
        # what the simulator does not model reads as the twin reads it (all zero but "awake")
        key("vllm:estimated_flops_per_gpu_total"): 0.0,
        key("vllm:estimated_read_bytes_per_gpu_total"): 0.0,
        key("vllm:estimated_write_bytes_per_gpu_total"): 0.0,
        key("vllm:num_requests_running"): truth.running,
        key("vllm:num_requests_waiting"): truth.waiting,
        key("vllm:num_requests_waiting_by_reason", reason="capacity"): truth.waiting,
        key("vllm:num_requests_waiting_by_reason", reason="deferred"): 0.0,
        key("vllm:engine_sleep_state", sleep_state="awake"): 1.0,
        key("vllm:engine_sleep_state", sleep_state="weights_offloaded"): 0.0,
        key("vllm:engine_sleep_state", sleep_state="discard_all"): 0.0,
        key("vllm:kv_cache_usage_perc"): truth.kv_usage,
        key("vllm:prefix_cache_queries_total"): truth.prefix_queries,
        key("vllm:prefix_cache_hits_total"): truth.prefix_hits,
        key("vllm:external_prefix_cache_queries_total"): 0.0,
        key("vllm:external_prefix_cache_hits_total"): 0.0,
        key("vllm:mm_cache_queries_total"): 0.0,
        key("vllm:mm_cache_hits_total"): 0.0,
        key("vllm:num_preemptions_total"): truth.preemptions,
        key("vllm:prompt_tokens_total"): truth.prompt_tokens,
        # as the twin: computed + cache hits = prompt tokens, and the device holds every hit
        key("vllm:prompt_tokens_by_source_total", source="local_compute"):
            truth.prompt_tokens - st.prompt_tokens_cached,
        key("vllm:prompt_tokens_by_source_total", source="local_cache_hit"):
            st.prompt_tokens_cached,
        key("vllm:prompt_tokens_by_source_total", source="external_kv_transfer"): 0.0,
        key("vllm:prompt_tokens_cached_total"): st.prompt_tokens_cached,
        key("vllm:prompt_tokens_cached_by_source_total", source="device"): truth.prefix_hits,
        key("vllm:prompt_tokens_cached_by_source_total", source="host"): 0.0,
        key("vllm:prompt_tokens_cached_by_source_total", source="p2p"): 0.0,
        key("vllm:prompt_tokens_cached_by_source_total", source="disk"): 0.0,
        key("vllm:prompt_tokens_cached_by_source_total", source="external_unspecified"): 0.0,
        key("vllm:generation_tokens_total"): truth.generation_tokens,
        **{key("vllm:request_success_total", finished_reason=reason): n
           for reason, n in truth.finished.items()},
        ("vllm:admission_rejections_total",
         (("model_name", "m"), ("reason", "max_num_queued_reqs"))): 0.0,
        ("vllm:admission_rejections_total",
         (("model_name", "m"), ("reason", "max_num_queued_tokens"))): 0.0,
    }
    assert v1_values(render(sim.engine, model_name="m")) == expected


def histogram(expo: Exposition, name: str, **labels: str
              ) -> tuple[list[tuple[str, float]], float, float]:
    """(le, cumulative count) pairs, the count and the sum of one histogram in a parse."""
    def matching(suffix: str) -> list[Sample]:
        return [s for s in expo.series(name + suffix) if labels.items() <= s.labels.items()]

    (count,), (total,) = matching("_count"), matching("_sum")
    return [(s.labels["le"], s.value) for s in matching("_bucket")], count.value, total.value


def test_v1_histograms_are_the_engines_counts_sums_and_creation_time() -> None:
    sim = busy_simulation(kv_cache_metrics=True)
    st = sim.engine.stats
    expo = parse(render(sim.engine, model_name="m"))
    assert all(h.count > 0 for h in st.hist.values())
    for name, hist in st.hist.items():
        assert histogram(expo, f"vllm:{name}") == (
            [(fmt(le), n) for le, n in hist.cumulative()], hist.count, hist.sum), name
    created = {s.name: s.value for s in expo.samples if s.name.endswith("_created")}
    assert set(created.values()) == {sim.engine.created}
    assert len(created) == len(st.hist) + 17  # and the seventeen counters'


def le_pairs(bounds: tuple[float, ...], landings: list[float]) -> list[tuple[str, float]]:
    """The cumulative buckets of observations that land under these bounds (inf: above)."""
    return [(fmt(b), float(sum(x <= b for x in landings))) for b in (*bounds, math.inf)]


def test_v0_is_the_engine_state_under_v0s_names() -> None:
    sim = pressed_simulation()
    st, truth = sim.engine.stats, sim.truth()
    assert st.prefix_query_blocks > st.prefix_hit_blocks > 0 and truth.finished["abort"] == 0
    expo = parse(render(sim.engine, model_name="m", names="v0"))
    base = (("model_name", "m"),)
    assert {(s.name, tuple(sorted(s.labels.items()))): s.value for s in expo.samples
            if expo.types.get(s.name) in ("gauge", "counter")
            and s.name != "vllm:cache_config_info"} == {
        ("vllm:num_requests_running", base): truth.running,
        ("vllm:num_requests_swapped", base): 0.0,
        ("vllm:num_requests_waiting", base): truth.waiting,
        ("vllm:gpu_cache_usage_perc", base): truth.used_blocks / 200,  # no null block in V0
        ("vllm:cpu_cache_usage_perc", base): 0.0,
        ("vllm:cpu_prefix_cache_hit_rate", base): -1.0,
        ("vllm:gpu_prefix_cache_hit_rate", base): st.prefix_hit_blocks / st.prefix_query_blocks,
        ("vllm:lora_requests_info", (("max_lora", "0"), ("running_lora_adapters", ""),
                                     ("waiting_lora_adapters", ""))): sim.engine.created,
        ("vllm:num_preemptions_total", base): truth.preemptions,
        ("vllm:prompt_tokens_total", base): truth.prompt_tokens,
        ("vllm:generation_tokens_total", base): truth.generation_tokens,
        # V0 writes a finish reason once it has happened, and knows only these three
        ("vllm:request_success_total", (("finished_reason", "length"), *base)):
            truth.finished["length"],
        ("vllm:request_success_total", (("finished_reason", "stop"), *base)):
            truth.finished["stop"],
    }
    sim.engine.stats.finished["abort"] = 1
    expo = parse(render(sim.engine, model_name="m", names="v0"))
    assert [s.labels["finished_reason"] for s in expo.series("vllm:request_success_total")] == [
        "stop", "length", "abort"]


def test_v0_cache_config_and_help_texts_are_the_v0_scrapes() -> None:
    ours = parse(render(twin_engine(), model_name="m", names="v0"))
    theirs = parse(fixture_text(V0_DOC))
    (info,), (real,) = ours.series("vllm:cache_config_info"), theirs.series(
        "vllm:cache_config_info")
    assert info.labels.keys() == real.labels.keys() and info.value == real.value == 1.0
    assert {k: info.labels[k] for k in ("block_size", "enable_prefix_caching",
                                        "num_gpu_blocks")} == {
        "block_size": "16", "enable_prefix_caching": "True", "num_gpu_blocks": "600"}
    assert {k: ours.types[k] for k in theirs.types} == theirs.types
    assert {k: ours.helps[k] for k in theirs.helps} == theirs.helps
    # the families the scrape was cut before: vLLM 0.7's vllm/engine/metrics.py
    assert {k: v for k, v in ours.helps.items() if k not in theirs.helps} == {
        "vllm:cache_config_info": "Information of the LLMEngine CacheConfig",
        "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
        "vllm:time_per_output_token_seconds": "Histogram of time per output token in seconds.",
        "vllm:e2e_request_latency_seconds":
            "Histogram of end to end request latency in seconds.",
        "vllm:request_prompt_tokens": "Number of prefill tokens processed.",
        "vllm:request_generation_tokens": "Number of generation tokens processed."}


def test_v0_prefix_hit_rate_is_zero_before_any_query_and_minus_one_without_caching() -> None:
    def rate(engine: Engine) -> float:
        (sample,) = parse(render(engine, model_name="m", names="v0")).series(
            "vllm:gpu_prefix_cache_hit_rate")
        return sample.value

    assert rate(twin_engine()) == 0.0
    assert rate(twin_engine(enable_prefix_caching=False)) == -1.0


def test_v0_histograms_count_each_observation_at_its_buckets_upper_edge() -> None:
    engine = twin_engine()  # prompt buckets up to 2000 (max_model_len 4096)
    for name, value in (("request_prompt_tokens", 20), ("request_prompt_tokens", 3000),
                        ("request_generation_tokens", 21),
                        ("time_to_first_token_seconds", 0.1),
                        ("time_to_first_token_seconds", math.nextafter(0.1, 1.0)),
                        ("time_to_first_token_seconds", 15.0),
                        ("time_to_first_token_seconds", 3000.0),
                        ("inter_token_latency_seconds", 2.5),
                        ("inter_token_latency_seconds", 2.6),
                        ("e2e_request_latency_seconds", 0.2),
                        ("e2e_request_latency_seconds", 61.0),
                        ("iteration_tokens_total", 9), ("iteration_tokens_total", 100)):
        engine.stats.observe(name, value)
    expo = parse(render(engine, model_name="m", names="v0"))
    prompt = engine.stats.hist["request_prompt_tokens"].bounds
    ttft = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
            7.5, 10.0)
    tpot = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
    e2e = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
    iteration = (1, 2, 4, *range(8, 257, 8))  # V0's CUDA-graph batch sizes
    # a 3000-token prompt is above every bound (the last is 2000), never under 2000
    assert histogram(expo, "vllm:request_prompt_tokens") == (
        le_pairs(prompt, [20, math.inf]), 2.0, 3020.0)
    assert histogram(expo, "vllm:request_generation_tokens") == (
        le_pairs(prompt, [50]), 1.0, 21.0)
    assert histogram(expo, "vllm:time_to_first_token_seconds") == (
        le_pairs(ttft, [0.1, 0.25, math.inf, math.inf]), 4.0,
        0.1 + math.nextafter(0.1, 1.0) + 15.0 + 3000.0)
    assert histogram(expo, "vllm:time_per_output_token_seconds") == (
        le_pairs(tpot, [2.5, math.inf]), 2.0, 5.1)
    assert histogram(expo, "vllm:e2e_request_latency_seconds") == (
        le_pairs(e2e, [0.3, math.inf]), 2.0, 61.2)
    assert histogram(expo, "vllm:iteration_tokens_total") == (
        le_pairs(iteration, [16, 128]), 2.0, 109.0)


def test_sglang_is_the_engine_state_under_sglangs_names() -> None:
    sim = pressed_simulation()
    st, truth = sim.engine.stats, sim.truth()
    assert st.last_gen_throughput > 0
    expo = parse(render(sim.engine, model_name="m", names="sglang"))
    base = (("engine_type", "unified"), ("model_name", "m"), ("pp_rank", "0"), ("tp_rank", "0"))
    used, capacity = truth.used_blocks * 16, 199 * 16  # SGLang counts tokens, no null block
    assert {s.name: s.value for s in expo.samples if s.labels == dict(base)
            and expo.types.get(s.name) in ("gauge", "counter")} == {
        "sglang:num_running_reqs": truth.running,
        "sglang:num_used_tokens": used,
        "sglang:token_usage": used / capacity,
        "sglang:gen_throughput": st.last_gen_throughput,
        "sglang:num_queue_reqs": truth.waiting,
        "sglang:cache_hit_rate": st.last_batch_hit_rate,
        "sglang:max_total_num_tokens": capacity,
        "sglang:prompt_tokens_total": truth.prompt_tokens,
        "sglang:generation_tokens_total": truth.generation_tokens,
        "sglang:cached_tokens_total": st.prompt_tokens_cached,
        "sglang:num_requests_total": sum(truth.finished.values()),
        "sglang:num_retracted_requests_total": truth.preemptions,
    }
    assert {s.name for s in expo.samples} - {
        f"sglang:{name}_{part}" for name in ("time_to_first_token_seconds",
                                             "inter_token_latency_seconds",
                                             "e2e_request_latency_seconds")
        for part in ("bucket", "count", "sum")} == {
        "sglang:num_running_reqs", "sglang:num_used_tokens", "sglang:token_usage",
        "sglang:gen_throughput", "sglang:num_queue_reqs", "sglang:cache_hit_rate",
        "sglang:max_total_num_tokens", "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total", "sglang:cached_tokens_total",
        "sglang:num_requests_total", "sglang:num_retracted_requests_total"}


def test_sglang_histograms_count_each_observation_at_its_buckets_upper_edge() -> None:
    engine = twin_engine()
    for name, value in (("time_to_first_token_seconds", 0.02),
                        ("time_to_first_token_seconds", 25.0),
                        ("time_to_first_token_seconds", 35.0),
                        ("inter_token_latency_seconds", 0.015),
                        ("inter_token_latency_seconds", 0.05),
                        ("e2e_request_latency_seconds", 1.2)):
        engine.stats.observe(name, value)
    expo = parse(render(engine, model_name="m", names="sglang"))
    ttft = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
            5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0)
    itl = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
           0.4, 0.5, 0.75, 1.0, 2.5)
    e2e = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
    base = {"engine_type": "unified", "model_name": "m", "pp_rank": "0", "tp_rank": "0"}
    # vLLM's TTFT bucket of 25 s is (20, 40]: SGLang's 40 is +Inf; ITL 0.015 is (0.01, 0.025]
    assert histogram(expo, "sglang:time_to_first_token_seconds", **base) == (
        le_pairs(ttft, [0.02, math.inf, math.inf]), 3.0, 0.02 + 25.0 + 35.0)
    assert histogram(expo, "sglang:inter_token_latency_seconds", **base) == (
        le_pairs(itl, [0.025, 0.05]), 2.0, 0.065)
    assert histogram(expo, "sglang:e2e_request_latency_seconds", **base) == (
        le_pairs(e2e, [1.5]), 1.0, 1.2)


def test_sglang_help_texts_and_types_are_sglang_0_5s() -> None:
    expo = parse(render(twin_engine(), model_name="m", names="sglang"))
    assert expo.helps == {
        "sglang:num_running_reqs": "The number of running requests.",
        "sglang:num_used_tokens": "The number of used tokens.",
        "sglang:token_usage": "The token usage.",
        "sglang:gen_throughput": "The generation throughput (token/s).",
        "sglang:num_queue_reqs": "The number of requests in the waiting queue.",
        "sglang:cache_hit_rate": "The prefix cache hit rate.",
        "sglang:max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
        "sglang:prompt_tokens_total": "Number of prefill tokens processed.",
        "sglang:generation_tokens_total": "Number of generation tokens processed.",
        "sglang:cached_tokens_total": "Number of cached prompt tokens.",
        "sglang:num_requests_total": "Number of requests processed.",
        "sglang:num_retracted_requests_total": "Total number of retracted requests.",
        "sglang:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
        "sglang:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
        "sglang:e2e_request_latency_seconds":
            "Histogram of End-to-end request latency in seconds"}
    assert set(expo.types.values()) == {"gauge", "counter", "histogram"}
    assert {k for k, v in expo.types.items() if v == "counter"} == {
        "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
        "sglang:cached_tokens_total", "sglang:num_requests_total",
        "sglang:num_retracted_requests_total"}
    assert {k for k, v in expo.types.items() if v == "histogram"} == {
        "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
        "sglang:e2e_request_latency_seconds"}


# --- the text itself -------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "text"), [
    (123456.0, "123456.0"),  # six digits before the point: Python's form
    (1234567.0, "1.234567e+06"),  # seven: Go's exponent
    (1e6, "1e+06"), (1.5e9, "1.5e+09"), (1.79600294397e9, "1.79600294397e+09"),
    (-1234567.0, "-1234567.0"),  # negatives keep Python's form, as prometheus_client's
    (0.0, "0.0"), (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN"), (3, "3.0"),
])
def test_floats_are_written_as_prometheus_client_writes_them_at_the_switch(
        value: float, text: str) -> None:
    assert fmt(value) == text == floatToGoString(value)


def test_label_values_are_escaped_and_read_back_whole_by_kvtops_parser() -> None:
    name = 'a\\b"c\nd'
    text = render(twin_engine(), model_name=name)
    assert 'model_name="a\\\\b\\"c\\nd"' in text
    expo = parse(text)
    assert expo.errors == []
    (running,) = expo.series("vllm:num_requests_running")
    assert running.labels == {"engine": "0", "model_name": name}


def test_only_the_samples_asked_for_and_their_families_help_and_type() -> None:
    engine = twin_engine()
    only = frozenset({"vllm:num_requests_running", "vllm:prompt_tokens_created",
                      "vllm:request_params_n_count", "process_open_fds"})
    assert render(engine, model_name="m", only=only) == (
        "# HELP process_open_fds Number of open file descriptors.\n"
        "# TYPE process_open_fds gauge\n"
        "process_open_fds 7.0\n"
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
        "# HELP vllm:prompt_tokens_created Number of prefill tokens processed.\n"
        "# TYPE vllm:prompt_tokens_created gauge\n"
        'vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7960029439712e+09\n'
        "# HELP vllm:request_params_n Histogram of the n request parameter.\n"
        "# TYPE vllm:request_params_n histogram\n"
        'vllm:request_params_n_count{engine="0",model_name="m"} 0.0\n')
    assert render(engine, model_name="m", only=frozenset()) == ""
    assert render(engine, model_name="m", names="v0", only=frozenset({"nothing"})) == ""


def test_sglang_and_v0_keep_to_the_samples_asked_for_too() -> None:
    engine = twin_engine()
    assert render(engine, model_name="m", names="sglang",
                  only=frozenset({"sglang:num_running_reqs"})) == (
        "# HELP sglang:num_running_reqs The number of running requests.\n"
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",'
        'tp_rank="0"} 0.0\n')
    assert render(engine, model_name="m", names="v0",
                  only=frozenset({"vllm:num_requests_swapped"})) == (
        "# HELP vllm:num_requests_swapped Number of requests swapped to CPU.\n"
        "# TYPE vllm:num_requests_swapped gauge\n"
        'vllm:num_requests_swapped{model_name="m"} 0.0\n')


def test_an_unknown_name_set_is_named_in_the_error() -> None:
    with pytest.raises(ValueError) as error:
        render(twin_engine(), model_name="m", names="tgi")  # type: ignore[arg-type]
    assert str(error.value) == "unknown name set 'tgi'"

"""The rendered /metrics text: parseable, named and labelled like the real servers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from kvtop.sim.engine import EngineConfig
from kvtop.sim.exposition import fmt, render
from kvtop.sim.faults import malform
from kvtop.sim.simulation import Simulation
from kvtop.sim.workloads import synthetic
from tests.support.paths import fixture_text


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

"""SGLang (``--enable-metrics``): token-based usage; ranks are summed or maxed per
(model, dp_rank) engine (shared/reference/vllm-metrics.md §1c)."""

from __future__ import annotations

from kvtop.collect.adapters.common import (
    EngineKey,
    assign,
    assign_all,
    engine_readings,
    histogram_names,
    histograms,
    maxed,
    summed,
    whole_number,
)
from kvtop.collect.exposition import Exposition, Sample
from kvtop.collect.reading import ServerReading

TTFT, E2E = "sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds"
ITL_NEW, ITL_OLD = "sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"
GAUGES = ("sglang:token_usage", "sglang:num_running_reqs", "sglang:num_queue_reqs",
          "sglang:num_used_tokens", "sglang:max_total_num_tokens", "sglang:cache_hit_rate")
COUNTERS = ("sglang:prompt_tokens_total", "sglang:generation_tokens_total",
            "sglang:cached_tokens_total", "sglang:evicted_tokens_total")
NAMES = frozenset({
    *GAUGES, *COUNTERS, *histogram_names(TTFT), *histogram_names(E2E),
    *histogram_names(ITL_NEW), *histogram_names(ITL_OLD),
})


# every TP/PP rank of one engine reports the same pool: gauges take the max, never add
SIMPLE_FIELDS = (
    ("kv_usage", maxed, "sglang:token_usage"),
    ("tokens_used", maxed, "sglang:num_used_tokens"),
    ("running", maxed, "sglang:num_running_reqs"),
    ("waiting", maxed, "sglang:num_queue_reqs"),
    ("reported_hit_rate", maxed, "sglang:cache_hit_rate"),
    ("prompt_tokens_total", summed, "sglang:prompt_tokens_total"),
    ("generation_tokens_total", summed, "sglang:generation_tokens_total"),
    ("evicted_tokens_total", summed, "sglang:evicted_tokens_total"),  # 0.5.6+: KV released
)


def key_of(sample: Sample) -> EngineKey:
    return sample.labels.get("model_name"), sample.labels.get("dp_rank")


def adapt(expo: Exposition, version: str | None = None) -> ServerReading:
    keys = {key_of(s) for name in GAUGES + COUNTERS for s in expo.series(name)
            if "model_name" in s.labels}
    readings = engine_readings(keys)
    assign_all(readings, expo, key_of, SIMPLE_FIELDS)
    for key, value in maxed(expo, "sglang:max_total_num_tokens", key_of).items():
        if key in readings:
            readings[key].tokens_total = whole_number(value, "sglang:max_total_num_tokens")
    cached = summed(expo, "sglang:cached_tokens_total", key_of)
    for key, reading in readings.items():
        if key in cached and reading.prompt_tokens_total is not None:
            reading.prefix_hits_total = cached[key]
            reading.prefix_queries_total = reading.prompt_tokens_total
            reading.prefix_unit = "tokens"
    itl = ITL_NEW if expo.series(f"{ITL_NEW}_bucket") else ITL_OLD
    for field, base in (("ttft", TTFT), ("itl", itl), ("e2e", E2E)):
        assign(readings, field, histograms(expo, base, key_of))
    notes = []
    if readings and all(r.tokens_total is None for r in readings.values()):
        notes.append("KV capacity not exported (sglang:max_total_num_tokens needs SGLang 0.5.6+)")
    return ServerReading("sglang", list(readings.values()), version, notes,
                         engines_over_cap=readings.over_cap)

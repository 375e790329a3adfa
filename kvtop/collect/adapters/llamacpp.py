"""llama.cpp ``llama-server --metrics``: no labels, one slot pool; current builds export no
KV occupancy (shared/reference/vllm-metrics.md §1c)."""

from __future__ import annotations

from kvtop.collect.exposition import Exposition
from kvtop.collect.reading import EngineReading, ServerReading

NAMES = frozenset({
    "llamacpp:requests_processing", "llamacpp:requests_deferred",
    "llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
    "llamacpp:prompt_tokens_cached_total", "llamacpp:kv_cache_usage_ratio",
    "llamacpp:kv_cache_tokens",
})


def _value(expo: Exposition, name: str) -> float | None:
    series = expo.series(name)
    return series[-1].value if series else None


def adapt(expo: Exposition, version: str | None = None) -> ServerReading:
    reading = EngineReading(model=None, engine=None)
    reading.running = _value(expo, "llamacpp:requests_processing")
    reading.waiting = _value(expo, "llamacpp:requests_deferred")
    if reading.waiting is not None:  # a deferred request waits for a free slot: no other reason
        reading.waiting_by_reason = {"slots": reading.waiting}
    reading.prompt_tokens_total = _value(expo, "llamacpp:prompt_tokens_total")
    reading.generation_tokens_total = _value(expo, "llamacpp:tokens_predicted_total")
    reading.kv_usage = _value(expo, "llamacpp:kv_cache_usage_ratio")
    reading.tokens_used = _value(expo, "llamacpp:kv_cache_tokens")
    cached = _value(expo, "llamacpp:prompt_tokens_cached_total")
    if cached is not None and reading.prompt_tokens_total is not None:
        # builds that count cached tokens exclude them from prompt_tokens_total
        reading.prefix_hits_total = cached
        reading.prefix_queries_total = cached + reading.prompt_tokens_total
        reading.prefix_unit = "tokens"
    notes = []
    if reading.kv_usage is None:
        notes.append("this llama.cpp build exports no KV occupancy (llama.cpp#23632)")
    return ServerReading("llamacpp", [reading], version, notes)

"""Triton + TensorRT-LLM backend (metrics port 8002): KV blocks by ``kv_cache_block_type``.
Usage is used/max; the exported ``fraction`` is not trusted (it disagrees with used/max in
NVIDIA's own sample)."""

from __future__ import annotations

from kvtop.collect.adapters.common import EngineKey, engine_readings, whole_number
from kvtop.collect.exposition import Exposition, Sample
from kvtop.collect.reading import ServerReading

BLOCKS, REQUESTS = "nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_request_metrics"
NAMES = frozenset({BLOCKS, REQUESTS})


def key_of(sample: Sample) -> EngineKey:
    # "version" is the Triton model version, not a separate KV pool
    return sample.labels.get("model"), None


def _by_kind(expo: Exposition, name: str, label: str) -> dict[EngineKey, dict[str, float]]:
    out: dict[EngineKey, dict[str, float]] = {}
    for sample in expo.series(name):
        out.setdefault(key_of(sample), {})[sample.labels.get(label, "")] = sample.value
    return out


def adapt(expo: Exposition, version: str | None = None) -> ServerReading:
    blocks = _by_kind(expo, BLOCKS, "kv_cache_block_type")
    requests = _by_kind(expo, REQUESTS, "request_type")
    readings = engine_readings(set(blocks) | set(requests))
    for key, reading in readings.items():
        kinds = blocks.get(key, {})
        total, used = kinds.get("max"), kinds.get("used")
        if total is not None:
            reading.blocks_total = whole_number(total, f"{BLOCKS} max={total!r}")
            if used is not None and reading.blocks_total:
                reading.kv_usage = used / total
        if (per := kinds.get("tokens_per")) is not None:
            reading.block_size = whole_number(per, f"{BLOCKS} tokens_per={per!r}")
            if reading.blocks_total and reading.block_size:
                reading.tokens_total = reading.blocks_total * reading.block_size
        reqs = requests.get(key, {})
        reading.running = reqs.get("active")
        reading.waiting = reqs.get("waiting")
    return ServerReading("trtllm", list(readings.values()), version,
                         engines_over_cap=readings.over_cap)

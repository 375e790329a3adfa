"""Triton + TensorRT-LLM backend (metrics port 8002): KV blocks by ``kv_cache_block_type``.
Usage is used/max; the exported ``fraction`` is not trusted (it disagrees with used/max in
NVIDIA's own sample)."""

from __future__ import annotations

from kvtop.collect.adapters.common import EngineKey, engine_readings
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
        if total and total > 0:
            reading.blocks_total = int(total)
            if used is not None:
                reading.kv_usage = used / total
        if kinds.get("tokens_per"):
            reading.block_size = int(kinds["tokens_per"])
            if reading.blocks_total:
                reading.tokens_total = reading.blocks_total * reading.block_size
        reqs = requests.get(key, {})
        reading.running = reqs.get("active")
        reading.waiting = reqs.get("waiting")
    return ServerReading("trtllm", list(readings.values()), version)

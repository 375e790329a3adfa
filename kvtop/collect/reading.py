"""What one scrape of one server says, in kvtop's own terms.

An engine adapter turns a parsed ``/metrics`` exposition into a :class:`ServerReading`:
one :class:`EngineReading` per (model_name, engine) pair; a GPU exporter's adapter fills
``gpus`` instead. Every field is ``None`` when the
server does not export the metric behind it ("not exported", never 0). Counters are raw
cumulative values; rates and windows are derived later (``kvtop.derive``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kvtop.collect.gpu import GpuReading

ServerKind = Literal["vllm", "sglang", "llamacpp", "trtllm", "dcgm", "nvidia_gpu_exporter",
                     "unknown"]
GPU_EXPORTER_KINDS = frozenset({"dcgm", "nvidia_gpu_exporter"})


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative Prometheus histogram: ``buckets`` are (upper bound, cumulative count)
    pairs sorted by bound, the last bound being +Inf when the server sent it."""

    buckets: tuple[tuple[float, float], ...]
    count: float | None = None
    sum: float | None = None


@dataclass(frozen=True, slots=True)
class LoraInfo:
    """vLLM's ``lora_requests_info``: the LoRA adapters with requests running and waiting
    (names as the server sent them) and how many adapters fit at once."""

    max_lora: int | None
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()


@dataclass(slots=True)
class EngineReading:
    """One engine (one KV pool) of one server at one scrape."""

    model: str | None
    engine: str | None
    # KV cache
    kv_usage: float | None = None  # fraction 0..1 of usable blocks/tokens in use
    blocks_total: int | None = None  # usable blocks: the denominator of kv_usage
    block_size: int | None = None  # tokens per block
    tokens_total: int | None = None  # KV capacity in tokens
    tokens_used: float | None = None  # only where the server reports it directly (SGLang)
    idle_floor_blocks: int = 0  # blocks counted as used on an idle, healthy server
    # False: the version is not known exactly, so the floor is the larger of those its
    # possible versions imply (it is never learned from what an idle pool shows)
    idle_floor_exact: bool = True
    cpu_kv_usage: float | None = None  # V0 swap space usage
    prefix_caching: bool | None = None  # None: the server does not say
    # requests
    running: float | None = None
    waiting: float | None = None
    waiting_deferred: float | None = None  # waiting for a KV transfer or the LoRA budget
    swapped: float | None = None
    # counters (cumulative since server start)
    preemptions_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    prefix_queries_total: float | None = None
    prefix_hits_total: float | None = None
    prefix_unit: Literal["tokens", "blocks"] | None = None
    finished_total: dict[str, float] = field(default_factory=dict)  # by finished_reason
    # prompt and generated tokens of the requests that finished (the histograms' sums)
    finished_prompt_tokens_total: float | None = None
    finished_generation_tokens_total: float | None = None
    # a hit rate the server computes itself (vLLM V0: lifetime; SGLang: last batch)
    reported_hit_rate: float | None = None
    # latency histograms (seconds)
    ttft: Histogram | None = None
    itl: Histogram | None = None
    e2e: Histogram | None = None
    cache_config: dict[str, str] = field(default_factory=dict)
    lora: LoraInfo | None = None  # None: LoRA not enabled, or not exported
    # KV anatomy (docs/kv-anatomy.md). By label value, each dict as the server names them;
    # None: this server or version does not export it (never an empty dict for 0).
    waiting_by_reason: dict[str, float] | None = None  # vLLM 0.20+ capacity/deferred
    kv_fetch_by_stage: dict[str, float] | None = None  # vLLM 0.32+, a KV-transfer consumer
    admission_rejections_total: dict[str, float] | None = None  # vLLM 0.32+, by reason
    sleep_state: str | None = None  # vLLM 0.11.1+: awake, weights_offloaded, discard_all
    prompt_tokens_by_source_total: dict[str, float] | None = None  # vLLM 0.16+
    cached_tokens_by_tier_total: dict[str, float] | None = None  # vLLM 0.32+: device, host…
    external_queries_total: float | None = None  # vLLM 0.11.1+: a KV connector's lookups
    external_hits_total: float | None = None
    evicted_tokens_total: float | None = None  # SGLang 0.5.6+: left the radix cache
    prompt_lengths: Histogram | None = None  # tokens per prompt (request_prompt_tokens)
    kv_computed: Histogram | None = None  # prompt tokens whose KV was computed, per request
    # Block residency, vLLM 0.12+ with --kv-cache-metrics (a sample of blocks, seconds)
    block_lifetime: Histogram | None = None  # allocation to eviction
    block_idle: Histogram | None = None  # last use to eviction
    block_reuse_gap: Histogram | None = None  # between uses
    residency: Literal["on", "off"] | None = None  # off: a version that has it, flag not set


@dataclass(slots=True)
class ServerReading:
    """Everything one scrape of one target yielded."""

    kind: ServerKind
    engines: list[EngineReading] = field(default_factory=list)
    version: str | None = None  # from /version, or inferred ("0.10.2+")
    notes: list[str] = field(default_factory=list)  # why something is missing, parse errors
    parse_errors: int = 0
    engines_over_cap: int = 0  # engines past the adapters' MAX_ENGINES, left out
    impossible_values: int = 0  # values no server means (usage 1.7, counter -3): left out
    refused: str | None = None  # why nothing of this answer is usable (it is then empty)
    gpus: list[GpuReading] = field(default_factory=list)  # what a GPU exporter reports

"""vLLM, V0 and V1 engines, every release from 0.4 to 0.33 (names by era:
shared/reference/vllm-metrics.md §1a; usage semantics: §1b)."""

from __future__ import annotations

import re

from kvtop.collect.adapters.common import (
    EngineKey,
    assign,
    assign_all,
    by_label,
    engine_readings,
    finite,
    histogram_names,
    histogram_totals,
    histograms,
    maxed,
    summed,
    whole_number,
)
from kvtop.collect.exposition import Exposition, Sample
from kvtop.collect.reading import EngineReading, LoraInfo, ServerReading

USAGE_NEW, USAGE_OLD = "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"
PREFIX_NEW = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
PREFIX_OLD = ("vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total")
V0_ONLY = ("vllm:gpu_prefix_cache_hit_rate", "vllm:num_requests_swapped",
           "vllm:cpu_cache_usage_perc")
TTFT, E2E = "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"
ITL_NEW, ITL_OLD = "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"
CACHE_CONFIG = "vllm:cache_config_info"
LORA_INFO = "vllm:lora_requests_info"
# KV anatomy (docs/kv-anatomy.md): (reading field, family, label) per by-label family
BY_LABEL = (
    ("waiting_by_reason", "vllm:num_requests_waiting_by_reason", "reason"),
    ("kv_fetch_by_stage", "vllm:num_requests_kv_fetch_by_stage", "stage"),
    ("prompt_tokens_by_source_total", "vllm:prompt_tokens_by_source_total", "source"),
    ("cached_tokens_by_tier_total", "vllm:prompt_tokens_cached_by_source_total", "source"),
)
ADMISSION, SLEEP = "vllm:admission_rejections_total", "vllm:engine_sleep_state"
EXTERNAL = ("vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total")
PROMPT_LENGTHS = "vllm:request_prompt_tokens"
KV_COMPUTED = "vllm:request_prefill_kv_computed_tokens"
RESIDENCY = (("block_lifetime", "vllm:kv_block_lifetime_seconds"),
             ("block_idle", "vllm:kv_block_idle_before_evict_seconds"),
             ("block_reuse_gap", "vllm:kv_block_reuse_gap_seconds"))
RESIDENCY_SINCE = (0, 12, 0)  # --kv-cache-metrics: a release without the histograms is "off"
SLEEP_STATES = ("discard_all", "weights_offloaded")  # deepest first
# The prompt and generated tokens of every finished request: with the token counters, the
# tokens the requests still in flight have (the leak detector's load, docs/leak-detector.md).
FINISHED_PROMPT, FINISHED_GENERATION = ("vllm:request_prompt_tokens_sum",
                                        "vllm:request_generation_tokens_sum")
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"

NAMES = frozenset({
    USAGE_NEW, USAGE_OLD, *PREFIX_NEW, *PREFIX_OLD, *V0_ONLY, CACHE_CONFIG, LORA_INFO,
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    FINISHED_PROMPT, FINISHED_GENERATION, WAITING_BY_REASON,
    *histogram_names(TTFT), *histogram_names(E2E),
    *histogram_names(ITL_NEW), *histogram_names(ITL_OLD),
    *(name for _, name, _ in BY_LABEL), ADMISSION, SLEEP, *EXTERNAL,
    # only a mean of these is read: their count and sum, never their buckets
    *histogram_names(PROMPT_LENGTHS)[1:], *histogram_names(KV_COMPUTED)[1:],
    *(n for _, base in RESIDENCY for n in histogram_names(base)),
})


SIMPLE_FIELDS = (
    ("cpu_kv_usage", maxed, "vllm:cpu_cache_usage_perc"),
    ("running", summed, "vllm:num_requests_running"),
    ("waiting", summed, "vllm:num_requests_waiting"),
    ("swapped", summed, "vllm:num_requests_swapped"),
    ("preemptions_total", summed, "vllm:num_preemptions_total"),
    ("prompt_tokens_total", summed, "vllm:prompt_tokens_total"),
    ("generation_tokens_total", summed, "vllm:generation_tokens_total"),
    ("finished_prompt_tokens_total", summed, FINISHED_PROMPT),
    ("finished_generation_tokens_total", summed, FINISHED_GENERATION),
)


def key_of(sample: Sample) -> EngineKey:
    return sample.labels.get("model_name"), sample.labels.get("engine")


def parse_version(text: str | None) -> tuple[int, ...] | None:
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(part or 0) for part in match.groups()) if match else None


def _infer_version(expo: Exposition) -> str:
    """The release range this exposition's names belong to."""
    if any(expo.series(name) for name in V0_ONLY):
        return "V0"
    if expo.series(f"{ITL_NEW}_count"):
        return "0.10.2+"
    if any("engine" in s.labels for s in expo.series("vllm:num_requests_running")):
        return "0.9.2+" if expo.series(USAGE_NEW) else "0.9.0+"
    return "0.7+"


def _pool_accounting(
    version: tuple[int, ...] | None, inferred: str, num_gpu_blocks: int
) -> tuple[int, int, bool]:
    """(usable blocks = usage denominator, blocks counted as used at idle, floor exact).

    V1 holds one "null block" from 0.8.3; until 0.10.1 usage still divides by
    num_gpu_blocks (idle reads 1/num_gpu_blocks), from 0.10.2 by num_gpu_blocks − 1.
    Without an exact version the names give the era; where it spans both floors the floor
    is the larger one (1 block), and marked as assumed.
    """
    if version is not None:
        if version >= (0, 10, 2):
            return num_gpu_blocks - 1, 0, True
        if version >= (0, 8, 3) and inferred != "V0":
            return num_gpu_blocks, 1, True
        return num_gpu_blocks, 0, True
    if inferred == "0.10.2+":
        return num_gpu_blocks - 1, 0, True
    if inferred == "V0":
        return num_gpu_blocks, 0, True
    return num_gpu_blocks, 1, False


def _exact_version(version: str | None) -> tuple[int, ...] | None:
    """A version read from the server; an era label inferred from names ("0.7+") is none."""
    if version is None or version.strip().endswith("+"):
        return None
    return parse_version(version)


def _int_label(config: dict[str, str], name: str) -> int | None:
    """A count from a cache_config_info label: None when it is not a number ("None" before
    vLLM has profiled); BadValue when it is one no pool has ("inf", "1e308")."""
    text = config.get(name, "")
    try:
        value = float(text)
    except ValueError:
        return None
    return whole_number(value, f"{CACHE_CONFIG} {name}={text[:40]!r}")


def _cache_configs(expo: Exposition) -> dict[str | None, dict[str, str]]:
    """cache_config_info label sets by engine label (None: applies to every engine)."""
    return {s.labels.get("engine"): dict(s.labels) for s in expo.series(CACHE_CONFIG)}


def _apply_cache_config(reading: EngineReading, config: dict[str, str],
                        version: tuple[int, ...] | None, inferred: str) -> None:
    reading.cache_config = config
    reading.block_size = _int_label(config, "block_size")
    num_gpu_blocks = _int_label(config, "num_gpu_blocks")
    if num_gpu_blocks is not None:
        reading.blocks_total, reading.idle_floor_blocks, reading.idle_floor_exact = (
            _pool_accounting(version, inferred, num_gpu_blocks))
    reading.tokens_total = _int_label(config, "kv_cache_size_tokens")
    if reading.tokens_total is None and num_gpu_blocks and reading.block_size:
        reading.tokens_total = num_gpu_blocks * reading.block_size
    caching = config.get("enable_prefix_caching")
    if caching in ("True", "False"):
        reading.prefix_caching = caching == "True"


def _prefix_counters(expo: Exposition, readings: dict[EngineKey, EngineReading],
                     inferred: str) -> None:
    """Prefer the 0.9.2+ names; 0.9–0.11 export both with equal values: never add them."""
    names = PREFIX_NEW if expo.series(PREFIX_NEW[0]) else PREFIX_OLD
    queries, hits = summed(expo, names[0], key_of), summed(expo, names[1], key_of)
    # The old counters counted blocks until 0.8.5, the release before `engine` labels came.
    help_text = expo.helps.get(names[0].removesuffix("_total"), "")
    in_blocks = names == PREFIX_OLD and ("block" in help_text or inferred == "0.7+")
    for key, reading in readings.items():
        if key in queries:
            reading.prefix_queries_total = queries[key]
            reading.prefix_hits_total = hits.get(key, 0.0)
            reading.prefix_unit = "blocks" if in_blocks else "tokens"


def _v0_hit_rate(expo: Exposition, readings: dict[EngineKey, EngineReading]) -> None:
    """V0's lifetime gauge: -1 means prefix caching is off."""
    for key, value in maxed(expo, "vllm:gpu_prefix_cache_hit_rate", key_of).items():
        if key in readings:
            readings[key].prefix_caching = value >= 0
            readings[key].reported_hit_rate = value if value >= 0 else None


def _finished(expo: Exposition, readings: dict[EngineKey, EngineReading]) -> None:
    for sample in expo.series("vllm:request_success_total"):
        reading = readings.get(key_of(sample))
        value = finite(sample.value)
        if reading is not None and value is not None:
            reason = sample.labels.get("finished_reason", "unknown")
            reading.finished_total[reason] = reading.finished_total.get(reason, 0.0) + value


def _waiting_deferred(expo: Exposition, readings: dict[EngineKey, EngineReading]) -> None:
    """Waiting requests held back by something other than free capacity (a KV transfer,
    the LoRA budget): vLLM 0.33+ exports the reason."""
    deferred: dict[EngineKey, float] = {}
    for sample in expo.series(WAITING_BY_REASON):
        value, key = finite(sample.value), key_of(sample)
        if value is not None and sample.labels.get("reason") == "deferred":
            deferred[key] = deferred.get(key, 0.0) + value
    for key, value in deferred.items():
        if key in readings:
            readings[key].waiting_deferred = value


def _latency(expo: Exposition, readings: dict[EngineKey, EngineReading]) -> None:
    itl_base = ITL_NEW if expo.series(f"{ITL_NEW}_bucket") else ITL_OLD
    for field, base in (("ttft", TTFT), ("itl", itl_base), ("e2e", E2E)):
        for key, histogram in histograms(expo, base, key_of).items():
            if key in readings:
                setattr(readings[key], field, histogram)


def _sleep_state(states: dict[str, float]) -> str | None:
    """The deepest sleep level set to 1, else awake when ``awake`` is 1; None otherwise."""
    for state in SLEEP_STATES:
        if states.get(state, 0.0) >= 1:
            return state
    return "awake" if states.get("awake", 0.0) >= 1 else None


def _anatomy(expo: Exposition, readings: dict[EngineKey, EngineReading],
             exact: tuple[int, ...] | None) -> None:
    """The families of docs/kv-anatomy.md; a family a server lacks stays None."""
    for field, name, label in BY_LABEL:
        for key, values in by_label(expo, name, key_of, label).items():
            if key in readings:
                setattr(readings[key], field, values)
    for key, states in by_label(expo, SLEEP, key_of, "sleep_state").items():
        if key in readings:
            readings[key].sleep_state = _sleep_state(states)
    assign_all(readings, expo, key_of, [("external_queries_total", summed, EXTERNAL[0]),
                                        ("external_hits_total", summed, EXTERNAL[1])])
    for field, base in (("prompt_lengths", PROMPT_LENGTHS), ("kv_computed", KV_COMPUTED)):
        assign(readings, field, histogram_totals(expo, base, key_of))
    for field, base in RESIDENCY:
        assign(readings, field, histograms(expo, base, key_of))
    # one series per server (labelled model_name and reason only, no engine)
    admissions = by_label(expo, ADMISSION, lambda s: (None, None), "reason").get((None, None))
    off = exact is not None and exact >= RESIDENCY_SINCE
    for reading in readings.values():
        reading.admission_rejections_total = admissions
        if reading.block_lifetime is not None:
            reading.residency = "on"
        elif off:
            reading.residency = "off"


def _adapters(text: str | None) -> tuple[str, ...]:
    return tuple(name for name in (text or "").split(",") if name)


def lora_info(expo: Exposition) -> LoraInfo | None:
    """The newest ``lora_requests_info`` series: vLLM sets a new label set to the current
    time whenever the adapters change and never removes the old ones, so the series with
    the latest timestamp (its value) is now. None when LoRA is off (no series, or max_lora
    0 with no adapter)."""
    newest = max((s for s in expo.series(LORA_INFO) if finite(s.value) is not None),
                 key=lambda s: s.value, default=None)
    if newest is None:
        return None
    labels = newest.labels
    running = _adapters(labels.get("running_lora_adapters"))
    waiting = _adapters(labels.get("waiting_lora_adapters"))
    most = _int_label(labels, "max_lora")
    if most is None and not running and not waiting:
        return None
    return LoraInfo(most, running, waiting)


def _engine_keys(expo: Exposition) -> set[EngineKey]:
    keys: set[EngineKey] = set()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", USAGE_NEW, USAGE_OLD,
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        keys.update(key_of(s) for s in expo.series(name) if "model_name" in s.labels)
    return keys


def adapt(expo: Exposition, version: str | None = None) -> ServerReading:
    inferred = _infer_version(expo)
    exact = _exact_version(version)
    readings = engine_readings(_engine_keys(expo))
    usage_name = USAGE_NEW if expo.series(USAGE_NEW) else USAGE_OLD
    assign_all(readings, expo, key_of, [("kv_usage", maxed, usage_name), *SIMPLE_FIELDS])
    configs = _cache_configs(expo)
    for key, reading in readings.items():
        config = configs.get(key[1], configs.get(None))
        if config is not None:
            _apply_cache_config(reading, config, exact, inferred)
    _prefix_counters(expo, readings, inferred)
    _v0_hit_rate(expo, readings)
    _finished(expo, readings)
    _waiting_deferred(expo, readings)
    _latency(expo, readings)
    _anatomy(expo, readings, exact)
    lora = lora_info(expo)  # one per server: the series has no engine label
    for reading in readings.values():
        reading.lora = lora
    notes = [] if readings else ["vLLM without engine series (started with --disable-log-stats?)"]
    return ServerReading("vllm", list(readings.values()), version or inferred, notes,
                         engines_over_cap=readings.over_cap)

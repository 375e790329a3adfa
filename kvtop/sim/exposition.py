"""`/metrics` text of a simulated engine, named and labelled as a real server names it.

"v1" imitates vLLM 0.33.0 (V1 engine, `prometheus_client` single-process output: HELP/TYPE
lines, `_total` counters with `_created` companions, labels sorted, Go-style floats), family
for family and label key for label key as in the 0.33.0 twin fixture. "v0" imitates vLLM
0.7's V0 engine (multiprocess mode: no `_created`, no `engine` label) and "sglang" SGLang
0.5's scheduler collector, so kvtop's adapters are exercised end to end.
"""

from __future__ import annotations

import gc
import math
import platform
import sys
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from kvtop.sim.engine import Engine
from kvtop.sim.stats import FINISH_REASONS, Histogram

Names = Literal["v1", "v0", "sglang"]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Sample = tuple[str, Mapping[str, str], float]

# vLLM 0.33 CacheConfig attributes as `cache_config_info` labels (keys from the fixture);
# block_size, num_gpu_blocks, enable_prefix_caching and the sizing labels are filled in.
_V1_CACHE_CONFIG = {
    "_block_size_resolved": "True", "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None", "effective_attention_block_size": "None",
    "enable_mamba_shared_prefix_checkpoint": "False", "gpu_memory_utilization": "0.9",
    "hash_block_size": "None", "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None",
    "kv_cache_memory_bytes": "None", "kv_offloading_backend": "native",
    "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None", "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "float32",
    "num_cpu_blocks": "None", "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0", "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None", "replayssm_buffer_len": "16",
    "simple_cpu_offload_num_blocks": "None", "skip_page_size_padded": "None",
    "sliding_window": "None", "swa_bounded_replay": "True", "use_kda_recoverssm": "False",
    "use_replayssm": "False", "user_specified_block_size": "True",
}
_V0_CACHE_CONFIG = {
    "cache_dtype": "auto", "calculate_kv_scales": "False", "cpu_offload_gb": "0",
    "gpu_memory_utilization": "0.9", "is_attention_free": "False", "num_cpu_blocks": "4096",
    "num_gpu_blocks_override": "None", "sliding_window": "None",
    "swap_space_bytes": "4294967296",
}
_V0_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
            7.5, 10.0)
_V0_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_V0_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
_V0_ITERATION = (1, 2, 4, *range(8, 257, 8))  # V0 buckets are the CUDA-graph batch sizes
_SGLANG_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0)
_SGLANG_ITL = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
               0.4, 0.5, 0.75, 1.0, 2.5)


def fmt(value: float) -> str:
    """A float as prometheus_client writes it (Go's formatting, e.g. 1.79e+09)."""
    value = float(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Writer:
    def __init__(self, created: float | None, only: frozenset[str] | None = None) -> None:
        self.lines: list[str] = []
        self.created = created  # None: multiprocess mode, no `_created` series
        self.only = only

    def family(self, name: str, kind: str, help_: str, samples: Iterable[Sample]) -> None:
        if self.only is not None:  # prometheus_client's restricted registry (`name[]`)
            samples = [sample for sample in samples if sample[0] in self.only]
            if not samples:
                return
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        self.lines += [f"{n}{_labels(lab)} {fmt(v)}" for n, lab, v in samples]

    def gauge(self, name: str, help_: str, series: Sequence[tuple[Mapping[str, str], float]]
              ) -> None:
        self.family(name, "gauge", help_, [(name, lab, v) for lab, v in series])

    def counter(self, base: str, help_: str, series: Sequence[tuple[Mapping[str, str], float]]
                ) -> None:
        total = base + "_total"
        self.family(total, "counter", help_, [(total, lab, v) for lab, v in series])
        self._created(base, help_, [lab for lab, _ in series])

    def histogram(self, base: str, help_: str, labels: Mapping[str, str], hist: Histogram
                  ) -> None:
        samples: list[Sample] = [
            (base + "_bucket", {**labels, "le": fmt(le)}, n) for le, n in hist.cumulative()
        ]
        samples += [(base + "_count", labels, hist.count), (base + "_sum", labels, hist.sum)]
        self.family(base, "histogram", help_, samples)
        self._created(base, help_, [labels])

    def _created(self, base: str, help_: str, label_sets: Sequence[Mapping[str, str]]) -> None:
        if self.created is not None:
            self.gauge(base + "_created", help_, [(lab, self.created) for lab in label_sets])

    def text(self) -> str:
        return "\n".join(self.lines) + "\n" if self.lines else ""


def render(engine: Engine, *, model_name: str, names: Names = "v1",
           only: frozenset[str] | None = None) -> str:
    """The `/metrics` body for `engine` under the chosen name set: all of it, or only the
    samples named in ``only`` (and the HELP/TYPE of their families), as prometheus_client
    renders a request with ``name[]`` arguments."""
    if names == "v1":
        return _render_v1(engine, model_name, only)
    if names == "v0":
        return _render_v0(engine, model_name, only)
    if names == "sglang":
        return _render_sglang(engine, model_name, only)
    raise ValueError(f"unknown name set {names!r}")


def _process_families(w: _Writer, start_time: float) -> None:
    """prometheus_client's default collectors, which a real vLLM process also exports."""
    stats = list(enumerate(gc.get_stats()))
    for name, key, help_ in (
        ("python_gc_objects_collected", "collected", "Objects collected during gc"),
        ("python_gc_objects_uncollectable", "uncollectable",
         "Uncollectable objects found during GC"),
        ("python_gc_collections", "collections",
         "Number of times this generation was collected"),
    ):
        w.family(name + "_total", "counter", help_,
                 [(name + "_total", {"generation": str(g)}, s[key]) for g, s in stats])
    v = sys.version_info
    w.gauge("python_info", "Python platform information", [(
        {"implementation": platform.python_implementation(), "major": str(v.major),
         "minor": str(v.minor), "patchlevel": str(v.micro), "version": platform.python_version()},
        1.0)])
    # Memory and fds are plausible constants: the simulator is not the process described.
    for name, help_, value in (
        ("process_virtual_memory_bytes", "Virtual memory size in bytes.", 9.54404864e08),
        ("process_resident_memory_bytes", "Resident memory size in bytes.", 5.00764672e08),
        ("process_start_time_seconds",
         "Start time of the process since unix epoch in seconds.", round(start_time, 2)),
    ):
        w.gauge(name, help_, [({}, value)])
    w.family("process_cpu_seconds_total", "counter",
             "Total user and system CPU time spent in seconds.",
             [("process_cpu_seconds_total", {}, 5.79)])
    w.gauge("process_open_fds", "Number of open file descriptors.", [({}, 7.0)])
    w.gauge("process_max_fds", "Maximum number of open file descriptors.", [({}, 20000.0)])


def _v1_cache_config(engine: Engine, engine_label: str) -> dict[str, str]:
    cfg = engine.config
    size_tokens = cfg.num_gpu_blocks * cfg.block_size
    return {
        **_V1_CACHE_CONFIG,
        "block_size": str(cfg.block_size),
        "num_gpu_blocks": str(cfg.num_gpu_blocks),
        "enable_prefix_caching": str(cfg.enable_prefix_caching),
        "kv_cache_size_tokens": str(size_tokens),
        "kv_cache_max_concurrency": str(size_tokens / cfg.model_len),
        "engine": engine_label,
    }


def _render_v1(engine: Engine, model_name: str, only: frozenset[str] | None) -> str:
    w = _Writer(created=engine.created, only=only)
    _process_families(w, engine.created)
    st = engine.stats
    base = {"engine": "0", "model_name": model_name}
    one = [(base, 0.0)]

    def by(key: str, values: Mapping[str, float]) -> list[tuple[Mapping[str, str], float]]:
        return [({**base, key: k}, v) for k, v in values.items()]

    for what, help_ in (("flops", "floating point operations"),
                        ("read_bytes", "bytes read from memory"),
                        ("write_bytes", "bytes written to memory")):
        w.counter(f"vllm:estimated_{what}_per_gpu",
                  f"Estimated number of {help_} per GPU (for Model Flops Utilization "
                  "calculations).", one)
    waiting = len(engine.waiting)
    w.gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
            [(base, len(engine.running))])
    w.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            [(base, waiting)])
    w.gauge("vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            by("reason", {"capacity": waiting, "deferred": 0}))
    w.gauge("vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.", by("sleep_state", {"awake": 1, "weights_offloaded": 0, "discard_all": 0}))
    w.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
            [(base, engine.pool.usage())])
    queried, cached = "in terms of number of queried", "in terms of number of cached"
    w.counter("vllm:prefix_cache_queries", f"Prefix cache queries, {queried} tokens.",
              [(base, st.prefix_queries)])
    w.counter("vllm:prefix_cache_hits", f"Prefix cache hits, {cached} tokens.",
              [(base, st.prefix_hits)])
    external = "from KV connector cross-instance cache sharing"
    w.counter("vllm:external_prefix_cache_queries",
              f"External prefix cache queries {external}, {queried} tokens.", one)
    w.counter("vllm:external_prefix_cache_hits",
              f"External prefix cache hits {external}, {cached} tokens.", one)
    w.counter("vllm:mm_cache_queries", f"Multi-modal cache queries, {queried} items.", one)
    w.counter("vllm:mm_cache_hits", f"Multi-modal cache hits, {cached} items.", one)
    w.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
              [(base, st.preemptions)])
    w.counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
              [(base, st.prompt_tokens)])
    w.counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
              by("source", {"local_compute": st.prompt_tokens - st.prompt_tokens_cached,
                            "local_cache_hit": st.prompt_tokens_cached,
                            "external_kv_transfer": 0}))
    w.counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).",
              [(base, st.prompt_tokens_cached)])
    w.counter("vllm:prompt_tokens_cached_by_source",
              "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
              "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
              "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
              "vllm:external_prefix_cache_hits.",
              by("source", {"device": st.prefix_hits, "host": 0, "p2p": 0, "disk": 0,
                            "external_unspecified": 0}))
    w.counter("vllm:generation_tokens", "Number of generation tokens processed.",
              [(base, st.generation_tokens)])
    w.counter("vllm:request_success", "Count of successfully processed requests.",
              by("finished_reason", {r: st.finished[r] for r in FINISH_REASONS}))
    w.counter("vllm:admission_rejections",
              "Number of admission attempts rejected by a queue limit, by reason.",
              [({"model_name": model_name, "reason": r}, 0)
               for r in ("max_num_queued_reqs", "max_num_queued_tokens")])
    for name, help_ in _V1_HISTOGRAMS:
        w.histogram(f"vllm:{name}", help_, base, st.hist[name])
    if engine.config.kv_cache_metrics:  # vLLM's --kv-cache-metrics; absent without it
        for name, help_ in _V1_RESIDENCY:
            w.histogram(f"vllm:{name}", f"{help_} Sampled metrics (controlled by "
                        "--kv-cache-metrics-sample).", base, st.hist[name])
    w.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
            [(_v1_cache_config(engine, "0"), 1.0)])
    return w.text()


_V1_HISTOGRAMS = (
    ("request_prompt_tokens", "Number of prefill tokens processed."),
    ("request_generation_tokens", "Number of generation tokens processed."),
    ("iteration_tokens_total", "Histogram of number of tokens per engine_step."),
    ("request_max_num_generation_tokens",
     "Histogram of maximum number of requested generation tokens."),
    ("request_params_n", "Histogram of the n request parameter."),
    ("request_params_max_tokens", "Histogram of the max_tokens request parameter."),
    ("time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    ("request_time_per_output_token_seconds",
     "Histogram of time_per_output_token_seconds per request."),
    ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    ("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
    ("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
    ("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
    ("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
    ("request_num_preemptions", "Histogram of the number of times a request was preempted."),
    ("request_prefill_kv_computed_tokens",
     "Histogram of new KV tokens computed during prefill (excluding cached tokens)."),
)


_V1_RESIDENCY = (
    ("kv_block_lifetime_seconds",
     "Histogram of KV cache block lifetime from allocation to eviction."),
    ("kv_block_idle_before_evict_seconds",
     "Histogram of idle time before KV cache block eviction."),
    ("kv_block_reuse_gap_seconds",
     "Histogram of time gaps between consecutive KV cache block accesses. Only the most "
     "recent accesses are recorded (ring buffer)."),
)


def _rebucket(hist: Histogram, bounds: Sequence[float]) -> Histogram:
    """The same observations under other bounds, each placed at its old bucket's upper edge
    (those above the old last bound stay above every new one: nothing says where they were)."""
    out = Histogram(bounds)
    for upper, n in zip((*hist.bounds, float("inf")), hist.counts, strict=True):
        out.counts[bisect_left(out.bounds, upper)] += n
    out.count, out.sum = hist.count, hist.sum
    return out


def _render_v0(engine: Engine, model_name: str, only: frozenset[str] | None) -> str:
    w = _Writer(created=None, only=only)
    st, cfg = engine.stats, engine.config
    base = {"model_name": model_name}
    w.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", [({
        **_V0_CACHE_CONFIG, "block_size": str(cfg.block_size),
        "enable_prefix_caching": str(cfg.enable_prefix_caching),
        "num_gpu_blocks": str(cfg.num_gpu_blocks)}, 1.0)])
    w.gauge("vllm:num_requests_running", "Number of requests currently running on GPU.",
            [(base, len(engine.running))])
    w.gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", [(base, 0)])
    w.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            [(base, len(engine.waiting))])
    # V0 has no null block: its usage divides by num_gpu_blocks, as its cache_config says
    w.gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.",
            [(base, engine.pool.num_used_blocks / cfg.num_gpu_blocks)])
    w.gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.",
            [(base, 0.0)])
    w.gauge("vllm:cpu_prefix_cache_hit_rate", "CPU prefix cache block hit rate.", [(base, -1.0)])
    w.gauge("vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.",
            [(base, _v0_hit_rate(engine))])
    w.gauge("vllm:lora_requests_info", "Running stats on lora requests.", [(
        {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""},
        engine.created)])
    w.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
              [(base, st.preemptions)])
    w.counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
              [(base, st.prompt_tokens)])
    w.counter("vllm:generation_tokens", "Number of generation tokens processed.",
              [(base, st.generation_tokens)])
    w.counter("vllm:request_success", "Count of successfully processed requests.",
              [({**base, "finished_reason": r}, st.finished[r])
               for r in ("stop", "length", "abort") if st.finished[r]])
    h = st.hist
    for name, help_, bounds, source in (
        ("iteration_tokens_total", "Histogram of number of tokens per engine_step.",
         _V0_ITERATION, "iteration_tokens_total"),
        ("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
         _V0_TTFT, "time_to_first_token_seconds"),
        ("time_per_output_token_seconds", "Histogram of time per output token in seconds.",
         _V0_TPOT, "inter_token_latency_seconds"),
        ("e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
         _V0_E2E, "e2e_request_latency_seconds"),
        ("request_prompt_tokens", "Number of prefill tokens processed.",
         h["request_prompt_tokens"].bounds, "request_prompt_tokens"),
        ("request_generation_tokens", "Number of generation tokens processed.",
         h["request_generation_tokens"].bounds, "request_generation_tokens"),
    ):
        w.histogram(f"vllm:{name}", help_, base, _rebucket(h[source], bounds))
    return w.text()


def _v0_hit_rate(engine: Engine) -> float:
    """V0's lifetime block-level gauge; -1 when prefix caching is off."""
    st = engine.stats
    if not engine.config.enable_prefix_caching:
        return -1.0
    return st.prefix_hit_blocks / st.prefix_query_blocks if st.prefix_query_blocks else 0.0


def _render_sglang(engine: Engine, model_name: str, only: frozenset[str] | None) -> str:
    w = _Writer(created=None, only=only)
    st, cfg = engine.stats, engine.config
    base = {"engine_type": "unified", "model_name": model_name, "pp_rank": "0", "tp_rank": "0"}
    max_tokens = engine.pool.usable_blocks * cfg.block_size
    used_tokens = engine.pool.num_used_blocks * cfg.block_size
    for name, help_, value in (
        ("num_running_reqs", "The number of running requests.", len(engine.running)),
        ("num_used_tokens", "The number of used tokens.", used_tokens),
        ("token_usage", "The token usage.", used_tokens / max_tokens),
        ("gen_throughput", "The generation throughput (token/s).", st.last_gen_throughput),
        ("num_queue_reqs", "The number of requests in the waiting queue.", len(engine.waiting)),
        ("cache_hit_rate", "The prefix cache hit rate.", st.last_batch_hit_rate),
        ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
         max_tokens),
    ):
        w.gauge(f"sglang:{name}", help_, [(base, value)])
    for name, help_, value in (
        ("prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens),
        ("generation_tokens", "Number of generation tokens processed.", st.generation_tokens),
        ("cached_tokens", "Number of cached prompt tokens.", st.prompt_tokens_cached),
        ("num_requests", "Number of requests processed.", sum(st.finished.values())),
        ("num_retracted_requests", "Total number of retracted requests.", st.preemptions),
    ):
        w.counter(f"sglang:{name}", help_, [(base, value)])
    h = st.hist
    for name, help_, bounds, source in (
        ("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
         _SGLANG_TTFT, "time_to_first_token_seconds"),
        ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
         _SGLANG_ITL, "inter_token_latency_seconds"),
        ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
         _V0_E2E, "e2e_request_latency_seconds"),
    ):
        w.histogram(f"sglang:{name}", help_, base, _rebucket(h[source], bounds))
    return w.text()

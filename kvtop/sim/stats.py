"""Counters and histograms a simulated engine records, with vLLM 0.33's bucket bounds."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

# Bucket bounds as in vllm/v1/metrics/loggers.py 0.33 (and the 0.33.0 twin fixture).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
# vllm/v1/metrics/buckets.py KV_CACHE_RESIDENCY_BUCKETS (the served twin's fixture)
RESIDENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                     10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)
RESIDENCY = ("kv_block_lifetime_seconds", "kv_block_idle_before_evict_seconds",
             "kv_block_reuse_gap_seconds")


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, ... up to max_value."""
    out: list[int] = []
    exponent = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent *= 10


class Histogram:
    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs ending with +Inf, as Prometheus exposes them."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass
class EngineStats:
    """Everything the engine counts; the exposition renders these under each name set."""

    max_model_len: int
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0  # tokens, the way vLLM >= 0.9 counts them
    prefix_hits: int = 0
    prefix_query_blocks: int = 0  # blocks, for V0's lifetime hit-rate gauge
    prefix_hit_blocks: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    last_batch_hit_rate: float = 0.0  # SGLang's per-prefill-batch gauge
    last_gen_throughput: float = 0.0
    hist: dict[str, Histogram] = field(init=False)

    def __post_init__(self) -> None:
        tokens = buckets_1_2_5(self.max_model_len)
        self.hist = {
            "request_prompt_tokens": Histogram(tokens),
            "request_generation_tokens": Histogram(tokens),
            "iteration_tokens_total": Histogram(ITERATION_TOKEN_BUCKETS),
            "request_max_num_generation_tokens": Histogram(tokens),
            "request_params_n": Histogram(PARAMS_N_BUCKETS),
            "request_params_max_tokens": Histogram(tokens),
            "time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
            "inter_token_latency_seconds": Histogram(ITL_BUCKETS),
            "request_time_per_output_token_seconds": Histogram(ITL_BUCKETS),
            "e2e_request_latency_seconds": Histogram(LATENCY_BUCKETS),
            "request_queue_time_seconds": Histogram(LATENCY_BUCKETS),
            "request_inference_time_seconds": Histogram(LATENCY_BUCKETS),
            "request_prefill_time_seconds": Histogram(LATENCY_BUCKETS),
            "request_decode_time_seconds": Histogram(LATENCY_BUCKETS),
            "request_num_preemptions": Histogram(PREEMPTION_BUCKETS),
            "request_prefill_kv_computed_tokens": Histogram(tokens),
            **{name: Histogram(RESIDENCY_BUCKETS) for name in RESIDENCY},
        }

    def observe(self, name: str, value: float) -> None:
        self.hist[name].observe(value)

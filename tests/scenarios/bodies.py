"""Hostile and broken /metrics bodies, each small enough to build in milliseconds.

A healthy vLLM line set (``vllm_body``) is the base; the others change one thing about it,
or are what a broken or malicious server sends instead."""

from __future__ import annotations

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
E2E = "vllm:e2e_request_latency_seconds"
CONFIG = "vllm:cache_config_info"


def vllm_body(*, model: str = "m", engine: str = "0", running: str = "3", usage: str = "0.5",
              config: str = 'num_gpu_blocks="1000",block_size="16"', extra: str = "") -> str:
    labels = f'engine="{engine}",model_name="{model}"'
    return (f"# TYPE {RUNNING} gauge\n{RUNNING}{{{labels}}} {running}\n"
            f"{WAITING}{{{labels}}} 1\n{USAGE}{{{labels}}} {usage}\n"
            f'{CONFIG}{{engine="{engine}",{config}}} 1\n{extra}')


def bad_config(name: str, value: str) -> str:
    """A cache_config_info label no KV pool can have (``num_gpu_blocks="inf"``)."""
    values = {"num_gpu_blocks": "1000", "block_size": "16", name: value}
    return vllm_body(config=",".join(f'{k}="{v}"' for k, v in values.items()))


def trtllm_infinite_pool() -> str:
    name = "nv_trt_llm_kv_cache_block_metrics"
    return (f'{name}{{kv_cache_block_type="max",model="m"}} +Inf\n'
            f'{name}{{kv_cache_block_type="used",model="m"}} 3\n'
            f'{name}{{kv_cache_block_type="tokens_per",model="m"}} 16\n')


def malformed_lines(count: int) -> str:
    """``count`` lines of a wanted family with a value that is not a number: each one once
    rescanned the body from its start (quadratic)."""
    return vllm_body() + "".join(f'{WAITING}{{model_name="m",engine="{i}"}} x{i}\n'
                                 for i in range(count))


def many_series(count: int) -> str:
    """Valid, but ``count`` series kvtop reads (a server is not that big)."""
    return "".join(f'{WAITING}{{i="{i}"}} 1\n' for i in range(count))


def long_line(chars: int) -> str:
    """One wanted line with a label value of ``chars`` characters."""
    return vllm_body() + f'{WAITING}{{model_name="{"a" * chars}",engine="0"}} 1\n'


def many_models(count: int, *, tag: str = "m", names: tuple[str, ...] = (RUNNING,)) -> str:
    """``count`` distinct model names (each an engine kvtop would track), a line of each
    of ``names`` for each."""
    return "".join(f'{name}{{model_name="{tag}{i}",engine="0"}} 1\n'
                   for i in range(count) for name in names)


def duplicate_series() -> str:
    """One series written twice: summed, it read as 10029 running."""
    return vllm_body(running="30") + f'{RUNNING}{{engine="0",model_name="m"}} 9999\n'


def impossible_values() -> str:
    """Usage above 1, a negative counter, cumulative buckets that go down."""
    labels = 'engine="0",model_name="m"'
    buckets = "".join(f'{E2E}_bucket{{{labels},le="{le}"}} {n}\n'
                      for le, n in (("0.1", 5), ("1.0", 2), ("+Inf", 7)))
    return (vllm_body(usage="1.7") + f"{PREEMPTIONS}{{{labels}}} -4\n" + buckets
            + f"{E2E}_count{{{labels}}} 7\n{E2E}_sum{{{labels}}} 3.5\n")

"""Prometheus texts written the way SGLang and Triton/TRT-LLM write them, a family at a time."""

from __future__ import annotations


def sglang_ranks(extra: str = "") -> str:
    """An SGLang 0.5.x engine on two TP ranks: each rank reports the same pool."""
    lines = []
    for rank in ("0", "1"):
        labels = f'model_name="q",tp_rank="{rank}"'
        lines += [f"sglang:token_usage{{{labels}}} 0.{rank}5",
                  f"sglang:num_used_tokens{{{labels}}} 1{rank}00",
                  f"sglang:num_running_reqs{{{labels}}} {3 + int(rank)}",
                  f"sglang:num_queue_reqs{{{labels}}} 2",
                  f"sglang:prompt_tokens_total{{{labels}}} 500",
                  f"sglang:generation_tokens_total{{{labels}}} 70"]
    return "\n".join(lines) + "\n" + extra


def sglang_histogram(name: str, count: int) -> str:
    return (f'{name}_bucket{{model_name="q",le="0.1"}} {count}\n'
            f'{name}_bucket{{model_name="q",le="+Inf"}} {count}\n'
            f'{name}_count{{model_name="q"}} {count}\n{name}_sum{{model_name="q"}} 1.5\n')


def trt(model: str, **kinds: float) -> str:
    return "".join(
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="{kind}",model="{model}",'
        f'version="1"}} {value}\n' for kind, value in kinds.items())

"""From two successive readings of one engine to the numbers a person reads.

Counters become rates over the window between the scrapes. A counter that went backwards
means the server restarted: that window gives no rates (never a negative one) and the
current reading becomes the new baseline.
"""

from __future__ import annotations

from kvtop.collect.reading import EngineReading
from kvtop.derive.cache import add_cache_numbers
from kvtop.derive.quantiles import quantiles
from kvtop.derive.stats import EngineStats

COUNTERS = ("prompt_tokens_total", "generation_tokens_total", "preemptions_total",
            "prefix_queries_total", "prefix_hits_total", "finished_prompt_tokens_total",
            "finished_generation_tokens_total")


def _counter_values(reading: EngineReading) -> dict[str, float]:
    values = {name: getattr(reading, name) for name in COUNTERS}
    values["finished"] = sum(reading.finished_total.values()) if reading.finished_total else None
    for name in ("ttft", "itl", "e2e"):
        histogram = getattr(reading, name)
        values[name] = None if histogram is None else histogram.count
    return {name: value for name, value in values.items() if value is not None}


def went_backwards(now: EngineReading, before: EngineReading) -> bool:
    """True when any counter both readings carry is lower now: the server restarted."""
    current, previous = _counter_values(now), _counter_values(before)
    return any(current[name] < previous[name] for name in current.keys() & previous.keys())


def _rate(now: float | None, before: float | None, dt: float) -> float | None:
    if now is None or before is None:
        return None
    return max(0.0, now - before) / dt


def _usage_numbers(stats: EngineStats, reading: EngineReading) -> None:
    if reading.kv_usage is not None and reading.blocks_total is not None:
        stats.blocks_used = reading.kv_usage * reading.blocks_total
    stats.tokens_used = reading.tokens_used
    if stats.tokens_used is None and reading.kv_usage is not None and reading.tokens_total:
        stats.tokens_used = reading.kv_usage * reading.tokens_total


def tokens_in_flight(reading: EngineReading) -> float | None:
    """Prompt and generated tokens counted so far less those of the finished requests: the
    tokens of the requests in flight. vLLM counts a prompt at its first token and a finished
    request's tokens when it ends, so this is the context of the requests past their first
    token, preempted ones included; a request aborted before its first token makes it
    under-count by its prompt from then on (docs/leak-detector.md)."""
    prompt, generated = reading.prompt_tokens_total, reading.generation_tokens_total
    finished_prompt = reading.finished_prompt_tokens_total
    finished_generated = reading.finished_generation_tokens_total
    if (prompt is None or generated is None or finished_prompt is None
            or finished_generated is None):
        return None
    return prompt + generated - finished_prompt - finished_generated


def _hit_rate(stats: EngineStats, now: EngineReading, before: EngineReading | None) -> None:
    """Δhits/Δqueries over the window; the lifetime ratio without one (or no traffic in it)."""
    if now.prefix_caching is False:
        return
    queries, hits = now.prefix_queries_total, now.prefix_hits_total
    if before is not None and before.prefix_queries_total is not None and queries is not None:
        window_queries = queries - before.prefix_queries_total
        if window_queries > 0 and hits is not None and before.prefix_hits_total is not None:
            stats.hit_rate = (hits - before.prefix_hits_total) / window_queries
            stats.hit_rate_scope = "window"
            return
    if queries and hits is not None:
        stats.hit_rate, stats.hit_rate_scope = hits / queries, "lifetime"
    elif now.reported_hit_rate is not None:
        stats.hit_rate, stats.hit_rate_scope = now.reported_hit_rate, "reported"


def _window_rates(stats: EngineStats, now: EngineReading, before: EngineReading,
                  dt: float) -> None:
    stats.window_s = dt
    stats.prompt_tps = _rate(now.prompt_tokens_total, before.prompt_tokens_total, dt)
    stats.generation_tps = _rate(now.generation_tokens_total, before.generation_tokens_total, dt)
    stats.preemptions_per_s = _rate(now.preemptions_total, before.preemptions_total, dt)
    stats.prefix_queries_per_s = _rate(now.prefix_queries_total, before.prefix_queries_total, dt)
    stats.finished_per_s = {
        reason: rate for reason, count in now.finished_total.items()
        if (rate := _rate(count, before.finished_total.get(reason, 0.0), dt)) is not None
    }
    for name in ("ttft", "itl", "e2e"):
        setattr(stats, name, quantiles(getattr(now, name), getattr(before, name), "window"))


def derive_engine_stats(now: EngineReading, before: EngineReading | None, t: float,
                        dt: float | None) -> EngineStats:
    """The stats for ``now``; rates need ``before`` from ``dt`` seconds earlier."""
    stats = EngineStats(
        model=now.model, engine=now.engine, t=t, kv_usage=now.kv_usage,
        blocks_total=now.blocks_total, block_size=now.block_size,
        tokens_total=now.tokens_total, running=now.running, waiting=now.waiting,
        waiting_deferred=now.waiting_deferred, tokens_in_flight=tokens_in_flight(now),
        swapped=now.swapped, preemptions_total=now.preemptions_total,
        prefix_queries_total=now.prefix_queries_total,
        prefix_hits_total=now.prefix_hits_total, idle_floor_blocks=now.idle_floor_blocks,
        idle_floor_exact=now.idle_floor_exact,
        prefix_caching=now.prefix_caching, cache_config=now.cache_config,
        prefix_unit=now.prefix_unit, cpu_kv_usage=now.cpu_kv_usage, lora=now.lora,
    )
    _usage_numbers(stats, now)
    if before is not None and went_backwards(now, before):
        stats.restarted = True
        before = None
    _hit_rate(stats, now, before)
    add_cache_numbers(stats, now, before, dt)
    if before is not None and dt is not None and dt > 0:
        _window_rates(stats, now, before, dt)
    else:
        for name in ("ttft", "itl", "e2e"):
            setattr(stats, name, quantiles(getattr(now, name), None, "lifetime"))
    return stats

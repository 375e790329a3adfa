"""Values no server can mean, left out of a reading and counted: a KV usage outside 0..1,
a negative count or counter, more prefix hits than queries, a histogram whose cumulative
buckets go down. Shown, they would read as facts (a pool 170 % full, p50 = p90 = p99 = 0).

NaN stays what it is everywhere else in kvtop: "no value" (None), not flagged.
"""

from __future__ import annotations

import math

from kvtop.collect.reading import EngineReading, Histogram

FRACTIONS = ("kv_usage", "cpu_kv_usage", "reported_hit_rate")
COUNTS = ("running", "waiting", "waiting_deferred", "swapped", "tokens_used")
COUNTERS = ("preemptions_total", "prompt_tokens_total", "generation_tokens_total",
            "prefix_queries_total", "prefix_hits_total", "finished_prompt_tokens_total",
            "finished_generation_tokens_total", "external_queries_total",
            "external_hits_total", "evicted_tokens_total")
# by-label counts and counters: a value that can't be one drops the whole family
BY_LABEL = ("waiting_by_reason", "kv_fetch_by_stage", "admission_rejections_total",
            "prompt_tokens_by_source_total", "cached_tokens_by_tier_total")
HISTOGRAMS = ("ttft", "itl", "e2e", "prompt_lengths", "kv_computed", "block_lifetime",
              "block_idle", "block_reuse_gap")
MAX_VALUE = 2.0**53  # past this a float no longer counts one by one: no real count is there
SLACK = 1e-6  # a fraction the server computed may round a hair past 0 or 1


def drop_impossible(engine: EngineReading) -> list[str]:
    """Set each impossible field of ``engine`` to None; what was left out, one line each."""
    found: list[str] = []
    for name in FRACTIONS:
        _check(engine, name, -SLACK, 1 + SLACK, "not within 0..1", found)
    for name in COUNTS:
        _check(engine, name, 0.0, MAX_VALUE, "not a count", found)
    for name in COUNTERS:
        _check(engine, name, 0.0, MAX_VALUE, "not a counter's value", found)
    for reason, value in list(engine.finished_total.items()):
        if math.isnan(value) or not 0 <= value <= MAX_VALUE:
            del engine.finished_total[reason]
            if not math.isnan(value):
                found.append(f"request_success_total {value:g} (not a counter's value)")
    for name in BY_LABEL:
        values = getattr(engine, name)
        bad = [v for v in (values or {}).values() if not 0 <= v <= MAX_VALUE]
        if bad:
            setattr(engine, name, None)
            found.append(f"{name} {bad[0]:g} (not a count)")
    _check_hits(engine, found)
    _check_external(engine, found)
    for name in HISTOGRAMS:
        histogram = getattr(engine, name)
        if histogram is not None and (why := _histogram_fault(histogram)) is not None:
            setattr(engine, name, None)
            found.append(f"{name} histogram ({why})")
    return found


def _check(engine: EngineReading, name: str, low: float, high: float, why: str,
           found: list[str]) -> None:
    value = getattr(engine, name)
    if value is None or low <= value <= high:
        return
    setattr(engine, name, None)
    if not math.isnan(value):
        found.append(f"{name} {value:g} ({why})")


def _check_hits(engine: EngineReading, found: list[str]) -> None:
    hits, queries = engine.prefix_hits_total, engine.prefix_queries_total
    if hits is not None and queries is not None and hits > queries * (1 + SLACK):
        found.append(f"prefix cache hits {hits:g} above queries {queries:g}")
        engine.prefix_hits_total = engine.prefix_queries_total = engine.prefix_unit = None


def _check_external(engine: EngineReading, found: list[str]) -> None:
    hits, queries = engine.external_hits_total, engine.external_queries_total
    if hits is not None and queries is not None and hits > queries * (1 + SLACK):
        found.append(f"external prefix cache hits {hits:g} above queries {queries:g}")
        engine.external_hits_total = engine.external_queries_total = None


def _histogram_fault(histogram: Histogram) -> str | None:
    previous = 0.0
    for bound, count in histogram.buckets:
        if math.isnan(bound):
            return "a bucket bound that is not a number"
        if not 0 <= count <= MAX_VALUE:  # NaN fails this too
            return f"a bucket count of {count:g}"
        if count < previous:
            return f"cumulative buckets go down, {previous:g} then {count:g} at le={bound:g}"
        previous = count
    for what, value in (("count", histogram.count), ("sum", histogram.sum)):
        if value is not None and not 0 <= value <= MAX_VALUE:
            return f"a {what} of {value:g}"
    return None

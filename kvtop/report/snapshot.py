"""The ``kvtop snapshot`` JSON contract (version 1; schema in docs/snapshot-json.md).

Scripts and CI parse this: keys are only ever added, never renamed or removed; the minor
version counts the additions (1: the cache, what limits, KV events).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from kvtop.contract import json_number
from kvtop.derive.stats import EngineStats, KvEventStats, Quantiles, Residency, Reuse
from kvtop.derive.tracker import EngineKey, TargetState
from kvtop.derive.verdicts import LeakVerdict, LimitVerdict, StallVerdict
from kvtop.derive.worst import block_hash_text

SNAPSHOT_VERSION = 1
SNAPSHOT_MINOR = 1  # keys added to version 1: docs/snapshot-json.md, "Minor versions"


def _quantiles_json(q: Quantiles | None) -> dict[str, Any] | None:
    if q is None:
        return None
    return {"p50": json_number(q.p50), "p90": json_number(q.p90), "p99": json_number(q.p99),
            "samples": json_number(q.samples), "scope": q.scope, "estimate": True}


def leak_json(verdict: LeakVerdict | None) -> dict[str, Any] | None:
    if verdict is None:
        return None
    return {"state": verdict.state, "reason": verdict.reason,
            "leaked_blocks": json_number(verdict.leaked_blocks, 1),
            "slope_blocks_per_hour": json_number(verdict.slope_blocks_per_hour, 1),
            "hours_to_full": json_number(verdict.hours_to_full, 2)}


def stall_json(verdict: StallVerdict | None) -> dict[str, Any] | None:
    if verdict is None:
        return None
    return {"state": verdict.state, "reason": verdict.reason, "since_t": verdict.since_t}


def _shares(values: dict[str, float] | None, digits: int = 6) -> dict[str, Any] | None:
    return None if values is None else {k: json_number(v, digits) for k, v in values.items()}


def _reuse_json(reuse: Reuse | None) -> dict[str, Any] | None:
    if reuse is None:
        return None
    return {"scope": reuse.scope, "prompt_tokens": json_number(reuse.prompt_tokens, 1),
            "by_source": _shares(reuse.by_source), "by_tier": _shares(reuse.cached_by_tier),
            "reuse_share": json_number(reuse.reuse_share),
            "external_hit_rate": json_number(reuse.external_hit_rate)}


def _residency_json(residency: Residency | None) -> dict[str, Any] | None:
    if residency is None:
        return None
    return {"state": residency.state, "lifetime_s": _quantiles_json(residency.lifetime),
            "idle_s": _quantiles_json(residency.idle),
            "reuse_gap_s": _quantiles_json(residency.reuse_gap)}


def cache_json(stats: EngineStats) -> dict[str, Any]:
    return {"waiting_by_reason": _shares(stats.waiting_by_reason),
            "kv_fetch_by_stage": _shares(stats.kv_fetch_by_stage),
            "sleep_state": stats.sleep_state,
            "admission_rejections_per_s": _shares(stats.admission_rejections_per_s, 4),
            "evicted_tokens_per_s": json_number(stats.evicted_tokens_per_s, 3),
            "mean_prompt_tokens": json_number(stats.mean_prompt_tokens, 1),
            "reuse": _reuse_json(stats.reuse), "residency": _residency_json(stats.residency)}


def limit_json(verdict: LimitVerdict | None) -> dict[str, Any] | None:
    if verdict is None:
        return None
    return {"limit": verdict.limit, "reason": verdict.reason,
            "evidence": {k: json_number(v) if isinstance(v, float) else v
                         for k, v in verdict.evidence.items()}}


def kv_events_json(events: KvEventStats | None) -> dict[str, Any] | None:
    if events is None:
        return None
    return {
        "batches": events.batches, "first_seq": events.first_seq, "last_seq": events.last_seq,
        "stored_total": events.stored_total, "removed_total": events.removed_total,
        "cleared": events.cleared, "population": events.population,
        "stored_per_s": json_number(events.stored_per_s, 3),
        "removed_per_s": json_number(events.removed_per_s, 3),
        "reuses": events.reuses, "reuses_per_s": json_number(events.reuses_per_s, 3),
        "reuse_share": json_number(events.reuse_share),
        "age_at_eviction_s": _quantiles_json(events.age_at_eviction),
        "hot_prefixes": [{"block_hash": block_hash_text(h.block_hash), "tokens": h.tokens,
                          "reuses": h.reuses} for h in events.hot],
        "leak": {"state": events.leak, "reason": events.leak_reason,
                 "leaked_blocks": events.leaked_blocks,
                 "leaked_sample": [block_hash_text(k) for k in events.leaked_sample],
                 "turnovers": json_number(events.turnovers, 2),
                 "pool_blocks": events.pool_blocks},
        "completeness": {"lost_batches": events.lost_batches, "malformed": events.malformed,
                         "unknown_events": events.unknown_events, "restarts": events.restarts,
                         "removed_unknown": events.removed_unknown,
                         "index_dropped": events.index_dropped},
        "by_medium": {k: {"stored": v[0], "removed": v[1]} for k, v in events.by_medium.items()},
    }


def engine_json(stats: EngineStats) -> dict[str, Any]:
    return {
        "model": stats.model,
        "engine": stats.engine,
        "kv": {
            "usage": json_number(stats.kv_usage),
            "blocks_total": stats.blocks_total,
            "blocks_used": json_number(stats.blocks_used, 3),
            "block_size": stats.block_size,
            "tokens_total": stats.tokens_total,
            "tokens_used": json_number(stats.tokens_used, 1),
            "idle_floor_blocks": stats.idle_floor_blocks,
            "cpu_usage": json_number(stats.cpu_kv_usage),
        },
        "requests": {"running": json_number(stats.running), "waiting": json_number(stats.waiting),
                     "swapped": json_number(stats.swapped)},
        "prefix_cache": {"hit_rate": json_number(stats.hit_rate),
                         "hit_rate_scope": stats.hit_rate_scope,
                         "queries_total": json_number(stats.prefix_queries_total),
                         "hits_total": json_number(stats.prefix_hits_total),
                         "unit": stats.prefix_unit},
        "preemptions_total": json_number(stats.preemptions_total),
        "rates": {
            "window_s": json_number(stats.window_s, 3),
            "prompt_tokens_per_s": json_number(stats.prompt_tps, 3),
            "generation_tokens_per_s": json_number(stats.generation_tps, 3),
            "preemptions_per_s": json_number(stats.preemptions_per_s, 4),
            "finished_per_s": {k: json_number(v, 4) for k, v in stats.finished_per_s.items()},
        },
        "latency_s": {name: _quantiles_json(getattr(stats, name))
                      for name in ("ttft", "itl", "e2e")},
        "restarted": stats.restarted,
        "leak": leak_json(stats.leak),
        "stall": stall_json(stats.stall),
        "cache": cache_json(stats),
        "limit": limit_json(stats.limit),
        "kv_events": kv_events_json(stats.kv_events),
    }


def _status(state: TargetState) -> str:
    return "down" if state.status == "pending" else state.status


def target_json(state: TargetState, now: float) -> dict[str, Any]:
    age = state.age_s(now)
    return {
        "target": state.target.url,
        "name": state.target.name,
        "label": state.target.label,
        "status": _status(state),
        "error": state.error,
        "server": {"kind": state.kind or "unknown", "version": state.version,
                   "version_inferred": state.version_inferred},
        "last_good_age_s": None if age is None else round(age, 3),
        "restarted_at": state.restarted_at,
        "notes": list(state.notes),
        "engines_over_cap": state.engines_over_cap,
        "impossible_values": state.impossible_values,
        "engines": [engine_json(stats) for stats in state.engines],
    }


def history_json(history: Mapping[EngineKey, Iterable[EngineStats]]) -> list[dict[str, Any]]:
    """Per-engine time series, as columns, for snapshot files written by the app."""
    out = []
    for (model, engine), series in history.items():
        rows = list(series)
        out.append({
            "model": model, "engine": engine,
            "t": [row.t for row in rows],
            "kv_usage": [json_number(row.kv_usage) for row in rows],
            "blocks_used": [json_number(row.blocks_used, 3) for row in rows],
            "running": [json_number(row.running) for row in rows],
            "waiting": [json_number(row.waiting) for row in rows],
            "hit_rate": [json_number(row.hit_rate) for row in rows],
            "generation_tokens_per_s": [json_number(row.generation_tps, 3) for row in rows],
        })
    return out


def snapshot_document(
    states: Iterable[TargetState],
    gpus: list[dict[str, Any]],
    *,
    taken_at: datetime,
    history: Mapping[str, Mapping[EngineKey, Iterable[EngineStats]]] | None = None,
    gpu_sources: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The snapshot JSON; ``history`` (by target URL) is added by the app's ``s`` key;
    ``gpu_sources`` says where ``gpus`` were looked for and what came of it."""
    now = taken_at.timestamp()
    targets = []
    for state in states:
        entry = target_json(state, now)
        if history is not None and state.target.url in history:
            entry["history"] = history_json(history[state.target.url])
        targets.append(entry)
    return {
        "kvtop_snapshot": SNAPSHOT_VERSION,
        "kvtop_snapshot_minor": SNAPSHOT_MINOR,
        "taken_at": taken_at.isoformat(timespec="milliseconds"),
        "targets": targets,
        "gpus": gpus,
        "gpu_sources": gpu_sources or [],
    }

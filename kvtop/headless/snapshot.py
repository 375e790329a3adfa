"""The ``kvtop snapshot`` JSON contract (version 1; schema in docs/snapshot-json.md).

Scripts and CI parse this: keys are only ever added, never renamed or removed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from kvtop.derive.leak import LeakVerdict
from kvtop.derive.stats import EngineStats, Quantiles
from kvtop.derive.tracker import EngineKey, TargetState

SNAPSHOT_VERSION = 1


def _num(value: float | None, digits: int = 6) -> float | None:
    """JSON has no NaN or Inf: such values are unknown."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def _quantiles_json(q: Quantiles | None) -> dict[str, Any] | None:
    if q is None:
        return None
    return {"p50": _num(q.p50), "p90": _num(q.p90), "p99": _num(q.p99),
            "samples": _num(q.samples), "scope": q.scope, "estimate": True}


def leak_json(verdict: LeakVerdict | None) -> dict[str, Any] | None:
    if verdict is None:
        return None
    return {"state": verdict.state, "reason": verdict.reason,
            "leaked_blocks": _num(verdict.leaked_blocks, 1),
            "slope_blocks_per_hour": _num(verdict.slope_blocks_per_hour, 1),
            "hours_to_full": _num(verdict.hours_to_full, 2)}


def engine_json(stats: EngineStats) -> dict[str, Any]:
    return {
        "model": stats.model,
        "engine": stats.engine,
        "kv": {
            "usage": _num(stats.kv_usage),
            "blocks_total": stats.blocks_total,
            "blocks_used": _num(stats.blocks_used, 3),
            "block_size": stats.block_size,
            "tokens_total": stats.tokens_total,
            "tokens_used": _num(stats.tokens_used, 1),
            "idle_floor_blocks": stats.idle_floor_blocks,
            "cpu_usage": _num(stats.cpu_kv_usage),
        },
        "requests": {"running": _num(stats.running), "waiting": _num(stats.waiting),
                     "swapped": _num(stats.swapped)},
        "prefix_cache": {"hit_rate": _num(stats.hit_rate),
                         "hit_rate_scope": stats.hit_rate_scope,
                         "queries_total": _num(stats.prefix_queries_total),
                         "hits_total": _num(stats.prefix_hits_total),
                         "unit": stats.prefix_unit},
        "preemptions_total": _num(stats.preemptions_total),
        "rates": {
            "window_s": _num(stats.window_s, 3),
            "prompt_tokens_per_s": _num(stats.prompt_tps, 3),
            "generation_tokens_per_s": _num(stats.generation_tps, 3),
            "preemptions_per_s": _num(stats.preemptions_per_s, 4),
            "finished_per_s": {k: _num(v, 4) for k, v in stats.finished_per_s.items()},
        },
        "latency_s": {name: _quantiles_json(getattr(stats, name))
                      for name in ("ttft", "itl", "e2e")},
        "restarted": stats.restarted,
        "leak": leak_json(stats.leak),
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
        "server": {"kind": state.kind or "unknown", "version": state.version},
        "last_good_age_s": None if age is None else round(age, 3),
        "restarted_at": state.restarted_at,
        "notes": list(state.notes),
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
            "kv_usage": [_num(row.kv_usage) for row in rows],
            "blocks_used": [_num(row.blocks_used, 3) for row in rows],
            "running": [_num(row.running) for row in rows],
            "waiting": [_num(row.waiting) for row in rows],
            "hit_rate": [_num(row.hit_rate) for row in rows],
            "generation_tokens_per_s": [_num(row.generation_tps, 3) for row in rows],
        })
    return out


def snapshot_document(
    states: Iterable[TargetState],
    gpus: list[dict[str, Any]],
    *,
    taken_at: datetime,
    history: Mapping[str, Mapping[EngineKey, Iterable[EngineStats]]] | None = None,
) -> dict[str, Any]:
    """The snapshot JSON; ``history`` (by target URL) is added by the app's ``s`` key."""
    now = taken_at.timestamp()
    targets = []
    for state in states:
        entry = target_json(state, now)
        if history is not None and state.target.url in history:
            entry["history"] = history_json(history[state.target.url])
        targets.append(entry)
    return {
        "kvtop_snapshot": SNAPSHOT_VERSION,
        "taken_at": taken_at.isoformat(timespec="milliseconds"),
        "targets": targets,
        "gpus": gpus,
    }

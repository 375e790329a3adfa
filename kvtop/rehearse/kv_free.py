"""The rehearsal's free-KV criterion: **free KV not falling**.

The leak detector (the app's, on every scrape) and the idle floor before the load against
after it; *fail* on a LEAK verdict or when more blocks stay used at idle after the run than
before (beyond the detector's residual threshold), with the leak's size; *watch* on the
detector's WATCH; not judged without an idle floor either side or a detector past its
warm-up, saying which (docs/rehearse.md).
"""

from __future__ import annotations

from typing import Any

from kvtop.derive.leak_params import LeakParams
from kvtop.derive.tracker import EngineKey
from kvtop.derive.worst import describe_size, leak_size, warmup_needs
from kvtop.rehearse.criteria import STATE_RANK, TITLES, Criterion, Span, State, rounded
from kvtop.rehearse.watch import EnginePoint, WatchData


def judge_kv(data: WatchData, params: LeakParams, span: Span) -> Criterion:
    engines = [_one_engine(key, points, data, params)
               for key, points in data.points.items()]
    engines = [e for e in engines if e is not None]
    if not engines:
        return Criterion("kv_free", TITLES["kv_free"], "not_judged",
                         "not judged: the server exports no KV block usage")
    worst = max(engines, key=lambda e: STATE_RANK[e[0]])
    figures: dict[str, Any] = {"engines": [e[2] for e in engines]}
    if any(span.holds(t) for t in data.restarts):
        figures["restarted_during_load"] = True
    if worst[0] == "not_judged":
        figures["needs"] = worst[2]["needs"]
    return Criterion("kv_free", TITLES["kv_free"], worst[0], worst[1], figures)


def _one_engine(key: EngineKey, points: list[EnginePoint], data: WatchData,
                params: LeakParams) -> tuple[State, str, dict[str, Any]] | None:
    if not any(p.used is not None for p in points):
        return None
    total = next((p.total for p in reversed(points) if p.total), None)
    before = idle_floor(points, "before")
    after = idle_floor(points, "after")
    threshold = max(params.residual_min_blocks, params.residual_min_frac * (total or 0))
    verdict = data.verdicts.get(key)
    detector = verdict.to_json() if verdict is not None else None
    name = " ".join(part for part in key if part) or "engine"
    figures: dict[str, Any] = {"model": key[0], "engine": key[1], "blocks_total": total,
                               "idle_used_before": rounded(before, 1),
                               "idle_used_after": rounded(after, 1),
                               "residual_threshold_blocks": rounded(threshold, 1),
                               "leak_detector": detector}
    rise = None if before is None or after is None else after - before
    figures["idle_used_rise"] = rounded(rise, 1)
    floor = (f"{before:.0f} blocks used at idle before the load, {after:.0f} after"
             if rise is not None else _why_no_floor(before, after))
    state = detector["verdict"] if detector else "unknown"
    said = f"{name}: leak detector {state.upper()} ({detector['reason'] if detector else '-'}); " \
           f"{floor}"
    held = rise is not None and rise > threshold
    if state in ("leak", "watch") or held:
        estimates = [v for v in (detector and detector["leaked_blocks"], rise if held else None)
                     if v is not None]
        size = leak_size(max(estimates) if estimates else None,
                         verdict.block_size if verdict else None,
                         verdict.bytes_per_block if verdict else None)
        figures["leak_size"] = size
        said += f"; leaked {describe_size(size)}"
    if state == "leak" or held:
        return "fail", "falling: " + said, figures
    if state == "watch":
        return "watch", "suspect: " + said, figures
    if state == "unknown" and rise is None:
        needs = (verdict.needs(params) if verdict else None) or warmup_needs(params, None, None)
        figures["needs"] = (f"needs an idle floor before and after the load, or the leak "
                            f"detector past its warm-up ({needs})")
        return "not_judged", f"not judged: {said}; {figures['needs']}", figures
    return "ok", "holding: " + said, figures


def idle_floor(points: list[EnginePoint], phase: str) -> float | None:
    """Least blocks used while idle in ``phase``, less the server's idle floor."""
    used = [p.used - p.idle_floor for p in points
            if p.phase == phase and p.idle and p.used is not None]
    return min(used) if used else None


def _why_no_floor(before: float | None, after: float | None) -> str:
    if before is None and after is None:
        return "the server was never idle before or after the load: no floor to compare"
    if before is None:
        return "the server was busy before the load: no floor to compare"
    return "the server did not go idle after the load: no floor to compare"

"""The sort keys: what each means for an engine (its number, worked out when a sort asks
for it), their labels, the `o` key's cycle, and the order of the verdicts in "worst first"."""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

from kvtop.derive.verdicts import LEAK_RANK, STALL_AS_LEAK
from kvtop.view.cells import window_hit, window_quantiles

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvtop.derive.stats import EngineStats
    from kvtop.derive.tracker import TargetState

# Sort keys: a column's key (its values from FleetRow.sort_value), or "worst".
TEXT_SORTS = frozenset({"name", "model"})  # alphabetical; every other key biggest first
SORT_LABELS: dict[str, str] = {
    "name": "name", "model": "model", "worst": "worst first", "kv": "KV use",
    "leak": "leak/stall", "running": "running", "waiting": "queue", "preempt": "preemptions",
    "hit": "hit rate", "prompt": "prompt tok/s", "gen": "generation", "ttft": "TTFT p99",
}
SORT_CYCLE = ("name", "kv", "waiting", "preempt", "gen", "leak", "worst")  # the `o` key
# a column sorted by another key than its own (LIMIT: what it explains, the queue)
COLUMN_SORT = {"status": "worst", "limit": "waiting"}
LARGE_FLEET = 32  # rows; past this the default sort is worst first instead of by name
PROBLEM_STATUSES = frozenset({"down", "timeout", "auth", "bad_payload", "stale"})


def column_sort_key(column: str) -> str | None:
    """The sort key a click on ``column``'s header asks for; None for a column that sorts
    nothing."""
    key = COLUMN_SORT.get(column, column)
    return key if key in SORT_LABELS else None


def _leak_rank(stats: EngineStats) -> float | None:
    """LEAK and STALLED first (either is an outage now or soon), then WATCH, SATURATED."""
    stall = STALL_AS_LEAK.get(stats.stall.state) if stats.stall is not None else None
    leak = LEAK_RANK[stats.leak.state] if stats.leak is not None else None
    if stall is None:
        return leak
    return max(leak or 0, LEAK_RANK[stall])


def _worst(state: TargetState, stats: EngineStats | None) -> float | None:
    """LEAK, then WATCH, then unreachable or stale; within each, the fullest KV first."""
    if state.status == "pending":
        return None
    leak = _leak_rank(stats) if stats is not None else None
    problem = 1 if state.status in PROBLEM_STATUSES else 0
    rank = 2 + leak if leak else problem
    usage = stats.usage if stats is not None else None
    return 2 * rank + min(usage or 0.0, 1.0)  # usage never crosses into the next rank


def _ttft_p99(stats: EngineStats) -> float | None:
    ttft = window_quantiles(stats.ttft)
    return None if ttft is None else ttft.p99


# Sort key -> the engine's number for it ("worst" also needs the target's state).
_ENGINE_SORT_VALUES: dict[str, Callable[[EngineStats], float | None]] = {
    "kv": attrgetter("usage"),
    "running": attrgetter("running"),
    "waiting": attrgetter("waiting"),
    "preempt": attrgetter("preemptions_per_s"),
    "hit": window_hit,
    "prompt": attrgetter("prompt_tps"),
    "gen": attrgetter("generation_tps"),
    "ttft": _ttft_p99,
    "leak": _leak_rank,
}


def engine_sort_value(key: str, state: TargetState,
                      stats: EngineStats | None) -> float | None:
    """An engine's number for sort key ``key`` (None: unknown, sorted last); a target
    without engines (``stats`` None) has one for "worst" only."""
    if key == "worst":
        return _worst(state, stats)
    value_of = _ENGINE_SORT_VALUES.get(key)
    return None if stats is None or value_of is None else value_of(stats)


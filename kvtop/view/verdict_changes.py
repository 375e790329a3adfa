"""What changed since the last frame that a person is told about once: an engine's leak
indicator moving between OK, WATCH and LEAK, and an engine entering STALLED."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtop.derive.verdicts import LEAK_RANK
from kvtop.view.fleet import engine_suffix, row_key, shown_label

if TYPE_CHECKING:
    from kvtop.derive.stats import EngineStats
    from kvtop.derive.tracker import TargetState
    from kvtop.derive.verdicts import LeakState, LeakVerdict


@dataclass(frozen=True, slots=True)
class LeakChange:
    """An engine whose indicator moved between OK, WATCH and LEAK: worth one notification."""

    key: str
    name: str
    verdict: LeakVerdict
    state: TargetState
    stats: EngineStats


@dataclass(frozen=True, slots=True)
class StallEntry:
    """An engine whose stall verdict has just turned STALLED: a bell and an alert."""

    key: str
    name: str
    state: TargetState
    stats: EngineStats


def stall_entries(
    states: list[TargetState], seen: dict[str, str]
) -> tuple[list[StallEntry], dict[str, str]]:
    """Engines that entered STALLED since ``seen`` (row key -> stall state) and the new
    ``seen``: a held STALLED is told once, again only after it made progress."""
    entries: list[StallEntry] = []
    now_seen = dict(seen)
    for state in states:
        for stats in state.engines:
            if stats.stall is None:
                continue
            key = row_key(state.target.url, (stats.model, stats.engine))
            now_seen[key] = stats.stall.state
            if stats.stall.state == "stalled" and seen.get(key) != "stalled":
                name = shown_label(state.target) + engine_suffix(stats, state.engines)
                entries.append(StallEntry(key, name, state, stats))
    return entries, now_seen


def leak_changes(
    states: list[TargetState], seen: dict[str, LeakState]
) -> tuple[list[LeakChange], dict[str, LeakState]]:
    """Changes of indicator level since ``seen`` (row key -> state) and the new ``seen``.

    Only a change of level counts (warmup -> OK does not), so a held state is told once, not
    at every poll. An engine that is gone keeps its last state.
    """
    changes: list[LeakChange] = []
    now_seen = dict(seen)
    for state in states:
        for stats in state.engines:
            verdict = stats.leak
            if verdict is None:
                continue
            key = row_key(state.target.url, (stats.model, stats.engine))
            before = seen.get(key, "warmup")
            now_seen[key] = verdict.state
            if LEAK_RANK[verdict.state] != LEAK_RANK[before]:
                name = shown_label(state.target) + engine_suffix(stats, state.engines)
                changes.append(LeakChange(key, name, verdict, state, stats))
    return changes, now_seen


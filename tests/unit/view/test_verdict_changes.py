"""What a person is told once: leak indicator changes and engines entering STALLED."""

from __future__ import annotations

from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.view.verdict_changes import leak_changes, stall_entries
from tests.scenarios.app import LEAKING, QUIET

NOW = 1000.0
WARMUP = LeakVerdict("warmup", "collecting data", None, None, None)
WATCHING = LeakVerdict("watch", "floor rising", 80.0, 1234.0, 9.0)


def _state(spec: str, verdict: LeakVerdict | None) -> TargetState:
    stats = EngineStats("m", None, NOW, blocks_used=10, blocks_total=100, leak=verdict)
    return TargetState(Target.from_spec(spec), "up", kind="vllm", engines=[stats],
                       last_good_t=NOW)


def test_a_state_change_is_told_once() -> None:
    seen: dict[str, str] = {}
    told = []
    for verdict in (WARMUP, QUIET, QUIET, WATCHING, LEAKING, LEAKING, LEAKING, QUIET, QUIET):
        changes, seen = leak_changes([_state("a:1", verdict)], seen)
        told += [c.verdict.state for c in changes]
    assert told == ["watch", "leak", "ok"]  # warmup -> OK is not news


def _stall_state(stall: str | None) -> TargetState:
    verdict = None if stall is None else StallVerdict(stall, "no token for 60s", NOW - 60)
    stats = EngineStats("m", None, NOW, stall=verdict)
    return TargetState(Target.from_spec("a:1"), "up", kind="vllm", engines=[stats],
                       last_good_t=NOW)


def test_a_stall_is_told_when_it_starts_and_again_only_after_progress() -> None:
    seen: dict[str, str] = {}
    told = []
    for stall in ("ok", "stalled", "stalled", None, "stalled", "saturated", "stalled", "ok"):
        entries, seen = stall_entries([_stall_state(stall)], seen)
        told += [(entry.name, entry.stats.stall.state) for entry in entries if entry.stats.stall]
    # an engine without a verdict for a moment keeps its last one: no second alert there
    assert told == [("a:1", "stalled"), ("a:1", "stalled")]

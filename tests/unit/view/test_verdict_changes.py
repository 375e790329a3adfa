"""What a person is told once: leak indicator changes and engines entering STALLED."""

from __future__ import annotations

from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.view.verdict_changes import LeakChange, StallEntry, leak_changes, stall_entries
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


def _ranks(**verdicts: object) -> TargetState:
    """One server with data-parallel ranks "0" and "1" of one model; ``leak0``/``stall1`` etc.
    set a rank's verdicts."""
    engines = [EngineStats("m", rank, NOW, blocks_used=10, blocks_total=100,
                           leak=verdicts.get(f"leak{rank}"),  # type: ignore[arg-type]
                           stall=verdicts.get(f"stall{rank}"))  # type: ignore[arg-type]
               for rank in ("0", "1")]
    return TargetState(Target.from_spec("gpu-7:8000"), "up", kind="vllm", engines=engines,
                       last_good_t=NOW)


def test_each_rank_is_told_by_its_own_key_and_name_after_one_without_a_verdict() -> None:
    state = _ranks(leak1=WATCHING)
    changes, seen = leak_changes([state], {})
    url = state.target.url
    assert changes == [LeakChange(f"{url}|m|1", "gpu-7:8000 e1", WATCHING, state,
                                  state.engines[1])]
    assert seen == {f"{url}|m|1": "watch"}


def test_each_rank_entering_stalled_is_told_by_its_own_key_and_name() -> None:
    stalled = StallVerdict("stalled", "no token for 60s", NOW - 60)
    state = _ranks(stall1=stalled)
    entries, seen = stall_entries([state], {})
    url = state.target.url
    assert entries == [StallEntry(f"{url}|m|1", "gpu-7:8000 e1", state, state.engines[1])]
    assert seen == {f"{url}|m|1": "stalled"}

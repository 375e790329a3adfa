"""The sort keys' numbers for an engine: the order of verdicts in "worst first" and in the
leak column's sort, and KV use breaking ties only within a rank."""

from __future__ import annotations

import pytest

from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.view.sort_keys import engine_sort_value

NOW = 1000.0


def _engine(usage: float | None = None, leak: str | None = None,
            stall: str | None = None) -> EngineStats:
    return EngineStats("m", None, NOW, kv_usage=usage,
                       leak=LeakVerdict(leak, "why", None, None, None) if leak else None,
                       stall=StallVerdict(stall, "why", NOW) if stall else None)


def _worst(status: str, stats: EngineStats | None) -> float | None:
    state = TargetState(Target.from_spec("h:1"), status, engines=[stats] if stats else [])
    return engine_sort_value("worst", state, stats)


@pytest.mark.parametrize(("leak", "stall", "rank"), [
    (None, None, None), ("warmup", None, 0), ("ok", None, 0), ("watch", None, 1),
    ("leak", None, 2), (None, "saturated", 1), (None, "stalled", 2), ("watch", "stalled", 2),
    ("leak", "saturated", 2), ("ok", "ok", 0),
])
def test_the_leak_key_ranks_stalled_with_leak_and_saturated_with_watch(
        leak: str | None, stall: str | None, rank: int | None) -> None:
    state = TargetState(Target.from_spec("h:1"), "up")
    assert engine_sort_value("leak", state, _engine(leak=leak, stall=stall)) == rank


def test_worst_first_ranks_verdicts_then_trouble_and_kv_use_only_within_a_rank() -> None:
    assert _worst("pending", None) is None  # never scraped: unknown, last
    assert _worst("up", _engine(0.0)) == 0.0
    assert _worst("up", _engine(1.0)) == 1.0  # a full pool: the top of the healthy rank...
    assert _worst("down", None) == 2.0  # ...still under a server that does not answer
    # a pool reported over 100 % (a server's bug) must not jump into the next rank
    assert _worst("up", _engine(2.5)) == 1.0
    assert _worst("stale", _engine(0.5)) == 2.5
    assert _worst("up", _engine(0.0, leak="watch")) == 6.0 == _worst("up", _engine(
        0.0, stall="saturated"))
    assert _worst("up", _engine(0.3, leak="leak")) == 8.3 == _worst("up", _engine(
        0.3, stall="stalled"))


def test_a_key_the_engine_has_no_number_for_is_unknown() -> None:
    state = TargetState(Target.from_spec("h:1"), "down")
    assert engine_sort_value("kv", state, None) is None  # no engine
    assert engine_sort_value("kv", state, _engine()) is None  # not exported
    assert engine_sort_value("no-such-key", state, _engine(0.5)) is None

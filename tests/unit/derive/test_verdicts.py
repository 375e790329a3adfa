"""Each kind of state's one order of severity: warm-up no more news than OK, a verdict
reached worse news than none, a stall from unknown to stalled, and where a stall sits among
leak states for a person."""

from __future__ import annotations

from typing import get_args

from kvtop.derive.verdicts import (
    LEAK_RANK,
    STALL_AS_LEAK,
    STALL_RANK,
    VERDICT_RANK,
    LeakState,
    StallState,
    Verdict,
)


def order(rank: dict[str, int]) -> list[str]:
    return sorted(rank, key=rank.__getitem__)


def test_every_state_has_its_rank() -> None:
    assert set(LEAK_RANK) == set(get_args(LeakState))
    assert set(STALL_RANK) == set(get_args(StallState))
    assert set(VERDICT_RANK) == set(get_args(Verdict))


def test_the_orders_of_severity() -> None:
    assert LEAK_RANK["warmup"] == LEAK_RANK["ok"] < LEAK_RANK["watch"] < LEAK_RANK["leak"]
    assert order(STALL_RANK) == ["unknown", "ok", "saturated", "stalled"]
    assert order(VERDICT_RANK) == ["unknown", "ok", "watch", "leak"]
    assert len(set(STALL_RANK.values())) == len(set(VERDICT_RANK.values())) == 4


def test_a_saturated_pool_is_as_urgent_as_watch_and_a_stall_as_leak() -> None:
    assert STALL_AS_LEAK == {"saturated": "watch", "stalled": "leak"}

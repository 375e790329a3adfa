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


def test_a_header_click_sorts_by_its_own_key_status_worst_first_limit_by_the_queue() -> None:
    from kvtop.view.sort_keys import column_sort_key

    assert [column_sort_key(c) for c in ("name", "kv", "ttft", "status", "limit")] == [
        "name", "kv", "ttft", "worst", "waiting"]
    assert column_sort_key("gpu") is None  # a column that sorts nothing
    assert column_sort_key("delta") is None


def test_each_key_reads_its_own_number() -> None:
    from kvtop.derive.stats import Quantiles

    stats = EngineStats("m", None, NOW, kv_usage=0.5, running=4, waiting=3,
                        preemptions_per_s=0.25, hit_rate=0.42, hit_rate_scope="window",
                        prompt_tps=1200.0, generation_tps=300.0,
                        ttft=Quantiles(0.05, 0.1, 0.2, 5, "window"),
                        leak=LeakVerdict("watch", "why", None, None, None))
    state = TargetState(Target.from_spec("h:1"), "up", engines=[stats])
    values = {key: engine_sort_value(key, state, stats) for key in (
        "kv", "running", "waiting", "preempt", "hit", "prompt", "gen", "ttft", "leak")}
    assert values == {"kv": 0.5, "running": 4, "waiting": 3, "preempt": 0.25, "hit": 0.42,
                      "prompt": 1200.0, "gen": 300.0, "ttft": 0.2, "leak": 1}
    lifetime = EngineStats("m", None, NOW, hit_rate=0.38, hit_rate_scope="lifetime",
                           ttft=Quantiles(0.2, 0.4, 0.9, 50, "lifetime"))
    assert engine_sort_value("hit", state, lifetime) is None  # only the window's is current
    assert engine_sort_value("ttft", state, lifetime) is None


@pytest.mark.parametrize(("status", "rank"), [
    ("up", 0), ("down", 1), ("timeout", 1), ("auth", 1), ("bad_payload", 1), ("stale", 1),
])
def test_worst_first_puts_every_failed_or_stale_target_above_the_healthy(
        status: str, rank: int) -> None:
    assert _worst(status, _engine(0.25)) == 2 * rank + 0.25


def test_a_fleet_of_more_than_32_rows_is_sorted_worst_first() -> None:
    from kvtop.view.fleet import build_rows
    from kvtop.view.view_state import ViewState

    def default_sort(count: int) -> str:
        view = ViewState()
        view.shown(build_rows([TargetState(Target.from_spec(f"h{i:03d}:1"), "up")
                               for i in range(count)], NOW))
        return view.sort_key

    assert (default_sort(32), default_sort(33)) == ("name", "worst")

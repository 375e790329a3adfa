"""The free-KV criterion on made-up runs whose answer is known: the detector's verdicts,
the idle floor before and after, the block allowance, a leak's size, what it needs.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvtop.derive.leak_params import LeakParams
from kvtop.rehearse.kv_free import idle_floor, judge_kv
from kvtop.rehearse.watch import EnginePoint, WatchData
from tests.scenarios.rehearse_runs import SPAN, engine_points, sized_leak, watch_data


def test_free_kv() -> None:
    params = LeakParams()
    ok = judge_kv(watch_data(engine_points(0, 0), "ok"), params, SPAN)
    assert ok.state == "ok"
    kept = judge_kv(watch_data(engine_points(0, 40), "ok"), params, SPAN)
    assert kept.state == "fail" and "0 blocks used at idle before the load, 40 after" in \
        kept.reason
    assert kept.figures["engines"][0]["idle_used_rise"] == 40
    leak = judge_kv(watch_data(engine_points(0, 0), "leak"), params, SPAN)
    assert leak.state == "fail" and "LEAK" in leak.reason
    watch = judge_kv(watch_data(engine_points(0, 1), "watch"), params, SPAN)
    assert watch.state == "watch"
    busy = judge_kv(watch_data(engine_points(0, 300, idle_after=False)), params, SPAN)
    assert busy.state == "not_judged" and "did not go idle" in busy.reason
    assert judge_kv(WatchData(), params, SPAN).state == "not_judged"


def test_the_idle_floor_is_the_least_used_at_idle() -> None:
    points = engine_points(0, 0)
    after = [EnginePoint(3600 + i, "after", used, 1000, used / 999, 0, 0, 0.0, 0.0, 0.0, 2)
             for i, used in enumerate((32.0, 22.0, 27.0))]
    busy = EnginePoint(3604, "after", 5.0, 1000, 0.005, 1, 0, 0.0, 0.0, 0.0, 2)
    assert idle_floor([*points[:-3], *after, busy], "after") == 20.0  # less its floor 2


@pytest.mark.parametrize(("pool", "rise", "state"), [
    (10_000, 10.0, "ok"),  # 0.1 % of the pool: held within the allowance
    (10_000, 10.5, "fail"),
    (1000, 2.0, "ok"),  # a small pool: at least 2 blocks
    (1000, 2.5, "fail"),
])
def test_the_block_allowance_is_the_larger_of_2_blocks_and_0_1_percent(
        pool: int, rise: float, state: str) -> None:
    points = [dataclasses.replace(p, total=pool) for p in engine_points(0, rise)]
    criterion = judge_kv(watch_data(points, "ok"), LeakParams(), SPAN)
    assert criterion.state == state, criterion.reason


def test_a_leak_gives_its_size() -> None:
    kv = judge_kv(sized_leak(), LeakParams(), SPAN)
    size = kv.figures["engines"][0]["leak_size"]
    assert size == {"blocks": 40.0, "tokens": 640.0, "gib": 0.04}
    assert "leaked 40 blocks (640 tokens, 0.04 GiB)" in kv.reason


def test_free_kv_not_judged_says_what_it_needs() -> None:
    data = watch_data(engine_points(0, 300, idle_after=False))
    data.verdicts[("m", "0")].seen(0.0)
    data.verdicts[("m", "0")].seen(120.0)
    kv = judge_kv(data, LeakParams(), SPAN)
    assert kv.state == "not_judged"
    assert kv.figures["needs"] == (
        "needs an idle floor before and after the load, or the leak detector past its "
        "warm-up (needs 8 more minutes of scrapes under load, or one idle period (nothing "
        "running or waiting for 20 s, 3 scrapes))")

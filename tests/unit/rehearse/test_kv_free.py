"""The free-KV criterion on made-up runs whose answer is known: the detector's verdicts,
the idle floor before and after, the block allowance, a leak's size, what it needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvtop.derive.leak_params import LeakParams
from kvtop.derive.verdicts import LeakVerdict
from kvtop.derive.worst import EngineVerdict
from kvtop.rehearse.criteria import Criterion
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


def _run(points: list[EnginePoint], leak: LeakVerdict | None = None, *,
         key: tuple[str | None, str | None] = ("m", "0"), observed: bool = True) -> WatchData:
    """One engine's run: its detector at ``leak`` (none observed: None; no detector at all
    unless ``observed``)."""
    data = WatchData(points={key: points})
    if observed:
        data.verdicts[key] = EngineVerdict(*key)
        if leak is not None:
            data.verdicts[key].observe(100.0, leak)
    return data


def _pool(points: list[EnginePoint], total: int | None) -> list[EnginePoint]:
    return [dataclasses.replace(p, total=total) for p in points]


def _busy_before(points: list[EnginePoint]) -> list[EnginePoint]:
    return [dataclasses.replace(p, running=4) if p.phase == "before" else p for p in points]


def _engine(criterion: Criterion) -> dict[str, Any]:
    assert len(criterion.figures["engines"]) == 1
    return criterion.figures["engines"][0]


OK = LeakVerdict("ok", "made-up ok", None, None, None)
UNKNOWN_SIZE = {"blocks": None, "tokens": None, "gib": None}


def test_a_held_rise_is_falling_with_every_figure_to_a_tenth() -> None:
    points = _pool(engine_points(1.26, 41.34), 12_340)
    data = _run(points, OK)
    kv = judge_kv(data, LeakParams(), SPAN)
    assert (kv.name, kv.title, kv.state) == ("kv_free", "free KV not falling", "fail")
    assert kv.reason == (
        "falling: m 0: leak detector OK (made-up ok); 1 blocks used at idle before the load, "
        "41 after; leaked 40 blocks")
    assert kv.figures == {"engines": [{
        "model": "m", "engine": "0", "blocks_total": 12_340, "idle_used_before": 1.3,
        "idle_used_after": 41.3, "residual_threshold_blocks": 12.3,
        "leak_detector": data.verdicts[("m", "0")].to_json(), "idle_used_rise": 40.1,
        "leak_size": {"blocks": 40.1, "tokens": None, "gib": None}}]}


def test_holding_says_so_and_carries_no_leak_size() -> None:
    data = _run(engine_points(3.0, 4.0), OK)
    kv = judge_kv(data, LeakParams(), SPAN)
    assert (kv.name, kv.title, kv.state) == ("kv_free", "free KV not falling", "ok")
    assert kv.reason == ("holding: m 0: leak detector OK (made-up ok); 3 blocks used at idle "
                         "before the load, 4 after")
    assert _engine(kv) == {
        "model": "m", "engine": "0", "blocks_total": 1000, "idle_used_before": 3.0,
        "idle_used_after": 4.0, "residual_threshold_blocks": 2.0,
        "leak_detector": data.verdicts[("m", "0")].to_json(), "idle_used_rise": 1.0}
    assert "restarted_during_load" not in kv.figures and "needs" not in kv.figures


def test_the_detector_s_leak_fails_with_its_own_size_even_when_the_floor_holds() -> None:
    leak = LeakVerdict("leak", "made-up leak", 12.0, 30.0, 20.0)
    kv = judge_kv(_run(engine_points(0, 1), leak), LeakParams(), SPAN)
    assert (kv.state, kv.reason) == ("fail", (
        "falling: m 0: leak detector LEAK (made-up leak); 0 blocks used at idle before the "
        "load, 1 after; leaked 12 blocks"))
    assert _engine(kv)["leak_size"] == {"blocks": 12.0, "tokens": None, "gib": None}


def test_the_detector_s_watch_is_suspect_with_its_size() -> None:
    watch = LeakVerdict("watch", "made-up watch", 7.0, 30.0, 20.0)
    kv = judge_kv(_run(engine_points(0, 1), watch), LeakParams(), SPAN)
    assert (kv.state, kv.reason) == ("watch", (
        "suspect: m 0: leak detector WATCH (made-up watch); 0 blocks used at idle before the "
        "load, 1 after; leaked 7 blocks"))
    assert _engine(kv)["leak_size"] == {"blocks": 7.0, "tokens": None, "gib": None}


def test_a_watch_without_an_estimate_says_its_size_is_unknown() -> None:
    watch = LeakVerdict("watch", "made-up watch", None, None, None)
    kv = judge_kv(_run(engine_points(0, 1), watch), LeakParams(), SPAN)
    assert kv.state == "watch" and kv.reason.endswith("; leaked size unknown")
    assert _engine(kv)["leak_size"] == UNKNOWN_SIZE


def test_a_rise_within_the_allowance_does_not_size_the_detector_s_leak() -> None:
    leak = LeakVerdict("leak", "made-up leak", 1.0, 30.0, 20.0)
    kv = judge_kv(_run(engine_points(0, 1.5), leak), LeakParams(), SPAN)
    assert _engine(kv)["leak_size"]["blocks"] == 1.0  # not the 1.5 held within 2 blocks


def test_a_held_rise_without_a_detector_is_falling() -> None:
    kv = judge_kv(_run(engine_points(0, 40), observed=False), LeakParams(), SPAN)
    assert (kv.state, kv.reason) == ("fail", (
        "falling: m 0: leak detector UNKNOWN (-); 0 blocks used at idle before the load, 40 "
        "after; leaked 40 blocks"))
    assert _engine(kv)["leak_detector"] is None
    assert _engine(kv)["leak_size"] == {"blocks": 40.0, "tokens": None, "gib": None}


def test_no_floor_and_no_detector_is_not_judged_saying_what_it_needs() -> None:
    params = LeakParams(idle_min_s=30.0)
    kv = judge_kv(_run(engine_points(0, 0, idle_after=False), observed=False), params, SPAN)
    needs = ("needs an idle floor before and after the load, or the leak detector past its "
             "warm-up (needs 10 more minutes of scrapes under load, or one idle period "
             "(nothing running or waiting for 30 s, 3 scrapes))")
    assert (kv.state, kv.figures["needs"]) == ("not_judged", needs)
    assert kv.reason == ("not judged: m 0: leak detector UNKNOWN (-); the server did not go "
                         "idle after the load: no floor to compare; " + needs)


def test_a_warming_detector_says_what_it_needs_under_the_run_s_own_params() -> None:
    data = _run(engine_points(0, 0, idle_after=False))
    data.verdicts[("m", "0")].seen(0.0)
    kv = judge_kv(data, LeakParams(idle_min_s=30.0, trend_min_span_s=300.0), SPAN)
    assert kv.figures["needs"].endswith(
        "(needs 10 more minutes of scrapes under load, or one idle period (nothing running "
        "or waiting for 30 s, 3 scrapes))")


def test_a_detector_past_its_warm_up_judges_without_a_floor() -> None:
    kv = judge_kv(_run(engine_points(0, 0, idle_after=False), OK), LeakParams(), SPAN)
    assert (kv.state, kv.reason) == ("ok", (
        "holding: m 0: leak detector OK (made-up ok); the server did not go idle after the "
        "load: no floor to compare"))
    assert _engine(kv)["idle_used_rise"] is None and "needs" not in kv.figures


@pytest.mark.parametrize(("before", "after", "why"), [
    (True, False, "the server did not go idle after the load: no floor to compare"),
    (False, True, "the server was busy before the load: no floor to compare"),
    (False, False, "the server was never idle before or after the load: no floor to compare"),
])
def test_a_missing_floor_says_which(before: bool, after: bool, why: str) -> None:
    points = engine_points(0, 0, idle_after=after)
    kv = judge_kv(_run(points if before else _busy_before(points), OK), LeakParams(), SPAN)
    assert kv.reason == f"holding: m 0: leak detector OK (made-up ok); {why}"


@pytest.mark.parametrize(("key", "name"), [
    ((None, None), "engine"), (("m", None), "m"), ((None, "1"), "1"), (("m", "1"), "m 1")])
def test_an_engine_is_named_by_its_model_and_engine(
        key: tuple[str | None, str | None], name: str) -> None:
    kv = judge_kv(_run(engine_points(0, 0), OK, key=key), LeakParams(), SPAN)
    assert kv.reason.startswith(f"holding: {name}: leak detector OK")
    assert (_engine(kv)["model"], _engine(kv)["engine"]) == key


def test_an_engine_without_block_usage_is_left_out() -> None:
    blind = [dataclasses.replace(p, used=None) for p in engine_points(0, 40)]
    kv = judge_kv(_run(blind, OK), LeakParams(), SPAN)
    assert (kv.name, kv.title, kv.state, kv.reason, kv.figures) == (
        "kv_free", "free KV not falling", "not_judged",
        "not judged: the server exports no KV block usage", {})
    data = _run(engine_points(0, 0), OK, key=("m", "1"))
    data.points[("m", "0")] = blind
    assert [e["engine"] for e in judge_kv(data, LeakParams(), SPAN).figures["engines"]] == ["1"]


def test_the_worst_engine_decides_whatever_their_order() -> None:
    data = _run(engine_points(0, 0), OK, key=("m", "0"))
    data.points[("m", "1")] = engine_points(0, 40)  # held, no detector: fail
    kv = judge_kv(data, LeakParams(), SPAN)
    assert kv.state == "fail" and kv.reason.startswith("falling: m 1: ")
    assert [e["engine"] for e in kv.figures["engines"]] == ["0", "1"]


def test_without_a_pool_size_the_allowance_is_the_block_minimum_alone() -> None:
    points = _pool(engine_points(0, 0.0005), None)
    kv = judge_kv(_run(points, OK), LeakParams(residual_min_blocks=0.0), SPAN)
    assert (kv.state, _engine(kv)["blocks_total"]) == ("fail", None)
    assert _engine(kv)["residual_threshold_blocks"] == 0.0


@pytest.mark.parametrize(("t", "restarted"), [
    (-0.001, False), (0.0, True), (3600.0, True), (3600.001, False)])
def test_a_restart_is_flagged_only_within_the_load(t: float, restarted: bool) -> None:
    data = _run(engine_points(0, 0), OK)
    data.restarts.append(t)
    figures = judge_kv(data, LeakParams(), SPAN).figures
    assert figures.get("restarted_during_load", False) is restarted

"""The leak indicator in the fleet view, summary, engine panel and detail; alerts told once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict
from kvtop.ui.app import KvtopApp
from kvtop.ui.widgets.engine_panel import kv_points
from kvtop.view import format as fmt
from kvtop.view.fleet import build_rows, leak_cell, leak_changes, order_rows, summarise
from tests.ui.scenario import (
    LEAKING,
    QUIET,
    T0,
    static_app,
    static_trackers,
    table_rows,
    until,
)
from tests.waiting import eventually

NOW = 1000.0
WARMUP = LeakVerdict("warmup", "collecting data", None, None, None)
WATCHING = LeakVerdict("watch", "floor rising", 80.0, 1234.0, 9.0)


def _state(spec: str, verdict: LeakVerdict | None) -> TargetState:
    stats = EngineStats("m", None, NOW, blocks_used=10, blocks_total=100, leak=verdict)
    return TargetState(Target.from_spec(spec), "up", kind="vllm", engines=[stats],
                       last_good_t=NOW)


def test_leak_cell_says_state_and_slope() -> None:
    assert leak_cell(LEAKING).text == "LEAK +4.2k/h"
    assert leak_cell(LEAKING).level == "alarm"
    assert leak_cell(replace(LEAKING, slope_blocks_per_hour=420.0)).text == "LEAK +420/h"
    assert leak_cell(replace(LEAKING, slope_blocks_per_hour=None)).text == "LEAK"
    assert (leak_cell(WATCHING).text, leak_cell(WATCHING).level) == ("WATCH +1.2k/h", "warn")
    assert (leak_cell(QUIET).text, leak_cell(QUIET).level) == ("OK", "ok")
    assert (leak_cell(WARMUP).text, leak_cell(WARMUP).level) == ("…", "dim")
    assert leak_cell(None).text == fmt.DASH  # a server the detector does not judge
    assert len(leak_cell(replace(WATCHING, slope_blocks_per_hour=123_456.0)).text) <= 13


def test_summary_counts_and_sort_puts_leaks_first() -> None:
    states = [_state("a:1", QUIET), _state("b:1", LEAKING), _state("c:1", WATCHING),
              _state("d:1", WARMUP)]
    summary = summarise(states)
    assert (summary.leaks, summary.watches, summary.judged) == (1, 1, 3)
    names = [r.name for r in order_rows(build_rows(states, NOW), "leak")]
    assert names[:2] == ["b:1", "c:1"]


def test_a_state_change_is_told_once() -> None:
    seen: dict[str, str] = {}
    told = []
    for verdict in (WARMUP, QUIET, QUIET, WATCHING, LEAKING, LEAKING, LEAKING, QUIET, QUIET):
        changes, seen = leak_changes([_state("a:1", verdict)], seen)
        told += [c.verdict.state for c in changes]
    assert told == ["watch", "leak", "ok"]  # warmup -> OK is not news


def test_sparkline_points_are_bucketed_and_unknown_is_blank() -> None:
    history = [EngineStats("m", None, t, blocks_used=t - 900) for t in (915.0, 990.0, 999.0)]
    points = kv_points(history, 999.5, span_s=100.0, cells=10)
    assert points[-1] == 94.5  # 990 and 999 share the last 10 s cell
    assert points[1] == 15.0
    assert points[0] is None and points[5] is None  # no data: blank, not zero
    assert fmt.sparkline([0.0, None, 50.0, 100.0], 100.0) == "▁ ▅█"


async def test_fleet_summary_panel_and_single_alert() -> None:
    trackers = static_trackers()
    app = static_app(tracker_factory=lambda t: trackers[t.url])
    async with app.run_test(size=(80, 24)) as pilot:
        assert await until(pilot, lambda: table_rows(app))
        rows = {r["name"]: r for r in table_rows(app)}
        assert rows["llama-70b-a"]["leak"] == "LEAK +4.2k/h"
        assert rows["llama-70b-b"]["leak"] == "OK"
        assert rows["sglang-qwen"]["leak"] == fmt.DASH
        assert "LEAK 1" in str(app.query_one("#summary").render())
        await pilot.press("j", "j")  # llama-70b-a, third by name
        panel = await eventually(lambda: "~2140 blocks leaked" in _panel(app) and _panel(app),
                                 "the selected engine's panel", pause=pilot.pause)
        assert "full in 4.3h" in panel
        for _ in range(3):  # redraws at every poll must not repeat the alert
            app._draw(force=True)
        await pilot.pause()  # every message those draws posted is handled
        alerts = [n for n in app._notifications if n.title == "KV LEAK"]
        assert len(alerts) == 1 and alerts[0].message.startswith("llama-70b-a: idle floor")


async def test_detail_shows_verdict_evidence_and_kv_config() -> None:
    app = static_app()
    async with app.run_test(size=(160, 48)) as pilot:
        assert await until(pilot, lambda: table_rows(app))
        await pilot.press("j", "j", "enter")
        # pushed, composed and shown: a loaded machine takes its time over each
        assert await until(pilot, lambda: "leak    LEAK" in str(
            app.screen.query_one("#detail-info").render()))
        info = str(app.screen.query_one("#detail-info").render())
        assert "leak    LEAK  idle floor rose 2100 blocks" in info
        assert "leaked 2140 blocks  slope +4.2k/h  full in 4.3h" in info
        assert "idle_residual=2140" in info and "consequences=queue growing" in info
        assert ("num_gpu_blocks 20184  block_size 16  kv_cache_size_tokens 322.9k"
                "  enable_prefix_caching True") in info
        assert "cache_dtype auto  gpu_memory_utilization 0.9" in info


def _panel(app: KvtopApp) -> str:
    return str(app.query_one("#engine").render())


@pytest.mark.parametrize(("later", "down", "stale"),
                         [(0, "down 2m", "timeout 12s"), (600, "down 12m", "timeout 10m")])
async def test_ages_count_on_the_app_clock(later: float, down: str, stale: str) -> None:
    # the scene's down host was last read 125 s before its clock, the one timing out 12 s: the
    # ages shown (and the SVG snapshots) follow the configured clock, not the wall clock
    app = static_app(clock=lambda: T0 + 300 + later)
    async with app.run_test(size=(160, 48)) as pilot:
        rows = await eventually(lambda: {r["name"]: r["status"] for r in table_rows(app)},
                                "the rows drawn", pause=pilot.pause)
        assert (rows["10.0.0.6:8000"], rows["sglang-qwen"]) == (down, stale)

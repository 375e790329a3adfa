"""The leak indicator in the fleet view, summary, engine panel and detail; alerts told once."""

from __future__ import annotations

import pytest

from kvtop.ui.app import KvtopApp
from kvtop.view import format as fmt
from tests.scenarios.app import T0, static_app, static_trackers, table_rows, until
from tests.support.waiting import eventually


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

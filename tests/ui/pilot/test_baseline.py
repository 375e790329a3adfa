"""A baseline in the app (`kvtop --baseline NAME`, or `baseline = "NAME"` per target): the
model that compares the last minutes with it, the Δ column, the engine pane's baseline line
and the detail view's levels, on real /metrics bodies of the simulated server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.baseline_eval.scenarios import HEALTHY, scrapes
from kvtop.baseline.overlay import BaselineOverlay
from kvtop.cli import main
from kvtop.collect.target import Target
from kvtop.config import ConfigError, load_config
from kvtop.derive.tracker import TargetTracker
from kvtop.ui.app import AppConfig, KvtopApp
from kvtop.ui.screens.detail import DetailScreen, references
from kvtop.ui.widgets.panes import ChartPane
from tests.fakes.fake_nvml import FakeGpuReader
from tests.fakes.fake_source import FakeSource
from tests.scenarios.app import until
from tests.scenarios.baseline_runs import Recordings, summarise

SMALL_POOL = HEALTHY.but(blocks=300, minutes=12, seed=7)
KEY = ("sim-llama-3-8b", "0")


@pytest.fixture(scope="module")
def overlay(recordings: Recordings) -> BaselineOverlay:
    return BaselineOverlay({}, summarise(recordings.path("healthy"), "healthy"))


def fed(overlay: BaselineOverlay, spec: object) -> BaselineOverlay:
    """The overlay after the run's scrapes went through a tracker, as in the app."""
    target = Target(url="sim://server")
    tracker = TargetTracker(target)
    for scrape in scrapes(spec):  # type: ignore[arg-type]
        state = tracker.update(scrape)
        overlay.observe(target.url, scrape.t, state.engines, tracker.readings)
    return overlay


def test_the_last_minutes_against_the_baseline(overlay: BaselineOverlay) -> None:
    band = overlay.band("sim://server", KEY)
    assert band is not None and band.name == "healthy"
    assert band.kv_p5 is not None and band.kv_p95 is not None
    assert band.kv_p5 < band.kv_p50 < band.kv_p95  # type: ignore[operator]
    assert band.blocks_total == HEALTHY.blocks - 1
    fed(overlay, SMALL_POOL)
    delta = overlay.delta("sim://server", KEY)
    assert delta is not None and delta.kv_p50 is not None and delta.ttft_p99 is not None
    assert delta.kv_points == pytest.approx(delta.kv_p50 - band.kv_p50)
    assert delta.kv_points > 0.1 and delta.kv_worse and not delta.kv_better
    # an engine of a model the baseline does not hold gets nothing to compare with
    assert overlay.band("sim://server", ("another-model", "0")) is None
    assert overlay.delta("sim://server", ("another-model", "0")) is None


def test_the_same_server_stays_within_the_baseline(recordings: Recordings) -> None:
    overlay = BaselineOverlay({}, summarise(recordings.path("healthy"), "healthy"))
    fed(overlay, HEALTHY.but(seed=3))
    delta = overlay.delta("sim://server", KEY)
    assert delta is not None and not (delta.kv_worse or delta.ttft_worse)


def screen_text(app: KvtopApp) -> str:
    """What the terminal shows, as text (the SVG screenshot's characters)."""
    return app.export_screenshot().replace("&#160;", " ")


async def test_the_app_draws_the_baseline(overlay: BaselineOverlay, tmp_path: Path) -> None:
    target = Target(url="sim://server")
    run = list(scrapes(SMALL_POOL))
    app = KvtopApp(AppConfig(
        targets=[target], source_factory=lambda cfg: FakeSource(run),
        gpu_reader=FakeGpuReader([]), clock=lambda: run[-1].t, snapshot_dir=tmp_path,
        baseline=BaselineOverlay({}, overlay.default)))
    async with app.run_test(size=(170, 40)) as pilot:
        assert await until(pilot, lambda: len(app.trackers[target.url].history.get(KEY, ()))
                           == len(run))
        assert await until(pilot, lambda: "delta" in [c.key for c in app.table.columns])
        app._draw(force=True)  # the last scrape's redraw, without waiting for its timer
        assert await until(pilot, lambda: [r.cells["delta"].level for r in app.table.rows]
                           == ["bad"])
        (row,) = app.table.rows
        assert row.cells["delta"].text.startswith("+") and row.cells["delta"].text.endswith("%")
        # the KV pane: the baseline's median as a dim level line, named in its legend
        kv = app.query_one("#pane-kv", ChartPane)
        assert await until(pilot, lambda: "base p50 (healthy)" in screen_text(app))
        assert await until(pilot, lambda: re.search(r"base \d+(\.\d)?%", screen_text(app)))
        assert kv.get_component_rich_style("pane--base").dim
        await pilot.press("enter")
        assert await until(pilot, lambda: isinstance(app.screen, DetailScreen))
        assert await until(pilot, lambda: "base    KV p50" in str(
            app.screen.query_one("#detail-info").render()))
        # the KV plot as drawn: the baseline's levels are in its legend
        assert await until(pilot, lambda: "base p5-95" in str(
            app.screen.query_one("#plot-kv", ChartPane).border_title))
        assert "base p50 (healthy)" in str(app.screen.query_one("#plot-kv").border_title)
    band = overlay.band(target.url, KEY)
    kv_levels = references("kv", band)
    assert [r.label for r in kv_levels] == ["base p5-95", ""]  # beyond the KV pane's p50
    assert references("kv", None) == ()


def test_app_without_a_baseline_has_no_delta_column() -> None:
    from kvtop.view.cells import visible_columns

    assert "delta" not in [c.key for c in visible_columns(200)]
    assert "delta" in [c.key for c in visible_columns(200, delta=True)]
    # at 80 columns the baseline column gives way to the columns that matter more
    assert "delta" not in [c.key for c in visible_columns(80, delta=True)]


def test_a_baseline_per_target_in_the_config(tmp_path: Path) -> None:
    config = tmp_path / "kvtop.toml"
    config.write_text('[[targets]]\nurl = "gpu-1:8000"\nbaseline = "prod-0.33"\n'
                      '[[targets]]\nurl = "gpu-2:8000"\n')
    assert load_config(config).baselines == {"http://gpu-1:8000/metrics": "prod-0.33"}
    config.write_text('[[targets]]\nurl = "gpu-1:8000"\nbaseline = 3\n')
    with pytest.raises(ConfigError, match="baseline must be"):
        load_config(config)


def test_an_unknown_baseline_stops_the_app_before_it_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert main(["127.0.0.1:9", "--baseline", "nope", "--no-gpu"]) == 2
    assert "no baseline 'nope'" in capsys.readouterr().err
    cut = tmp_path / "cut.json"
    cut.write_text('{"format": "kvtop-baseline", "version": 1, "targ')
    assert main(["replay", str(cut), "--baseline", str(cut)]) == 2
    assert "cut off" in capsys.readouterr().err

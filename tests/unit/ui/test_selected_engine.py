"""The selected engine: the view of the row the cursor is on (a group's worst member, a
search that leaves no row), handed to the charts or to the small terminal's panel with its
GPUs' memory and its baseline; the detail screen follows the same engine, a server down long
enough to lose its engines keeps its history."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvtop.baseline.model import Baseline, EngineSummary, Figure, TargetSummary
from kvtop.baseline.overlay import BaselineOverlay
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker
from kvtop.ui.fleet_trackers import FleetTrackers
from kvtop.ui.gpu_watch import GpuWatch
from kvtop.ui.selected_engine import SelectedEngine
from kvtop.ui.widgets.engine_panel import EnginePanel
from kvtop.ui.widgets.panes import EnginePanes
from kvtop.view.engine import EngineView, engine_view, group_view, no_match_view
from kvtop.view.fleet import FleetRow, build_rows
from kvtop.view.groups import make_group
from tests.scenarios.app import HOST_A, HOST_B, T0, UNDER_LOAD
from tests.support.paths import fixture_text

SPAN_S = 120.0
GIB = 1 << 30
HOST_C = Target.from_spec("10.0.0.7:8000")  # never answers


class Panes(EnginePanes):
    """Keeps the views it is handed (the charts draw them: their own tests)."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: list[EngineView] = []

    def show(self, view: EngineView) -> None:
        self.shown.append(view)


class Panel(EnginePanel):
    """Keeps what it is handed (test_engine_panel.py draws it)."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: list[tuple[EngineView, dict[str, Any]]] = []

    def show(self, view: EngineView, **kwargs: Any) -> None:
        self.shown.append((view, kwargs))


def _fleet() -> FleetTrackers[TargetTracker]:
    """HOST_A answered three times; HOST_B answered once, then refused."""
    fleet = FleetTrackers(TargetTracker, [HOST_A, HOST_B], None)
    body = fixture_text(UNDER_LOAD)
    for i in range(3):
        fleet.fold(read_scrape(Scrape(HOST_A, T0 + 10 * i, body)))
    fleet.fold(read_scrape(Scrape(HOST_B, T0, body)))
    fleet.fold(Scrape(HOST_B, T0 + 20, failure="down", error="refused"))
    return fleet


def _selected(fleet: FleetTrackers[TargetTracker], *, charts: bool = True,
              views: bool = False, overlay: BaselineOverlay | None = None,
              ) -> tuple[SelectedEngine, Panes, Panel]:
    gpus = GpuWatch(None, None, history_s=SPAN_S, clock=lambda: T0,  # type: ignore[arg-type]
                    states=lambda: [], period_s=lambda: 2.0, on_screen=lambda: False,
                    on_refresh=lambda _: None)
    gpus.owned = {HOST_A.url: (70 * GIB, 80 * GIB)}
    gpus.history.record(T0 + 20, gpus.owned)
    gpus.views = [object()] if views else []  # type: ignore[list-item]
    selected = SelectedEngine(lambda: fleet.by_url, gpus, overlay, clock=lambda: T0 + 20,
                              span_s=SPAN_S, charts=charts, interval_s=lambda: 10.0)
    panes, panel = Panes(), Panel()
    selected.attach(panes, panel)
    return selected, panes, panel


def _rows(fleet: FleetTrackers[TargetTracker]) -> list[FleetRow]:
    return build_rows([t.state for t in fleet.by_url.values()], T0 + 20)


def _view_of(fleet: FleetTrackers[TargetTracker], row: FleetRow, *, with_gpu: bool) -> EngineView:
    tracker = fleet.by_url[row.url]
    history = list(tracker.history[row.engine]) if row.engine else []
    return engine_view(row, tracker.state, history, T0 + 20, SPAN_S,
                       gpu=(70 * GIB, 80 * GIB) if row.url == HOST_A.url else None,
                       with_gpu=with_gpu, interval_s=10.0)


def test_the_charts_get_the_row_s_engine_with_its_history_and_gpus() -> None:
    fleet = _fleet()
    selected, panes, panel = _selected(fleet, views=True)
    row = _rows(fleet)[0]
    selected.show(row, T0 + 20, charts=True)
    assert panes.shown == [_view_of(fleet, row, with_gpu=True)] and panel.shown == []
    chart = panes.shown[0].panes[0].chart
    assert chart is not None and len(chart.series[0].points) == 3  # its three scrapes


def test_without_a_gpu_view_no_gpu_line_and_the_panel_gets_the_memory_series() -> None:
    fleet = _fleet()
    selected, panes, panel = _selected(fleet, charts=False)
    row = _rows(fleet)[0]
    selected.show(row, T0 + 20, charts=False)
    [(view, drawn)] = panel.shown
    assert panes.shown == [] and view == _view_of(fleet, row, with_gpu=False)
    assert {**drawn, "gpu_series": list(drawn["gpu_series"])} == {
        "gpu_series": [(T0 + 20, 70 * GIB, 80 * GIB)], "gpu_owned": (70 * GIB, 80 * GIB),
        "now": T0 + 20, "span_s": SPAN_S, "charts": False}


def test_a_group_shows_its_worst_member_said_so() -> None:
    fleet = _fleet()
    selected, panes, _ = _selected(fleet)
    up, down = _rows(fleet)
    assert (down.sort_value("worst") or 0) > (up.sort_value("worst") or 0)
    for members in ([up, down], [down, up]):
        group = make_group("model", "m", members, collapsed=False)
        selected.show(group, T0 + 20, charts=True)
        assert panes.shown[-1] == group_view(group, _view_of(fleet, down, with_gpu=False))


def test_no_row_says_no_engine_or_that_the_search_matched_nothing() -> None:
    selected, panes, _ = _selected(_fleet())
    selected.show(None, T0 + 20, charts=True)
    selected.show(None, T0 + 20, charts=True, search="[b]x")
    assert panes.shown == [EngineView("no engine selected"), no_match_view("[b]x")]


def _overlay(url: str) -> BaselineOverlay:
    """A baseline for ``url``'s engine alone (no default: another URL has none)."""
    engine = EngineSummary("twin-llama", "0", config={}, figures={"kv_usage": Figure(0.5)})
    return BaselineOverlay({url: Baseline("base", "2026-12-01T00:00:00+00:00", "0",
                                          {"kind": "live"}, 10.0, 600.0, 60.0,
                                          targets=[TargetSummary(url, engines=[engine])])})


def test_the_band_is_the_overlay_s_for_the_row_s_engine_and_none_without_either() -> None:
    fleet = _fleet()
    row = _rows(fleet)[0]
    assert row.engine is not None
    assert _selected(fleet)[0].band(row.url, row.engine) is None  # no --baseline
    overlay = _overlay(row.url)
    selected, panes, _ = _selected(fleet, overlay=overlay)
    band = overlay.band(row.url, ("twin-llama", "0"))
    assert band is not None and selected.band(row.url, row.engine) is band
    assert selected.band(row.url, None) is None
    selected.show(row, T0 + 20, charts=True)
    tracker = fleet.by_url[row.url]
    assert panes.shown == [engine_view(row, tracker.state, list(tracker.history[row.engine]),
                                       T0 + 20, SPAN_S, gpu=(70 * GIB, 80 * GIB),
                                       band=band, interval_s=10.0)]


def test_a_server_that_never_answered_says_how_often_it_is_tried() -> None:
    fleet = FleetTrackers(TargetTracker, [HOST_A], None)
    fleet.fold(Scrape(HOST_A, T0, failure="down", error="refused"))
    selected, panes, _ = _selected(fleet)
    [row] = _rows(fleet)
    selected.show(row, T0 + 20, charts=True)
    assert panes.shown == [engine_view(row, fleet.by_url[HOST_A.url].state, [], T0 + 20,
                                       SPAN_S, interval_s=10.0)]
    assert "trying every 10s" in str(panes.shown[0].lines)


def test_a_group_with_a_member_not_yet_answered_shows_one_that_has() -> None:
    fleet = _fleet()
    pending = FleetTrackers(TargetTracker, [HOST_C], None)
    fleet.by_url.update(pending.by_url)
    selected, panes, _ = _selected(fleet)
    up, _, waiting = _rows(fleet)
    assert waiting.sort_value("worst") is None
    selected.show(make_group("model", "m", [waiting, up], collapsed=False), T0 + 20,
                  charts=True)
    assert panes.shown[0].lines[0][3] == (_view_of(fleet, up, with_gpu=False).title, "")


def test_a_row_whose_tracker_is_gone_has_no_history() -> None:
    fleet = _fleet()
    selected, _, _ = _selected(fleet)
    assert selected._history(replace(_rows(fleet)[0], url="http://gone:1/metrics")) == []


def _three_engines() -> FleetTrackers[TargetTracker]:
    """HOST_A's engine 0, then 1, then 2 alone: its history holds the three, in that order."""
    fleet = FleetTrackers(TargetTracker, [HOST_A], None)
    body = fixture_text(UNDER_LOAD)
    for i in range(3):
        fleet.fold(read_scrape(Scrape(HOST_A, T0 + 10 * i,
                                      body.replace('engine="0"', f'engine="{i}"'))))
    return fleet


def test_the_detail_screen_follows_the_row_s_engine_else_the_server_s_first() -> None:
    fleet = _three_engines()
    overlay = _overlay(HOST_A.url)
    selected, _, _ = _selected(fleet, overlay=overlay)
    [row] = _rows(fleet)
    tracker = fleet.by_url[HOST_A.url]
    assert list(tracker.history) == [("twin-llama", str(i)) for i in range(3)]
    assert [(s.model, s.engine) for s in tracker.state.engines] == [("twin-llama", "2")]
    history = {key: list(stats) for key, stats in tracker.history.items()}
    first, picked, latest = (("twin-llama", str(i)) for i in range(3))
    chosen = replace(row, engine=picked)  # chosen while the server still had it
    screen = selected.detail_screen(chosen)
    assert screen._source() == (tracker.state, history[picked], picked)
    assert (screen._clock(), screen._span_s, screen._charts) == (T0 + 20, SPAN_S, True)
    band = overlay.band(HOST_A.url, picked)
    assert band is not None and screen._band is not None and screen._band() is band
    assert selected._history(chosen) == history[picked]
    unknown = replace(row, engine=None)  # chosen while its engines were not yet known
    assert selected.detail_screen(unknown)._source() == (tracker.state, history[latest],
                                                          latest)
    assert selected._history(unknown) == history[first]  # the table: the first it knows
    missing = replace(row, engine=("twin-llama", "9"))
    assert selected.detail_screen(missing)._source() == (tracker.state, [], missing.engine)
    assert selected._history(missing) == []
    tracker.state.engines = []  # down long enough to lose its engines: its history stays
    assert selected.detail_screen(unknown)._source() == (tracker.state, history[first], first)
    tracker.history.clear()
    assert selected.detail_screen(unknown)._source() == (tracker.state, [], None)
    assert selected._history(unknown) == []
    assert selected._history(None) == []

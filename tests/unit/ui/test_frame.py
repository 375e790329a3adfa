"""One frame painted in a small app (Pilot) from real trackers fed real scrapes: the rows the
view asks for, the GPU column once a server owns a GPU, the header's sums over the whole
fleet while a search narrows the rows, and the GPU pane while some GPU is known and wanted."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.containers import Vertical

import kvtop.ui
from kvtop.baseline.model import Baseline, EngineSummary, Figure, TargetSummary
from kvtop.baseline.overlay import BaselineOverlay
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetState, TargetTracker
from kvtop.ui.fleet_trackers import FleetTrackers
from kvtop.ui.frame import FramePainter
from kvtop.ui.gpu_watch import GpuWatch
from kvtop.ui.selected_engine import SelectedEngine
from kvtop.ui.widgets.cache_pane import CachePane
from kvtop.ui.widgets.engine_panel import EnginePanel
from kvtop.ui.widgets.fleet_table import FleetTable
from kvtop.ui.widgets.gpu_pane import GpuPane
from kvtop.ui.widgets.panes import EnginePanes
from kvtop.ui.widgets.summary import SummaryBar
from kvtop.view.view_state import ViewState
from tests.fakes.fake_nvml import FakeGpuReader, sample_gpus
from tests.scenarios.app import HOST_A, LIVE_TARGETS, T0, UNDER_LOAD, live_scrapes
from tests.support.paths import fixture_text

STYLESHEET = Path(kvtop.ui.__file__).parent / "kvtop.tcss"
NOW = T0 + 2


class FrameApp(App[None]):
    CSS_PATH = STYLESHEET

    def __init__(self, overlay: BaselineOverlay | None = None) -> None:
        super().__init__()
        self.fleet = FleetTrackers(TargetTracker, LIVE_TARGETS, overlay)
        for scrape in live_scrapes():
            self.fleet.fold(read_scrape(scrape))
        self.view = ViewState()
        self.exporters: list[TargetState] = []  # GPU exporters, beside the servers
        self.gpu_watch = GpuWatch(self, FakeGpuReader(), history_s=300.0, clock=lambda: NOW,
                              states=lambda: self.fleet.states() + self.exporters,
                              period_s=lambda: 2.0,
                              on_screen=lambda: True, on_refresh=lambda redraw: None)
        self.selected = SelectedEngine(lambda: self.fleet.by_url, self.gpu_watch, overlay,
                                       clock=lambda: NOW, span_s=300.0, charts=True,
                                       interval_s=lambda: 2.0)
        self.frame = FramePainter(self.view, self.gpu_watch, self.selected, overlay)

    def compose(self) -> ComposeResult:
        yield SummaryBar(id="summary")
        with Vertical(id="body"):
            yield FleetTable(id="fleet")
            yield EnginePanel(id="engine")
            yield EnginePanes(CachePane(id="cache"), GpuPane(id="gpu"), id="panes")

    def on_mount(self) -> None:
        self.selected.attach(self.query_one(EnginePanes), self.query_one(EnginePanel))
        self.frame.attach(self.query_one(FleetTable), self.query_one(SummaryBar),
                          self.query_one(GpuPane))

    def paint(self) -> None:
        self.frame.paint(self.fleet.states(), NOW, charts=True, interval_s=2.0, recording=None)
        self.frame.show_gpu_pane(NOW)

    def rows(self) -> list[dict[str, str]]:
        table = self.query_one(FleetTable)
        return [{c.key: row.cells[c.key].text for c in table.columns} for row in table.rows]

    def header(self) -> str:
        return str(self.query_one(SummaryBar).render())


NAMES = ["10.0.0.5:8000", "10.0.0.5:8001", "gateway"]
FLEET = "1416/1599 blocks 89%  hosts 2/3 up  LEAK 0 WATCH 0 STALL 0"


async def test_without_gpus_every_row_no_gpu_column_and_no_pane() -> None:
    app = FrameApp()
    async with app.run_test(size=(160, 40)) as pilot:
        app.paint()
        await pilot.pause()
        rows = app.rows()
        assert [row["name"] for row in rows] == NAMES
        assert [row["kv"] for row in rows] == ["████▉ 588/599", "████▏ 828/1000",
                                               "not LLM server?"]
        assert "gpu" not in rows[0] and "delta" not in rows[0]
        assert FLEET in app.header()
        assert app.header().split("\n")[1] == (
            "run 30  wait 149  held by KV 1  hit –  tok/s – in – out  every 2s  sort name ▲")
        assert not app.query_one(GpuPane).display


GPU_PANE = (
    "GPU0 NVIDIA H100 80GB HBM3\n mem ███████▍ 74.0/80.0 GiB\n                         ▇ 5m\n"
    " util 91%  63°C  512W\n    4242  73.0G 10.0.0.5:8000 vLLM python3 -m "
    "vllm.entrypoints.openai.api_server\n    5151      – python3 train.py\n\n"
    "GPU1 NVIDIA H100 80GB HBM3\n mem ░░░░░░░░ 0.0/80.0 GiB\n                         ▁ 5m\n"
    " util 0%  31°C  –\n no processes")


async def test_a_gpu_owned_by_a_server_is_its_column_and_the_pane_while_wanted() -> None:
    app = FrameApp()
    async with app.run_test(size=(160, 40)) as pilot:
        app.gpu_watch.read_done(sample_gpus(), {4242: HOST_A.url})
        app.paint()
        await pilot.pause()
        assert [row.get("gpu") for row in app.rows()] == ["74/80G", "–", "–"]
        pane = app.query_one(GpuPane)
        assert pane.display
        assert str(pane.render()) == GPU_PANE
        app.view.gpu_wanted = False  # `g`
        app.paint()
        assert not pane.display
        app.view.gpu_wanted = True
        app.gpu_watch.read_done(sample_gpus(), {})  # its process gone: nobody owns a GPU
        app.paint()
        await pilot.pause()
        assert [row.get("gpu") for row in app.rows()] == [None, None, None]
        assert pane.display  # the GPUs are still known


async def test_a_search_narrows_the_rows_never_the_header_s_sums() -> None:
    app = FrameApp()
    async with app.run_test(size=(160, 40)) as pilot:
        app.view.filter_text = "8001"
        app.paint()
        await pilot.pause()
        assert [row["name"] for row in app.rows()] == ["10.0.0.5:8001"]
        assert FLEET in app.header()
        assert app.header().split("\n")[1] == (
            "run 30  wait 149  held by KV 1  hit –  tok/s – in – out  every 2s  sort name ▲  "
            "filter '8001' 1 of 3 shown")
        assert app.frame.rows(app.fleet.states(), NOW)[2].url == LIVE_TARGETS[2].url


def baseline() -> BaselineOverlay:
    """The first server's engine at 40 % of its pool (p50) before: it is at 98 % now."""
    figures = {"kv_usage": Figure(0.40, (), {"p5": 0.1, "p95": 0.8}), "ttft_p99": Figure(0.5)}
    engine = EngineSummary("twin-llama", "0", config={"blocks_total": 599}, figures=figures)
    base = Baseline("base", "2026-12-01T00:00:00+00:00", "0", {"kind": "live"}, 10.0, 600.0,
                    60.0, targets=[TargetSummary(HOST_A.url, engines=[engine])])
    return BaselineOverlay({HOST_A.url: base})


async def test_a_baseline_is_the_delta_column_for_each_engine_s_row() -> None:
    app = FrameApp(baseline())
    async with app.run_test(size=(160, 40)) as pilot:
        app.paint()
        await pilot.pause()
        # +58 points of the pool against the baseline; none for a server it does not know
        assert [row.get("delta") for row in app.rows()] == ["+58pt –", "–", "–"]


def panel(app: FrameApp) -> str:
    return str(app.query_one(EnginePanel).render())


async def test_the_header_and_the_sort_marker_say_what_the_view_and_the_app_hold() -> None:
    app = FrameApp()
    async with app.run_test(size=(160, 40)) as pilot:
        table = app.query_one(FleetTable)
        app.paint()
        await pilot.pause()
        assert table.render_line(0).text.startswith(" NAME▲  ")
        assert panel(app) == ""  # charts: the panes draw the engine, not the small panel
        app.view.paused = True
        app.view.sort_by("kv", True)
        app.gpu_watch.read_failed("NVML Shared Library Not Found")
        app.frame.paint(app.fleet.states(), NOW, charts=False, interval_s=2.0,
                        recording="REC 1 KiB")
        await pilot.pause()
        assert app.header().split("\n")[1] == (
            "run 30  wait 149  held by KV 1  hit –  tok/s – in – out  every 2s  "
            "sort KV use ▲  PAUSED  REC REC 1 KiB  GPU NVML: NVML Shared Library Not Found")
        assert " NAME  " in table.render_line(0).text
        assert " KV BLOCKS▲  " in table.render_line(0).text
        assert panel(app).split("\n")[:2] == [
            "leak WARMUP  collecting data", "KV" + " " * 131 + "█  █████████▉ 588/599 98%"]


async def test_a_search_that_leaves_no_row_says_so_in_the_grouped_view() -> None:
    app = FrameApp()
    async with app.run_test(size=(160, 40)) as pilot:
        app.view.next_group_mode(app.frame.rows(app.fleet.states(), NOW))
        app.view.filter_text = "nothing matches"
        app.frame.paint(app.fleet.states(), NOW, charts=False, interval_s=2.0, recording=None)
        await pilot.pause()
        assert app.header().split("\n")[1] == (
            "run 30  wait 149  held by KV 1  hit –  tok/s – in – out  every 2s  sort name ▲  "
            "groups group  filter 'nothing matches' 0 of 3 shown")
        assert panel(app) == ("no row matches 'nothing matches': the header still counts the "
                              "whole fleet; escape clears the search")


def test_nothing_is_painted_before_the_widgets_are_attached() -> None:
    app = FrameApp()
    with pytest.raises(AssertionError):
        app.paint()
    with pytest.raises(AssertionError):
        app.frame.show_gpu_pane(NOW)



async def test_a_failing_exporter_is_in_the_pane_and_a_hidden_pane_is_left_alone() -> None:
    app = FrameApp()
    async with app.run_test(size=(160, 40)) as pilot:
        app.gpu_watch.read_done(sample_gpus(), {4242: HOST_A.url})
        app.paint()
        await pilot.pause()
        pane = app.query_one(GpuPane)
        app.view.gpu_wanted = False
        exporter = Target.from_spec("10.0.0.7:9400")
        app.exporters = [TargetState(exporter, "down", kind="dcgm", error="connection refused")]
        app.gpu_watch.refresh()
        app.paint()
        await pilot.pause()
        assert str(pane.render()) == GPU_PANE  # hidden: not redrawn
        app.view.gpu_wanted = True
        app.paint()
        await pilot.pause()
        assert str(pane.render()) == "dcgm-exporter 10.0.0.7: connection refused\n\n" + GPU_PANE


async def test_a_server_gone_down_says_how_long_ago_it_answered_at_the_frame_s_time() -> None:
    app = FrameApp()
    late = Target.from_spec("10.0.0.9:8000")
    app.fleet.fold(read_scrape(Scrape(late, T0 - 10, fixture_text(UNDER_LOAD))))
    app.fleet.fold(Scrape(late, T0, failure="down", error="connection refused",
                          connected=False))
    async with app.run_test(size=(160, 40)) as pilot:
        app.paint()
        await pilot.pause()
        assert {row["name"]: row["status"] for row in app.rows()}["10.0.0.9:8000"] == (
            "down 12s")  # answered at T0 - 10, the frame at T0 + 2

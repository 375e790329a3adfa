"""The app itself: its pure rules (the layout classes at the terminal sizes where they change,
the `+`/`-` steps through the poll intervals), then the real KvtopApp run headless (Pilot)
over real trackers fed real /metrics bodies by a hand-driven source, asserting what the app
decides: its widgets, when a frame is drawn (a host's first scrape at once, later ones at the
period, nothing paused but what a key asks), what each key does to the view, which screen
opens, the messages it says, the recording and the GPU reads it starts, and how it ends.

Most tests poll every minute, so no redraw tick comes during a test: each frame seen is one
the app drew on purpose. (Its parts are tested on their own files; tests/ui/pilot drives it
end to end.)"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from textual.app import App
from textual.containers import Vertical
from textual.pilot import Pilot
from textual.widgets import Footer, Input, OptionList

from kvtop.baseline.overlay import BaselineOverlay
from kvtop.collect.adapters import WANTED
from kvtop.collect.exposition import Exposition, parse
from kvtop.collect.gpu import GpuProcess, GpuReading
from kvtop.collect.kv_events import BlockStored, KvEventBatch
from kvtop.collect.nvml import NvmlReader
from kvtop.collect.poller import Poller
from kvtop.collect.prometheus import group_scrapes
from kvtop.collect.source import ScrapeReader
from kvtop.collect.target import Scrape, Target
from kvtop.config import AlertSettings
from kvtop.exits import EXIT_INTERNAL, EXIT_OK, EXIT_USAGE
from kvtop.store.recording import read_recording
from kvtop.ui.app import (
    COLLECT_STOPPED_S,
    INTERVALS,
    TERMINAL_GONE_GRACE_S,
    AppConfig,
    KvtopApp,
    _poller,
    app_exit_code,
    layout_classes,
    next_interval,
    run_app,
)
from kvtop.ui.gpu_watch import GPU_MIN_PERIOD_S
from kvtop.ui.screens.detail import DetailScreen
from kvtop.ui.screens.help import KEYS, HelpScreen, help_text
from kvtop.ui.screens.sort_menu import SortMenu
from kvtop.ui.widgets.cache_pane import CachePane
from kvtop.ui.widgets.engine_panel import EnginePanel
from kvtop.ui.widgets.fleet_table import FleetTable
from kvtop.ui.widgets.gpu_pane import GpuPane
from kvtop.ui.widgets.message_line import MessageLine
from kvtop.ui.widgets.panes import EnginePanes
from kvtop.ui.widgets.summary import SummaryBar
from tests.fakes.fake_kv_feed import FakeKvFeed
from tests.fakes.fake_nvml import GIB, FakeGpuReader, sample_gpus
from tests.fakes.fake_source import FakeSource
from tests.scenarios.alerts import copy_stdin_to, leaking_state
from tests.scenarios.app import (
    HOST_A,
    HOST_B,
    LEAKING,
    LEAKING_IDLE,
    LIVE_TARGETS,
    QUIET,
    T0,
    UNDER_LOAD,
    StaticTracker,
    live_app,
    live_data_shown,
    live_scrapes,
    table_rows,
    until,
)
from tests.scenarios.gpu import DCGM_MIG, gpu_fixture
from tests.support.paths import fixture_text
from tests.unit.ui.test_frame import baseline


@pytest.mark.parametrize(("size", "low_bandwidth", "shown"), [
    ((100, 30), False, {"-charts", "compact"}),  # the smallest terminal with charts
    ((99, 30), False, {"-sparks", "compact"}),
    ((100, 29), False, {"-sparks", "compact"}),
    ((200, 60), True, {"-sparks"}),  # --low-bandwidth: never charts
    ((119, 44), False, {"-charts", "compact"}),
    ((120, 44), False, {"-charts"}),
    ((119, 45), False, {"-charts", "compact", "-grid2"}),  # narrow and tall: two by two
    ((120, 45), False, {"-charts"}),
])
def test_the_layout_classes_change_exactly_at_their_sizes(size: tuple[int, int],
                                                          low_bandwidth: bool,
                                                          shown: set[str]) -> None:
    classes = layout_classes(*size, low_bandwidth=low_bandwidth)
    assert {name for name, on in classes.items() if on} == shown
    assert set(classes) == {"compact", "-sparks", "-charts", "-grid2"}  # each set or unset


@pytest.mark.parametrize(("interval_s", "step", "new"), [
    (1.0, 1, 2.0), (1.0, -1, 0.5), (0.25, -1, 0.25), (60.0, 1, 60.0),
    (1.4, 1, 2.0), (1.6, 1, 5.0), (7.0, -1, 2.0),  # from the nearest of the list
])
def test_plus_and_minus_step_through_the_intervals_and_stop_at_the_ends(
        interval_s: float, step: int, new: float) -> None:
    assert next_interval(interval_s, step) == new
    assert new in INTERVALS


# -- the app, run headless ------------------------------------------------------------------

SIZE = (100, 30)  # the smallest terminal with charts (compact: the detail's plots one a row)
SMALL = (80, 24)  # sparklines under the table
WIDE = (160, 40)  # every column
MINUTE = 60.0  # the poll interval: no redraw tick comes during a test
NAMES = ["10.0.0.5:8000", "10.0.0.5:8001", "gateway"]
PENDING = {"name": "…", "status": "…"}


# Far beyond a frame's time on a loaded machine, and well under MINUTE: what is drawn only at
# the minute's tick is not drawn at once
WAIT_S = 15.0


async def soon(pilot: Pilot, ready: Callable[[], object], timeout_s: float = WAIT_S) -> bool:
    """Whether ``ready()`` turns true within ``timeout_s`` (WAIT_S)."""
    return await until(pilot, ready, timeout_s)


def quiet_app(tmp_path: Path, **config: object) -> tuple[KvtopApp, FakeSource]:
    """The live scene (two vLLM hosts and a gateway, real bodies) polled every minute,
    without a GPU unless asked."""
    return live_app(tmp_path, **({"interval_s": MINUTE, "no_gpu": True} | config))


def header(app: KvtopApp) -> str:
    return str(app.summary.render())


def names(app: KvtopApp) -> list[str]:
    return [row["name"] for row in table_rows(app)]


def kv_of(app: KvtopApp, name: str) -> str:
    return next(row["kv"] for row in table_rows(app) if row["name"] == name)


def messages(app: KvtopApp) -> list[tuple[str, float, bool]]:
    """Each message said, with its timeout and whether it was read as markup."""
    return [(n.message, n.timeout, n.markup) for n in app._notifications]


async def folded(pilot: Pilot, app: KvtopApp, url: str, t: float) -> None:
    """The tracker of ``url`` has folded the scrape taken at ``t``."""
    assert await soon(pilot, lambda: app.trackers[url].state.last_attempt_t == t)


async def test_the_screen_is_composed_and_drawn_before_any_scrape(tmp_path: Path) -> None:
    app, _ = quiet_app(tmp_path, source_factory=lambda cfg: FakeSource())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert [(type(w), w.id) for w in app.screen.children] == [
            (SummaryBar, "summary"), (Vertical, "body"), (Input, "filter"), (Footer, None),
            (MessageLine, "message")]
        assert [(type(w), w.id) for w in app.query_one("#body").children] == [
            (FleetTable, "fleet"), (EnginePanel, "engine"), (EnginePanes, "panes")]
        assert [(type(w), w.id) for w in app.panes.query("#cache, #gpu")] == [
            (CachePane, "cache"), (GpuPane, "gpu")]
        assert (app.table, app.summary, app.gpu_pane, app.engine_panel, app.filter_box) == (
            app.query_one("#fleet"), app.query_one("#summary"), app.query_one("#gpu"),
            app.query_one("#engine"), app.query_one("#filter"))
        assert app.filter_box.placeholder == "search: words that every row shown must contain"
        assert not app.filter_box.display and not app.gpu_pane.display
        assert app.focused is app.table
        # the first frame: every host, none heard from yet, at the configured interval
        assert names(app) == NAMES
        assert [row["status"] for row in table_rows(app)] == ["…", "…", "…"]
        assert header(app) == (
            "KV [·····················································] –  hosts 0/3 up  "
            "LEAK 0 WATCH 0 STALL 0\nrun 0  wait 0  hit –  tok/s – in – out  every 60s  "
            "sort name ▲")
        assert {"-charts", "compact"} <= app.classes and not app.has_class("-sparks", "-grid2")
        assert app.charts_shown
        assert app.return_code is None


async def test_a_server_that_never_answered_says_how_often_it_is_tried(tmp_path: Path) -> None:
    source = FakeSource([Scrape(HOST_A, T0, failure="down", error="connection refused")])
    app, _ = quiet_app(tmp_path, source_factory=lambda cfg: source)
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: "nothing answers at http://10.0.0.5:8000/metrics, "
                          "trying every 1m" in str(app.panes.head.render()))


async def test_a_host_s_first_scrape_is_drawn_at_once_a_later_one_at_the_period(
        tmp_path: Path) -> None:
    app, source = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        assert kv_of(app, "10.0.0.5:8000") == "████▉ 588/599"
        source.push(Scrape(HOST_A, T0 + 1, fixture_text(LEAKING_IDLE)))
        await folded(pilot, app, HOST_A.url, T0 + 1)
        await pilot.pause(0.2)
        assert kv_of(app, "10.0.0.5:8000") == "████▉ 588/599"  # drawn within the minute
        late = Target.from_spec("10.0.0.9:8000")  # a new host: its first scrape at once
        source.push(Scrape(late, T0 + 1, fixture_text(LEAKING_IDLE)))
        assert await soon(pilot, lambda: "10.0.0.9:8000" in names(app))
        assert kv_of(app, "10.0.0.5:8000") == "████▏ 828/1000"  # that frame shows all


async def test_paused_nothing_is_drawn_until_resumed_and_collection_goes_on(
        tmp_path: Path) -> None:
    app, source = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        await pilot.press("p")
        assert app.view.paused and "PAUSED" in header(app)
        late = Target.from_spec("10.0.0.9:8000")
        source.push(Scrape(HOST_A, T0 + 1, fixture_text(LEAKING_IDLE)),
                    Scrape(late, T0 + 1, fixture_text(UNDER_LOAD)))
        await folded(pilot, app, late.url, T0 + 1)
        app.draw_clock.request()  # the period's frame
        await pilot.pause(0.2)
        assert names(app) == NAMES and kv_of(app, "10.0.0.5:8000") == "████▉ 588/599"
        await pilot.press("p")  # resumed: caught up at once
        assert not app.view.paused and "PAUSED" not in header(app)
        assert names(app) == [*NAMES[:2], "10.0.0.9:8000", "gateway"]
        assert kv_of(app, "10.0.0.5:8000") == "████▏ 828/1000"


async def test_paused_the_period_s_frames_draw_nothing(tmp_path: Path) -> None:
    app, source = quiet_app(tmp_path, interval_s=0.25)  # a frame due every quarter second
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        await pilot.press("p")
        source.push(Scrape(HOST_A, T0 + 1, fixture_text(LEAKING_IDLE)))
        await folded(pilot, app, HOST_A.url, T0 + 1)
        await pilot.pause(0.6)  # two frames due, and the scrape's
        assert kv_of(app, "10.0.0.5:8000") == "████▉ 588/599"
        await pilot.press("p")
        assert kv_of(app, "10.0.0.5:8000") == "████▏ 828/1000"


async def test_a_key_redraws_a_paused_frame_with_what_it_changed(tmp_path: Path) -> None:
    app, _ = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        await pilot.press("p")
        await pilot.press("o")  # the next sort: KV use, fullest first
        assert "sort KV use ▼" in header(app) and "PAUSED" in header(app)
        assert names(app) == NAMES
        await pilot.press("o")  # by queue
        assert "sort queue ▼" in header(app)
        await pilot.press("plus")
        assert "every 60s" in header(app)  # 60 s is the longest
        await pilot.press("minus")
        assert "every 30s" in header(app)
        await pilot.press("slash", *"8001")
        assert names(app) == ["10.0.0.5:8001"]
        await pilot.press("enter", "escape")  # a confirmed search, cleared
        assert names(app) == NAMES


async def test_escape_without_a_search_draws_nothing(tmp_path: Path) -> None:
    app, source = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        await pilot.press("p")
        source.push(Scrape(HOST_A, T0 + 1, fixture_text(LEAKING_IDLE)))
        await folded(pilot, app, HOST_A.url, T0 + 1)
        await pilot.press("escape")
        await pilot.pause()
        assert kv_of(app, "10.0.0.5:8000") == "████▉ 588/599"  # still the paused frame


async def test_the_search_box_opens_with_the_search_and_escape_clears_it(
        tmp_path: Path) -> None:
    app, _ = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        await pilot.press("slash")
        assert app.filter_box.display and app.focused is app.filter_box
        assert app.filter_box.value == ""
        await pilot.press(*" gate ")
        assert names(app) == ["gateway"] and app.view.filter_text == "gate"
        await pilot.press("enter")  # confirmed: the box goes, the rows stay found
        assert not app.filter_box.display and app.focused is app.table
        assert names(app) == ["gateway"]
        await pilot.press("slash")  # the box again holds the search
        assert app.filter_box.display and app.filter_box.value == "gate"
        await pilot.press("escape")  # while typing: cleared and closed
        assert not app.filter_box.display and app.filter_box.value == ""
        assert app.focused is app.table and names(app) == NAMES
        await pilot.press("slash", *"8001", "enter")
        assert names(app) == ["10.0.0.5:8001"]
        await pilot.press("escape")  # confirmed: cleared too
        assert names(app) == NAMES and app.view.filter_text == ""


def marked(app: KvtopApp) -> list[str]:
    """The sort menu's options that carry a sort marker."""
    menu = app.screen.query_one(OptionList)
    prompts = [str(menu.get_option_at_index(i).prompt) for i in range(menu.option_count)]
    return [prompt for prompt in prompts if prompt.endswith(("▲", "▼"))]


async def test_escape_clears_a_confirmed_search_and_leaves_the_focus_where_it_is(
        tmp_path: Path) -> None:
    app, _ = quiet_app(tmp_path, no_gpu=False)
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: app.gpu_pane.display)
        await pilot.press("slash", *"8001", "enter", "tab")
        assert app.focused is app.gpu_pane and names(app) == ["10.0.0.5:8001"]
        await pilot.press("escape")
        assert names(app) == NAMES and app.focused is app.gpu_pane


async def test_f6_opens_one_menu_on_the_sort_and_what_it_picks_is_drawn(
        tmp_path: Path) -> None:
    app, _ = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        await pilot.press("f6")  # the menu marks the sort as the header does: name ▲
        await pilot.pause()
        assert marked(app) == ["name ▲"]
        await pilot.press("escape", "o", "f6")
        assert isinstance(app.screen, SortMenu)
        app.action_sort_menu()  # F6 again, as the menu's own F6 would not close it
        assert len(app.screen_stack) == 2  # one menu
        await pilot.pause()
        assert marked(app) == ["KV use ▼"]
        await pilot.press("escape")  # closed without a pick: the sort stays
        assert not isinstance(app.screen, SortMenu) and "sort KV use ▼" in header(app)
        await pilot.press("p", "f6", "home", "enter")  # paused, the pick is drawn: name
        assert "sort name ▲" in header(app) and names(app) == NAMES
        await pilot.press("f6", "home", "enter")  # the same again: the other way round
        assert "sort name ▼" in header(app) and names(app) == NAMES[::-1]


def prometheus_scrape(t: float) -> Scrape:
    """The real vLLM 0.33 scrape as a Prometheus answers it, every series labelled with its
    namespace and pod."""
    result = [{"metric": {"__name__": s.name, **s.labels, "job": "vllm",
                          "instance": "10.0.0.1:8000", "namespace": "prod", "pod": "vllm-7f9c"},
               "values": [[t, repr(s.value)]]}
              for s in parse(fixture_text(UNDER_LOAD), keep=WANTED).samples]
    [(_, per_t)] = group_scrapes(result).items()
    target = Target(url="http://prom:9090#vllm/10.0.0.1:8000", name="10.0.0.1:8000",
                    group="vllm")
    return Scrape(target, t, samples=Exposition(per_t[t]))


async def test_f5_steps_through_every_grouping_the_rows_offer_and_says_each(
        tmp_path: Path) -> None:
    app, source = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        source.push(prometheus_scrape(T0))
        assert await soon(pilot, lambda: "10.0.0.1:8000" in names(app))
        await pilot.press("p")  # paused: each grouping is drawn all the same
        source.push(Scrape(HOST_B, T0 + 1, failure="down", error="connection refused"))
        await folded(pilot, app, HOST_B.url, T0 + 1)
        said = []
        for _ in range(5):
            await pilot.press("f5")
            said.append(messages(app)[-1])
            if app.view.group_mode == "model":
                assert names(app) == ["▾ (none) (1)", "gateway", "▾ twin-llama (3)",
                                      "10.0.0.1:8000", *NAMES[:2]]
        assert said == [(f"groups {what}", 2, False) for what in (
            "by group", "by model", "by namespace", "by pod", "off")]
        assert names(app) == ["10.0.0.1:8000", *NAMES]
        assert table_rows(app)[2]["status"] == "down 2s"  # its age now, as F5 saw it


async def test_g_says_why_there_is_no_gpu_pane(tmp_path: Path) -> None:
    app, _ = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("g")
        assert messages(app) == [("no GPU pane: --no-gpu (a GPU exporter as a target still "
                                  "shows its GPUs)", 4, False)]
        assert app.view.gpu_wanted and not app.gpu_pane.display
    app, _ = quiet_app(tmp_path, no_gpu=False, demo=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("g")
        assert messages(app) == [
            ("no GPU pane: the demo's servers are simulated and own no GPU", 4, False)]


async def test_g_hides_and_shows_the_gpu_pane_and_says_where_it_fits(tmp_path: Path) -> None:
    app, _ = quiet_app(tmp_path, no_gpu=False)
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: app.gpu_pane.display)
        await pilot.press("g")
        assert not app.view.gpu_wanted and not app.gpu_pane.display
        await pilot.press("g")
        assert app.view.gpu_wanted and app.gpu_pane.display
        assert messages(app) == []
        await pilot.resize_terminal(*SMALL)
        await pilot.pause()
        await pilot.press("g")
        assert messages(app) == [("the GPU pane is beside the KV chart: a terminal of at "
                                  "least 100x30", 4, False)]
        assert not app.view.gpu_wanted


def this_process_s_gpu() -> list[GpuReading]:
    """The fake NVML's first GPU, its vLLM process this one (listening where a server is)."""
    return [replace(sample_gpus()[0], processes=(
        GpuProcess(os.getpid(), "python3 -m vllm", 73 * GIB, True),))]


async def test_a_server_first_heard_after_the_gpu_read_owns_its_gpu_at_once(
        tmp_path: Path, listening_port: int) -> None:
    local = Target.from_spec(f"127.0.0.1:{listening_port}")
    source = FakeSource()
    app, _ = quiet_app(tmp_path, targets=[local], source_factory=lambda cfg: source,
                       no_gpu=False, gpu_reader=FakeGpuReader(this_process_s_gpu()))
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: app.gpu_watch.views and source.queue)
        source.push(Scrape(local, T0, fixture_text(UNDER_LOAD)))
        assert await soon(pilot, lambda: table_rows(app)[0].get("gpu") == "74/80G")


async def test_an_exporter_s_gpus_show_at_its_first_scrape_and_move_with_the_next(
        tmp_path: Path) -> None:
    exporter = Target.from_spec("10.0.0.5:9400")
    body = gpu_fixture(DCGM_MIG)
    source = FakeSource()
    app, _ = quiet_app(tmp_path, targets=[exporter], source_factory=lambda cfg: source)
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: source.queue)
        source.push(Scrape(exporter, T0, body))  # within the GPUs' 2 s: at once all the same
        assert await soon(pilot, lambda: "4.7/39.6 GiB" in str(app.gpu_pane.render()),
                           timeout_s=5)  # not at the minute's frame
        source.push(Scrape(exporter, T0 + 1, body.replace("} 4845", "} 20000")))
        await folded(pilot, app, exporter.url, T0 + 1)
        await pilot.pause(GPU_MIN_PERIOD_S)  # the exporter's numbers are due again
        await pilot.press("p", "p")  # a frame
        assert "19.5/54.4 GiB" in str(app.gpu_pane.render())  # used + free: the total


class HeldGpuReader(FakeGpuReader):
    """The fake NVML's GPUs, read once the test lets the read go on."""

    def __init__(self, gpus: list[GpuReading] | None = None) -> None:
        super().__init__(gpus)
        self.go = threading.Event()

    def read(self) -> list:  # type: ignore[type-arg]
        self.go.wait(timeout=10)
        return super().read()


async def test_pausing_leaves_the_gpu_pane_and_resuming_draws_it_now(tmp_path: Path) -> None:
    now = [T0 + 2]
    app, _ = quiet_app(tmp_path, no_gpu=False, clock=lambda: now[0])
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        assert await soon(pilot, lambda: app.gpu_pane.display)
        await pilot.pause(0.2)  # the first scrapes' owners worked out and drawn
        drawn = str(app.gpu_pane.render())
        now[0] += 150  # half the history's span: the memory trail's point moves left
        await pilot.press("p")
        assert str(app.gpu_pane.render()) == drawn
        await pilot.press("p")
        assert str(app.gpu_pane.render()) != drawn


async def test_a_resize_redraws_the_panes_only_when_the_layout_changes(tmp_path: Path) -> None:
    now = [T0 + 2]
    app, _ = quiet_app(tmp_path, no_gpu=False, clock=lambda: now[0])
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        assert await soon(pilot, lambda: app.gpu_pane.display)
        await pilot.press("p")
        drawn = str(app.gpu_pane.render())
        now[0] += 150  # the memory trail's point would move left
        await pilot.resize_terminal(110, 30)  # still charts: nothing drawn again
        await pilot.pause(0.2)
        assert str(app.gpu_pane.render()) == drawn
        await pilot.resize_terminal(*SMALL)  # sparklines: drawn at once, paused or not
        assert await soon(pilot, lambda: str(app.gpu_pane.render()) != drawn)
        drawn = str(app.gpu_pane.render())
        now[0] += 100
        await pilot.resize_terminal(90, 24)  # still sparklines: nothing drawn again
        await pilot.pause(0.2)
        assert str(app.gpu_pane.render()) == drawn
        await pilot.resize_terminal(*SIZE)  # charts again
        assert await soon(pilot, lambda: str(app.gpu_pane.render()) != drawn)


async def test_the_gpus_are_read_again_at_least_two_seconds_on(tmp_path: Path) -> None:
    reader = FakeGpuReader()
    app, _ = quiet_app(tmp_path, no_gpu=False, gpu_reader=reader, interval_s=0.5)
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: reader.reads == 2)


async def test_a_gpu_refresh_with_nothing_new_for_the_rows_draws_no_frame(
        tmp_path: Path) -> None:
    app, source = quiet_app(tmp_path, no_gpu=False)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        assert await soon(pilot, lambda: app.gpu_pane.display)
        source.push(Scrape(HOST_A, T0 + 1, fixture_text(LEAKING_IDLE)))
        await folded(pilot, app, HOST_A.url, T0 + 1)
        app.gpu_watch.refresh()  # the same owners: the pane again, the rows at the minute
        await pilot.pause(0.2)
        assert kv_of(app, "10.0.0.5:8000") == "████▉ 588/599"


async def test_a_gpu_read_landing_while_paused_shows_on_resume(tmp_path: Path) -> None:
    reader = HeldGpuReader()
    app, _ = quiet_app(tmp_path, no_gpu=False, gpu_reader=reader)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        await pilot.press("p")
        reader.go.set()
        assert await soon(pilot, lambda: app.gpu_watch.views)
        await pilot.pause(0.2)
        assert not app.gpu_pane.display and "gpu" not in table_rows(app)[0]
        await pilot.press("p")
        assert app.gpu_pane.display


async def test_a_server_found_owning_a_gpu_gets_its_column_at_once(
        tmp_path: Path, listening_port: int) -> None:
    local = Target.from_spec(f"127.0.0.1:{listening_port}")  # its GPU process: this one
    reader = HeldGpuReader(this_process_s_gpu())
    source = FakeSource([Scrape(local, T0, fixture_text(UNDER_LOAD))])
    app, _ = quiet_app(tmp_path, targets=[local], source_factory=lambda cfg: source,
                       no_gpu=False, gpu_reader=reader)
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: table_rows(app)[0]["status"] == "up")
        assert "gpu" not in table_rows(app)[0]
        reader.go.set()  # owned: the row and header say so at once, not at the minute
        assert await soon(pilot, lambda: table_rows(app)[0].get("gpu") == "74/80G")


async def test_plus_and_minus_set_the_sources_interval_and_say_it(tmp_path: Path) -> None:
    app, source = quiet_app(tmp_path, interval_s=5.0)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        await pilot.press("plus")
        assert (app.interval_s, source.interval_s) == (10.0, 10.0)
        assert "every 10s" in header(app)
        await pilot.press("minus", "minus")
        assert (app.interval_s, source.interval_s) == (2.0, 2.0)
        assert messages(app) == [(f"polling every {s}s", 2, False) for s in ("10", "5", "2")]
        # said in the footer's line
        assert await soon(pilot, lambda: str(app.query_one(MessageLine).render())
                           == "polling every 2s")


async def test_plus_before_the_source_is_made_is_handed_to_it(tmp_path: Path) -> None:
    app, source = quiet_app(tmp_path, interval_s=5.0)
    app.action_interval(1)  # before the app runs: no source yet
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: app.source is source)
        assert (app.interval_s, source.interval_s) == (10.0, 10.0)


async def test_f1_opens_one_help_with_every_key(tmp_path: Path) -> None:
    app, _ = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        app.action_help()
        assert len(app.screen_stack) == 2  # one help
        await pilot.pause()
        assert str(app.screen.query_one("#help-body").render()) == str(help_text(KEYS))


async def test_the_detail_is_redrawn_with_each_frame(tmp_path: Path) -> None:
    app, source = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        await pilot.press("down", "enter")
        assert await soon(pilot, lambda: isinstance(app.screen, DetailScreen)
                           and app.screen.is_mounted)
        info = app.screen.query_one("#detail-info")
        before = str(info.render())
        assert "num_gpu_blocks 1000" in before
        source.push(Scrape(HOST_B, T0 + 1, fixture_text(UNDER_LOAD)))  # another server
        await folded(pilot, app, HOST_B.url, T0 + 1)
        app.draw_clock.request()
        await pilot.pause(0.2)
        assert str(info.render()) == before  # not before the frame
        await pilot.press("p", "p")  # resumed: a frame at once
        assert "status  restarted" in str(info.render())


def panes_title(app: KvtopApp) -> str:
    return str(app.panes.border_title)


async def test_the_selected_engine_is_drawn_in_the_layout_shown(tmp_path: Path) -> None:
    app, _ = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        assert panes_title(app) == "10.0.0.5:8000 · twin-llama"
        await pilot.resize_terminal(*SMALL)  # sparklines: the panel drawn at once
        assert await soon(pilot, lambda: not app.charts_shown
                           and "10.0.0.5:8000" in str(app.engine_panel.render()))
        kv_line = str(app.engine_panel.render()).split("\n")[1]
        assert kv_line.startswith("KV ") and kv_line.endswith("█ █████████▉ 588/599 98%")
        await pilot.press("down")  # the panel follows the cursor; the hidden charts wait
        assert "10.0.0.5:8001" in str(app.engine_panel.render())
        assert panes_title(app) == "10.0.0.5:8000 · twin-llama"
        await pilot.resize_terminal(*SIZE)  # charts again: drawn at once
        assert await soon(pilot, lambda: app.charts_shown
                           and panes_title(app) == "10.0.0.5:8001 · twin-llama")
        await pilot.press("slash", *"zzz")  # a search that leaves nothing says so
        assert str(app.panes.head.render()) == NO_MATCH
        await pilot.resize_terminal(*SMALL)  # in the panel too
        assert await soon(pilot, lambda: str(app.engine_panel.render()) == NO_MATCH)


NO_MATCH = ("no row matches 'zzz': the header still counts the whole fleet; escape clears "
            "the search")


async def test_low_bandwidth_draws_no_chart_and_at_most_every_two_seconds(
        tmp_path: Path) -> None:
    app, _ = quiet_app(tmp_path, low_bandwidth=True, interval_s=0.5)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        assert app.has_class("-sparks") and not app.has_class("-charts", "compact")
        assert app.draw_clock.period_s == 2.0
        # the small panel, without its sparklines
        assert str(app.engine_panel.render()).split("\n")[:3] == [
            "leak WARMUP  collecting data", "KV    █████████▉ 588/599 98%", "run   30"]


async def test_a_layout_change_landing_at_shutdown_draws_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app, _ = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
    shown: list[object] = []
    for widget in (app.panes, app.engine_panel, app.gpu_pane):
        monkeypatch.setattr(widget, "show", lambda *a, **k: shown.append(a))
    app._redraw_panel()  # queued by a resize, run after the widgets are gone
    assert shown == []


def kv_pane(app: KvtopApp) -> tuple[str, str]:
    pane = app.panes.query_one("#pane-kv")
    return str(pane.border_title), str(pane.border_subtitle)


async def test_a_baseline_is_the_delta_column_and_the_kv_chart_s_level(tmp_path: Path) -> None:
    app, _ = quiet_app(tmp_path, baseline=baseline())
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        # +58 points of the pool against the baseline's p50; none for a server it does not know
        assert [row["delta"] for row in table_rows(app)] == ["+58pt –", "–", "–"]
        title, subtitle = kv_pane(app)
        assert title.endswith("base p50 (base)") and "  base 40%" in subtitle
    app, _ = quiet_app(tmp_path, baseline=BaselineOverlay({}))  # no baseline in it: none
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        assert "delta" not in table_rows(app)[0] and "base" not in "".join(kv_pane(app))


LIMIT = 120 * 1024  # the recording's size limit: the live scene's three scrapes fit


async def test_the_recording_gets_every_scrape_and_its_state_is_in_the_header(
        tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    app, source = quiet_app(tmp_path, record=path, record_max_bytes=LIMIT)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        assert header(app).split("\n")[1].endswith("every 60s  sort name ▲  REC")
        app.recording.flush()  # the period's flush: the three first scrapes
        source.push(Scrape(HOST_A, T0 + 1, fixture_text(UNDER_LOAD)))
        await folded(pilot, app, HOST_A.url, T0 + 1)
        app.recording.flush()  # past the limit
        await pilot.pause()
        assert messages(app) == [(f"{path}: stopped at 120 KiB", 10, False)]
        await pilot.press("p", "p")
        assert header(app).split("\n")[1].endswith("REC stopped at 120 KiB")
    recording = read_recording(path)
    assert recording.header["interval_s"] == MINUTE
    assert recording.header["targets"] == [t.url for t in LIVE_TARGETS]
    assert [(s.target.url, s.t) for s in recording.scrapes] == [
        (s.target.url, s.t) for s in source.delivered[:3]]
    assert path.stat().st_size <= LIMIT


async def test_kv_event_batches_reach_the_tracker_through_the_factory(tmp_path: Path) -> None:
    feed = FakeKvFeed([HOST_A])
    asked: list[object] = []
    app, _ = quiet_app(tmp_path, kv_events_factory=lambda cfg: asked.append(cfg) or feed)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        assert asked == [app.config] and feed.running
        feed.push(HOST_A, KvEventBatch(t=T0 + 1, rank=0, seq=1, ts=T0 + 1, events=(
            BlockStored((1, 2), None, 32, 16, "GPU"),)))
        assert await soon(pilot, lambda: app.trackers[HOST_A.url].state.kv_channel)


async def test_every_kv_event_batch_is_folded_and_recorded(tmp_path: Path) -> None:
    feed = FakeKvFeed([HOST_A])
    path = tmp_path / "live.jsonl"
    app, _ = quiet_app(tmp_path, kv_events_factory=lambda cfg: feed, record=path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        for seq in (1, 2):
            feed.push(HOST_A, KvEventBatch(t=T0 + seq, rank=0, seq=seq, ts=T0 + seq, events=(
                BlockStored((seq,), None, 16, 16, "GPU"),)))
        assert await soon(pilot, lambda: feed.queue.empty())
        await pilot.pause(0.2)
    assert [item.batch.seq for item in read_recording(path).kv_events] == [1, 2]


async def test_a_lost_terminal_flushes_the_recording_before_exiting(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    app, source = quiet_app(tmp_path, record=path)
    async with app.run_test(size=SIZE) as pilot:
        assert await live_data_shown(pilot, WAIT_S)
        app.watchdog.terminal_gone()
        assert len(read_recording(path).scrapes) == len(source.delivered) == 3  # on disk now
    assert app.return_code == 0


async def test_entering_leak_runs_the_alert_command_with_the_app_s_clock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "event.json"
    state = leaking_state()
    state.engines = [replace(state.engines[0], leak=QUIET)]
    tracker = StaticTracker(state, {})
    source = FakeSource([Scrape(state.target, T0)])
    app, _ = quiet_app(tmp_path, targets=[state.target], source_factory=lambda cfg: source,
                       tracker_factory=lambda target: tracker, clock=lambda: T0 + 7,
                       alerts=AlertSettings(command=copy_stdin_to(out)))
    bells: list[bool] = []
    monkeypatch.setattr(app, "bell", lambda: bells.append(True))
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: source.delivered and app.table.rows)
        state.engines = [replace(state.engines[0], leak=LEAKING)]
        source.push(Scrape(state.target, T0 + 1))  # a new host's row: drawn, and alerts seen
        await pilot.press("p", "p")
        assert await soon(pilot, lambda: out.exists() and out.read_text())
    assert bells == [True]
    document = json.loads(out.read_text())
    assert (document["event"], document["at"]) == ("leak", "2026-01-01T00:00:07+00:00")


async def test_s_writes_a_snapshot_of_every_target_s_history_and_the_gpus(
        tmp_path: Path) -> None:
    app, _ = quiet_app(tmp_path, no_gpu=False, history_s=120.0)
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: app.gpu_pane.display)
        await pilot.press("s")
        assert await soon(pilot, lambda: list(tmp_path.glob("kvtop-snapshot-*/*.json")))
    [path] = tmp_path.glob("kvtop-snapshot-*/*.json")
    assert path.parent.name == "kvtop-snapshot-20260101T000002Z"
    document = json.loads(path.read_text())
    by_url = {t["target"]: t for t in document["targets"]}
    assert by_url[HOST_A.url]["history"][0]["blocks_used"] == [588]
    assert [g["name"] for g in document["gpus"]] == [g.name for g in sample_gpus()]
    assert document["gpu_sources"][0]["source"] == "nvml"


class WatchedSource(FakeSource):
    """The hand-driven source, keeping the stop event it was run with."""

    async def run(self, on_scrape, *, stop: asyncio.Event) -> None:  # type: ignore[override]
        self.stop = stop
        await super().run(on_scrape, stop=stop)


async def test_the_terminal_is_watched_on_a_terminal_unless_told_not_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(Headless, as every test here, nothing watches: that is the other tests' apps.)"""
    before = signal.getsignal(signal.SIGHUP)
    monkeypatch.setattr(KvtopApp, "is_headless", property(lambda self: False))
    try:
        for watch_tty in (False, True):
            app, _ = quiet_app(tmp_path, watch_tty=watch_tty,
                               source_factory=lambda cfg: FakeSource())
            async with app.run_test(size=SIZE) as pilot:
                await pilot.pause()
                watching = signal.getsignal(signal.SIGHUP) is not before  # SIGHUP: gone
                assert watching == watch_tty
    finally:
        signal.signal(signal.SIGHUP, before)


async def test_quitting_stops_collection_first_and_keeps_the_return_code(
        tmp_path: Path) -> None:
    source = WatchedSource()
    app, _ = quiet_app(tmp_path, source_factory=lambda cfg: source)
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: hasattr(source, "stop"))
        app.exit("done", return_code=3)
        assert source.stop.is_set()  # at once, before shutting down
    assert (app.return_value, app.return_code) == ("done", 3)
    assert app_exit_code(app) == EXIT_INTERNAL
    app, _ = quiet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
    assert app.return_code == 0 and app_exit_code(app) == EXIT_OK


async def test_a_crash_is_reported_without_locals_and_exits_70(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    source = WatchedSource()
    path = tmp_path / "live.jsonl"
    app, _ = quiet_app(tmp_path, source_factory=lambda cfg: source, record=path)
    bells: list[bool] = []
    monkeypatch.setattr(app, "bell", lambda: bells.append(True))

    def broken() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        async with app.run_test(size=SIZE) as pilot:
            assert await soon(pilot, lambda: hasattr(source, "stop"))
            monkeypatch.setattr(app.view, "next_sort", broken)
            await pilot.press("o")
    [report] = tmp_path.glob("kvtop-crash-*.txt")
    assert app.crash_line == f"ValueError: a bug (traceback in {report})"
    assert bells == [True] and source.stop.is_set()
    assert read_recording(path).scrapes == []  # closed: its end written
    assert app_exit_code(app) == EXIT_INTERNAL
    assert capsys.readouterr().err == (
        f"kvtop: the app stopped on an internal error, a bug: {app.crash_line}\n")


async def test_the_crash_report_is_of_the_error_being_handled_else_an_unknown_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    app, _ = quiet_app(tmp_path)
    async with app.run_test(size=SIZE):
        try:
            raise KeyError("gone")
        except KeyError:
            app._fatal_error()  # as Textual calls it, inside its handler
    [report] = tmp_path.glob("kvtop-crash-*.txt")
    assert app.crash_line == f"KeyError: 'gone' (traceback in {report})"
    report.unlink()
    app, _ = quiet_app(tmp_path)
    async with app.run_test(size=SIZE):
        app._fatal_error()
    [report] = tmp_path.glob("kvtop-crash-*.txt")
    assert app.crash_line == f"RuntimeError: unknown error (traceback in {report})"


def test_a_crash_of_another_app_points_at_textual_s_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    app: App[None] = App()
    app._return_code = 1
    assert app_exit_code(app) == EXIT_INTERNAL
    assert capsys.readouterr().err == (
        "kvtop: the app stopped on an internal error, a bug: traceback above\n")


def test_run_app_refuses_a_recording_it_cannot_create(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert run_app(AppConfig(targets=[HOST_A], record=blocker / "rec.jsonl")) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"kvtop: can't record to {blocker / 'rec.jsonl'}: Not a directory\n")


def test_run_app_owns_the_process_and_exits_0_when_quit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float | None] = []

    async def quit_at_once(pilot: object) -> None:
        app = pilot.app  # type: ignore[attr-defined]
        seen.append(app.watchdog.exit_deadline_s)
        await pilot.press("q")  # type: ignore[attr-defined]

    monkeypatch.setattr(KvtopApp, "run", functools.partialmethod(
        App.run, headless=True, size=SIZE, auto_pilot=quit_at_once))
    source = FakeSource()
    assert run_app(AppConfig(targets=[HOST_A], source_factory=lambda cfg: source,
                             no_gpu=True, snapshot_dir=tmp_path)) == EXIT_OK
    assert seen == [TERMINAL_GONE_GRACE_S]


def test_the_default_source_polls_the_targets_as_configured() -> None:
    config = AppConfig(targets=[HOST_A, HOST_B], interval_s=5.0, insecure=True)
    poller = _poller(config)
    assert isinstance(poller, Poller)
    assert poller.targets == (HOST_A, HOST_B) and poller.interval_s == 5.0
    assert (poller._insecure, poller._narrow) == (True, True)
    assert _poller(AppConfig(targets=[HOST_A], full_metrics=True))._narrow is False


def test_the_app_is_made_of_its_config_before_it_runs(tmp_path: Path) -> None:
    """What the app holds from its config as soon as it is made (before any terminal)."""
    path = tmp_path / "live.jsonl"
    config = AppConfig(targets=LIVE_TARGETS, interval_s=0.5, low_bandwidth=True, record=path,
                       record_max_bytes=LIMIT, baseline=baseline(), no_gpu=True)
    app = KvtopApp(config)
    assert app.config is config and app.overlay is config.baseline and app.source is None
    assert list(app.trackers) == [t.url for t in LIVE_TARGETS]
    assert [(s.target, s.status) for s in app.states()] == [(t, "pending") for t in LIVE_TARGETS]
    assert app.interval_s == 0.5 and app.draw_clock.period_s == 2.0  # --low-bandwidth: 2 s
    assert app.selected_engine.band(HOST_A.url, ("twin-llama", "0")) is not None
    assert app.gpu_watch.why_no_pane(demo=False) == (
        "no GPU pane: --no-gpu (a GPU exporter as a target still shows its GPUs)")
    assert app.crash_line is None and app.recording.status() == ""
    assert (app.recording.writer.path, app.recording.writer.max_bytes) == (path, LIMIT)
    app.recording.close()
    assert read_recording(path).header["interval_s"] == 0.5
    plain = KvtopApp(AppConfig(targets=[HOST_A], baseline=BaselineOverlay({})))
    assert plain.overlay is None and plain.recording.status() is None
    assert plain.draw_clock.period_s == 1.0


def test_nvml_is_read_unless_no_gpu_or_a_demo() -> None:
    assert isinstance(KvtopApp(AppConfig(targets=[HOST_A])).gpu_watch._reader, NvmlReader)
    reader = FakeGpuReader()
    assert KvtopApp(AppConfig(targets=[HOST_A], gpu_reader=reader)).gpu_watch._reader is reader
    for flag in ("no_gpu", "demo"):
        app = KvtopApp(AppConfig(targets=[HOST_A], gpu_reader=reader, **{flag: True}))
        assert app.gpu_watch._reader is None


class FailingSource(FakeSource):
    """Delivers its scrapes, then fails as the OS may fail a collector (out of sockets)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(live_scrapes())
        self.error = error

    async def run(self, on_scrape: Callable[[Scrape], object], *,
                  stop: asyncio.Event) -> None:
        read = ScrapeReader()
        for scrape in self.initial:
            on_scrape(read(scrape))
        raise self.error


async def test_collection_that_stops_on_an_error_says_so_while_the_numbers_stay(
        tmp_path: Path) -> None:
    # the numbers stay on screen as of the failure; without the message nothing said they
    # were frozen (the collector's worker ends quietly: exit_on_error=False)
    source = FailingSource(OSError(24, "Too many open files"))
    app, _ = quiet_app(tmp_path, source_factory=lambda cfg: source)
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: messages(app))
        assert messages(app) == [(
            "collection stopped: OSError: [Errno 24] Too many open files; the numbers are as "
            "of then (restart kvtop)", COLLECT_STOPPED_S, False)]
        assert [n.severity for n in app._notifications] == ["error"] and app.is_running
        assert names(app) == NAMES
    assert COLLECT_STOPPED_S == 86400.0


async def test_a_long_collection_error_is_cut_to_300_cells(tmp_path: Path) -> None:
    source = FailingSource(RuntimeError("y" * 400))
    app, _ = quiet_app(tmp_path, source_factory=lambda cfg: source)
    async with app.run_test(size=SIZE) as pilot:
        assert await soon(pilot, lambda: messages(app))
        ((said, _, _),) = messages(app)
        assert said == "collection stopped: RuntimeError: " + "y" * 265 + "…"

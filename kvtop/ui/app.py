"""The kvtop terminal app: collection in workers, trackers fold scrapes, widgets draw states.

Scrapes arrive from a :class:`ScrapeSource` (the poller, or a replay) inside an async
worker and go to their target's tracker at once; every frame is asked of one
:class:`~kvtop.ui.draw_clock.DrawClock`, which draws at most once per redraw period, so ten
hosts at 1 Hz cost one redraw a second, and a paused display keeps collecting.

The app is composed of small parts, each with one concern, and wires them to the widgets:
the fleet's trackers (collection), the draw clock (when), the frame painter (what a frame
shows), the view state (sort, groups, search, pause), the selected engine (its panes and
detail), the GPU watch (NVML reads in a re-armed worker, owners, GPU histories), the alert
tap (leak and stall changes: toasts, bell, command), the recording tap (``--record``), the
snapshot taker (``s``) and the terminal watchdog. Its keys are in kvtop/ui/keys.py.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from textual import on, work
from textual.app import App, ComposeResult
from textual.containers import Vertical
from textual.events import Resize
from textual.widgets import Footer, Input
from textual.worker import Worker, WorkerState

from kvtop.collect.nvml import GpuReader, NvmlReader
from kvtop.collect.source import ScrapeSource
from kvtop.collect.target import Scrape, Target
from kvtop.config import AlertSettings
from kvtop.crash import write_crash_report
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import EngineKey, TargetState, TargetTracker
from kvtop.exits import EXIT_INTERNAL, EXIT_OK, EXIT_USAGE
from kvtop.safe_text import display_text, warn
from kvtop.store.writer import DEFAULT_MAX_BYTES, RecordingWriter
from kvtop.ui.alert_tap import AlertTap
from kvtop.ui.draw_clock import DrawClock
from kvtop.ui.fleet_trackers import FleetTrackers
from kvtop.ui.frame import FramePainter
from kvtop.ui.gpu_watch import GpuWatch
from kvtop.ui.keys import LIVE_BINDINGS
from kvtop.ui.kv_events_tap import KvEventsTap, KvFeed
from kvtop.ui.recording_tap import RecordingTap
from kvtop.ui.screens.detail import DetailScreen
from kvtop.ui.screens.help import KEYS, HelpScreen
from kvtop.ui.screens.sort_menu import SortMenu
from kvtop.ui.selected_engine import SelectedEngine
from kvtop.ui.snapshot_taker import SnapshotTaker
from kvtop.ui.watchdog import TerminalWatchdog
from kvtop.ui.widgets.cache_pane import CachePane
from kvtop.ui.widgets.engine_panel import EnginePanel
from kvtop.ui.widgets.fleet_table import FleetTable
from kvtop.ui.widgets.gpu_pane import GpuPane
from kvtop.ui.widgets.message_line import MessageLine, show_messages
from kvtop.ui.widgets.panes import EnginePanes
from kvtop.ui.widgets.summary import SummaryBar
from kvtop.view.sort_keys import column_sort_key
from kvtop.view.view_state import ViewState

if TYPE_CHECKING:
    from kvtop.baseline.overlay import BaselineOverlay
    from kvtop.collect.reading import EngineReading

INTERVALS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
COMPACT_WIDTH = 120  # below this the detail's plots go one per row
# Below this size the engine's charts shrink to sparklines under the table (80x24 over ssh)
CHARTS_MIN_SIZE = (100, 30)
GRID2_SIZE = (120, 45)  # narrower and at least this tall: the small charts two by two
COLLECT_STOPPED_S = 86400.0  # the message stays while the numbers it explains stay frozen
TERMINAL_GONE_GRACE_S = 3.0  # then the process ends even if shutting down hangs



def layout_classes(width: int, height: int, *, low_bandwidth: bool) -> dict[str, bool]:
    """The app's layout classes for a terminal size: charts where they fit, sparklines
    under the table where they don't (or with --low-bandwidth)."""
    sparks = width < CHARTS_MIN_SIZE[0] or height < CHARTS_MIN_SIZE[1] or low_bandwidth
    return {"compact": width < COMPACT_WIDTH, "-sparks": sparks, "-charts": not sparks,
            "-grid2": width < GRID2_SIZE[0] and height >= GRID2_SIZE[1]}


def next_interval(interval_s: float, step: int) -> float:
    """``+``/``-``: the next longer or shorter of INTERVALS from the nearest to now."""
    position = min(range(len(INTERVALS)), key=lambda i: abs(INTERVALS[i] - interval_s))
    return INTERVALS[min(max(position + step, 0), len(INTERVALS) - 1)]


class Tracker(Protocol):
    """What the app needs of a tracker (:class:`TargetTracker` in production)."""

    state: TargetState
    history: dict[EngineKey, deque[EngineStats]]

    def update(self, scrape: Scrape) -> TargetState: ...

    @property
    def readings(self) -> dict[EngineKey, EngineReading]: ...


def _no_kv_events(config: AppConfig) -> KvFeed | None:
    return None


def _poller(config: AppConfig) -> ScrapeSource:
    from kvtop.collect.poller import Poller

    return Poller(config.targets, interval_s=config.interval_s, insecure=config.insecure,
                  narrow=not config.full_metrics)


@dataclass
class AppConfig:
    targets: list[Target]
    interval_s: float = 1.0
    no_gpu: bool = False
    demo: bool = False  # the servers are simulated: no GPU of this machine is theirs
    snapshot_dir: Path | None = None  # None: $XDG_STATE_HOME/kvtop/snapshots
    low_bandwidth: bool = False  # no charts, slower redraw
    insecure: bool = False  # passed to the default poller (self-signed TLS)
    full_metrics: bool = False  # the default poller reads every family, not only kvtop's
    history_s: float = 300.0  # span of the detail plots and of the snapshot's history
    source_factory: Callable[[AppConfig], ScrapeSource] = _poller
    kv_events_factory: Callable[[AppConfig], KvFeed | None] = _no_kv_events  # beside it
    tracker_factory: Callable[[Target], Tracker] = TargetTracker
    gpu_reader: GpuReader | None = None  # default: NVML
    clock: Callable[[], float] = time.time  # wall clock for ages; fixed in snapshot tests
    watch_tty: bool = True  # exit when the terminal goes away (ignored when headless)
    record: Path | None = None  # write every scrape to this recording while running
    record_max_bytes: int | None = DEFAULT_MAX_BYTES  # the recording stops there
    baseline: BaselineOverlay | None = None  # drawn in the panes and the Δ column
    alerts: AlertSettings = field(default_factory=AlertSettings)  # bell, command on LEAK/STALL


def tell_if_collection_stopped(app: App[Any], event: Worker.StateChanged) -> None:
    """Collection that stopped on an error leaves every number frozen: say so, and why."""
    worker = event.worker
    if worker.group == "collect" and event.state == WorkerState.ERROR:
        error = worker.error
        app.notify(display_text(f"collection stopped: {type(error).__name__}: {error}; "
                                "the numbers are as of then (restart kvtop)", 300),
                   severity="error", timeout=COLLECT_STOPPED_S, markup=False)


class KvtopApp(App[None]):
    CSS_PATH = "kvtop.tcss"
    TITLE = "kvtop"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = LIVE_BINDINGS
    HELP_KEYS = KEYS

    def __init__(self, config: AppConfig) -> None:
        super().__init__()
        self.config = config
        self.overlay = config.baseline if config.baseline else None
        self.fleet = FleetTrackers(config.tracker_factory, config.targets, self.overlay)
        self.source: ScrapeSource | None = None  # made in the worker: the poller's HTTP
        # stack takes a third of a second to import, after the first frame, not before it
        self.interval_s = config.interval_s
        self.view = ViewState()
        # the draw is looked up when due, so a wrapper set on the app later is the one called
        self.draw_clock = DrawClock(lambda: self._draw(), interval_s=lambda: self.interval_s,
                                    low_bandwidth=config.low_bandwidth,
                                    set_timer=self.set_timer, paused=lambda: self.view.paused)
        self.recording = RecordingTap(self, None if config.record is None else RecordingWriter(
            config.record, interval_s=config.interval_s, targets=config.targets,
            max_bytes=config.record_max_bytes), on_trouble=self.draw_clock.request)
        nvml = None if config.no_gpu or config.demo else config.gpu_reader or NvmlReader()
        self.gpu_watch = GpuWatch(self, nvml, history_s=config.history_s, clock=config.clock,
                                  states=self.states, period_s=lambda: self.interval_s,
                                  on_screen=self._on_screen, on_refresh=self._gpus_refreshed)
        self.selected_engine = SelectedEngine(
            lambda: self.trackers, self.gpu_watch, self.overlay, clock=config.clock,
            span_s=config.history_s, charts=not config.low_bandwidth,
            interval_s=lambda: self.interval_s)
        self.alert_tap = AlertTap(self, config.alerts, config.clock)
        self.frame = FramePainter(self.view, self.gpu_watch, self.selected_engine, self.overlay)
        self.snapshots = SnapshotTaker(self, config.snapshot_dir, config.history_s)
        self.watchdog = TerminalWatchdog(self, before_exit=self.recording.flush)
        self._stop = asyncio.Event()
        self.kv_events = KvEventsTap(self, lambda: config.kv_events_factory(config),
                                     lambda: self.trackers, self.recording,
                                     on_batch=self.draw_clock.request, stop=self._stop)
        self.crash_line: str | None = None  # set by _fatal_error: what went wrong, and where

    # -- layout ---------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        self._lay_out(*self.size)  # before the widgets exist: they are styled once, not twice
        yield SummaryBar(id="summary")
        with Vertical(id="body"):
            yield FleetTable(id="fleet")
            yield EnginePanel(id="engine")  # small terminals: sparklines
            yield EnginePanes(CachePane(id="cache"), GpuPane(id="gpu"), id="panes")  # charts
        yield Input(placeholder="search: words that every row shown must contain", id="filter")
        yield Footer()
        yield MessageLine(id="message")

    def on_mount(self) -> None:
        # Held, not queried: app queries look at the active screen, which may be the detail.
        self.table = self.query_one(FleetTable)
        self.summary = self.query_one(SummaryBar)
        self.gpu_pane = self.query_one(GpuPane)
        self.engine_panel = self.query_one(EnginePanel)
        self.panes = self.query_one(EnginePanes)
        self.filter_box = self.query_one("#filter", Input)
        self.selected_engine.attach(self.panes, self.engine_panel)
        self.frame.attach(self.table, self.summary, self.gpu_pane)
        self.table.focus()
        self._draw()
        # the first frame (the hosts) is painted first: the poller's HTTP stack and NVML are
        # imported after it
        self.call_after_refresh(self._collect)
        self.call_after_refresh(self.kv_events.start)
        self.call_after_refresh(self.gpu_watch.start)
        self.draw_clock.start()
        if self.config.watch_tty and not self.is_headless:
            self.watchdog.start()
        self.recording.start()

    def on_resize(self, event: Resize) -> None:
        self._lay_out(event.size.width, event.size.height)

    def _lay_out(self, width: int, height: int) -> None:
        """Whichever of charts and sparklines is shown now is drawn now (a chart takes its
        new size at once by itself)."""
        classes = layout_classes(width, height, low_bandwidth=self.config.low_bandwidth)
        changed = not self.has_class("-sparks" if classes["-sparks"] else "-charts")
        self.update_classes(classes)  # one restyle of the screen for them all
        if changed and hasattr(self, "table"):
            self.call_after_refresh(self._redraw_panel)

    @property
    def charts_shown(self) -> bool:
        return not self.has_class("-sparks")

    # -- collection ---------------------------------------------------------------------

    @property
    def trackers(self) -> dict[str, Tracker]:
        return self.fleet.by_url

    def reset_trackers(self) -> None:
        """Start every tracker afresh (a replay rewound), and tell every alert again."""
        self.fleet.reset()
        self.alert_tap.forget()

    @work(group="collect", exit_on_error=False)
    async def _collect(self) -> None:
        source = self.source = self.config.source_factory(self.config)
        source.interval_s = self.interval_s  # `+`/`-` may have come first
        if hasattr(source, "__aenter__") and hasattr(source, "__aexit__"):  # holds a session
            async with source:
                await source.run(self.on_scrape, stop=self._stop)
        else:
            await source.run(self.on_scrape, stop=self._stop)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        tell_if_collection_stopped(self, event)

    def on_scrape(self, scrape: Scrape) -> None:
        """Fold a scrape into its tracker now (even when paused); draw later, coalesced."""
        tracker, first = self.fleet.fold(scrape)
        self.gpu_watch.scraped(first, tracker.state.kind)
        self.recording.write(scrape)  # never raises: trouble shows in the status line
        if first and not self.view.paused:
            self.draw_clock.soon()
        else:
            self.draw_clock.request()

    def states(self) -> list[TargetState]:
        return self.fleet.states()

    # -- drawing --------------------------------------------------------------------------

    def _on_screen(self) -> bool:
        """False once shutting down: a late scrape or GPU read must not paint gone widgets."""
        return bool(self.screen_stack) and self.summary.is_attached

    def _draw(self, *, force: bool = False) -> None:
        """A frame of what the trackers hold now. Alerts and GPU owners are worked out
        even while paused (they are not display)."""
        if not self._on_screen():
            return
        states = self.states()
        self.alert_tap.look(states)
        self.gpu_watch.refresh_if_due()
        if self.view.paused and not force:
            return
        self.draw_clock.drawn()
        now = self.config.clock()
        self.frame.paint(states, now, charts=self.charts_shown, interval_s=self.interval_s,
                         recording=self.recording.status())
        if isinstance(self.screen, DetailScreen):
            self.screen.show(now)

    def _show_panel(self) -> None:
        self.selected_engine.show(self.table.selected_row, self.config.clock(),
                                  charts=self.charts_shown, search=self.view.filter_text)

    def _redraw_panel(self) -> None:
        if self._on_screen():
            self._show_panel()
            self.frame.show_gpu_pane(self.config.clock())

    def _gpus_refreshed(self, redraw: bool) -> None:
        if not self.view.paused:
            self.frame.show_gpu_pane(self.config.clock())
            if redraw:
                self.draw_clock.soon()  # a server's GPU column and line, the note: now

    # -- events and keys --------------------------------------------------------------------

    @on(FleetTable.RowHighlighted, "#fleet")
    def _row_highlighted(self, event: FleetTable.RowHighlighted) -> None:
        if type(event) is FleetTable.RowHighlighted and not self.view.paused:
            self._show_panel()

    @on(FleetTable.HeaderClicked, "#fleet")
    def _header_clicked(self, event: FleetTable.HeaderClicked) -> None:
        self.sort_by(column_sort_key(event.column))

    @on(FleetTable.GroupToggled, "#fleet")
    def _group_toggled(self, event: FleetTable.GroupToggled) -> None:
        if self.view.toggle_group(event.key, event.open):
            self._draw(force=True)

    def sort_by(self, key: str | None) -> None:
        """Sort by ``key`` (None: no sort asked, as a closed menu); the key already sorted
        by again turns the order round."""
        if key is not None:
            self.view.sort_by(key)
            self._draw(force=True)

    def action_pause(self) -> None:
        self.view.paused = not self.view.paused
        self._draw(force=True)  # shows PAUSED, or catches up on resume
        if not self.view.paused:
            self.frame.show_gpu_pane(self.config.clock())

    def action_sort(self) -> None:
        """`o`: the next of the usual sort keys."""
        self.view.next_sort()
        self._draw(force=True)

    def action_sort_menu(self) -> None:
        if not isinstance(self.screen, SortMenu):
            self.push_screen(SortMenu(self.view.sort_key, self.view.ascending),
                             self.sort_by)

    def action_group(self) -> None:
        """F5: no groups, config group, model, then each Prometheus label, like htop's tree
        (the labels of every row, the search's and closed groups' too)."""
        self.view.next_group_mode(self.frame.rows(self.states(), self.config.clock()))
        label = self.view.group_label
        self.notify(display_text(f"groups {f'by {label}' if label else 'off'}"), timeout=2,
                    markup=False)
        self._draw(force=True)

    def action_filter(self) -> None:
        box = self.filter_box
        box.display = True
        box.value = self.view.filter_text
        box.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.view.search(event.value)
        self._draw(force=True)

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        self.filter_box.display = False
        self.table.focus()

    def action_close_filter(self) -> None:
        """Escape clears the search, whether it is being typed or was confirmed."""
        box = self.filter_box
        if box.display:
            box.value = ""
            self._filter_done()
        elif self.view.filter_text:
            self.view.search("")
            self._draw(force=True)

    def _refresh_notifications(self) -> None:
        """Messages take the active screen's footer line, never a toast over the panes."""
        show_messages(self, list(self._notifications))

    def action_toggle_gpu(self) -> None:
        if (why := self.gpu_watch.why_no_pane(demo=self.config.demo)) is not None:
            self.notify(display_text(why), timeout=4, markup=False)
            return
        self.view.gpu_wanted = not self.view.gpu_wanted
        self.frame.show_gpu_pane(self.config.clock())
        if not self.charts_shown:
            self.notify("the GPU pane is beside the KV chart: a terminal of at least "
                        f"{CHARTS_MIN_SIZE[0]:d}x{CHARTS_MIN_SIZE[1]:d}", timeout=4,
                        markup=False)

    def action_interval(self, step: int) -> None:
        new = self.interval_s = next_interval(self.interval_s, step)
        if self.source is not None:
            self.source.interval_s = new
        self.notify(f"polling every {new:g}s", timeout=2, markup=False)
        self._draw(force=True)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.HELP_KEYS))

    @on(FleetTable.RowSelected, "#fleet")
    def action_detail(self) -> None:
        row = self.table.selected_row
        if row is None or row.is_group or isinstance(self.screen, DetailScreen):
            return
        self.push_screen(self.selected_engine.detail_screen(row))

    def action_snapshot(self) -> None:
        states = self.states()
        self.snapshots.take(self.config.clock(), states,
                            {url: tracker.history for url, tracker in self.trackers.items()},
                            self.gpu_watch.views, self.gpu_watch.sources(states))

    # -- the end --------------------------------------------------------------------------

    def exit(self, *args: Any, **kwargs: Any) -> None:
        """Stop collecting first (q, SIGHUP, a lost terminal): with thousands of targets the
        poller's attempts fill the event loop, and shutting down waited behind them."""
        self._stop.set()
        super().exit(*args, **kwargs)

    def _fatal_error(self) -> None:
        """Textual's crash report prints every frame's locals, where a bearer token may sit;
        kvtop's (kvtop/crash.py) has none and goes to a file, named after the app exits."""
        error = sys.exc_info()[1] or self._exception or RuntimeError("unknown error")
        self.crash_line = write_crash_report(error)
        self.bell()
        self._close_messages_no_wait()

    async def on_unmount(self) -> None:
        self._stop.set()
        self.recording.close()  # a late scrape must not write


def run_app(config: AppConfig) -> int:
    """Run the terminal app until the user quits or the terminal goes away.

    Returns 0, 2 when the recording (``config.record``) can't be created, or 70 after a crash.
    """
    try:
        app = KvtopApp(config)
    except OSError as exc:
        warn(f"kvtop: can't record to {config.record}: {exc.strerror or exc}")
        return EXIT_USAGE
    app.watchdog.exit_deadline_s = TERMINAL_GONE_GRACE_S
    app.run()
    return app_exit_code(app)


def app_exit_code(app: App[Any]) -> int:
    """0 when the user quit; 70 when Textual stopped the app on an unhandled exception (it
    prints the traceback itself once the terminal is restored)."""
    if app.return_code:
        line = getattr(app, "crash_line", None) or "traceback above"
        print(display_text(f"kvtop: the app stopped on an internal error, a bug: {line}"),
              file=sys.stderr)
        return EXIT_INTERNAL
    return EXIT_OK

"""The kvtop terminal app: collection in workers, trackers fold scrapes, widgets draw states.

Scrapes arrive from a :class:`ScrapeSource` (the poller, or a replay) inside an async
worker and go to their target's tracker at once; drawing is coalesced to at most once per
redraw period, so ten hosts at 1 Hz cost one redraw a second, and a paused display keeps
collecting.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.events import Resize
from textual.widgets import Footer, Input

from kvtop.alerts import AlertEvent, AlertRunner
from kvtop.collect.gpu import GpuReading
from kvtop.collect.nvml import GpuReader, NvmlReader, NvmlUnavailable
from kvtop.collect.ownership import PortOwners
from kvtop.collect.reading import GPU_EXPORTER_KINDS
from kvtop.collect.source import ScrapeSource
from kvtop.collect.target import Scrape, Target
from kvtop.config import AlertSettings
from kvtop.crash import write_crash_report
from kvtop.derive.gpu_owners import (
    GpuMemoryHistory,
    GpuSource,
    GpuView,
    exporter_sources,
    gpu_views,
    local_ports,
    nvml_source,
    owned_memory,
    source_json,
    view_json,
)
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import EngineKey, TargetState, TargetTracker
from kvtop.exits import EXIT_INTERNAL, EXIT_OK, EXIT_USAGE
from kvtop.report.snapshot_files import SnapshotFiles, stamp, write_snapshot
from kvtop.safe_text import display_text, warn
from kvtop.store.recording import DEFAULT_MAX_BYTES, RecordingWriter
from kvtop.ui.screens.detail import DetailScreen
from kvtop.ui.screens.help import KEYS, HelpScreen
from kvtop.ui.screens.sort_menu import SortMenu
from kvtop.ui.widgets.engine_panel import EnginePanel
from kvtop.ui.widgets.fleet_table import FleetTable
from kvtop.ui.widgets.gpu_pane import GpuPane
from kvtop.ui.widgets.panes import EnginePanes
from kvtop.ui.widgets.summary import SummaryBar
from kvtop.view import format as fmt
from kvtop.view.engine import engine_view, group_view
from kvtop.view.fleet import (
    COLUMN_SORT,
    LARGE_FLEET,
    SORT_CYCLE,
    SORT_LABELS,
    TEXT_SORTS,
    FleetRow,
    LeakChange,
    RowCache,
    delta_cell,
    filter_rows,
    leak_changes,
    order_rows,
    stall_entries,
    summarise,
)
from kvtop.view.gpus import GpuTrails, failed_sources, gpu_note, owned_cell, pane_lines
from kvtop.view.groups import NONE, GroupRow, group_modes, group_rows, mode_label

if TYPE_CHECKING:
    from kvtop.baseline.overlay import Band, BaselineOverlay
    from kvtop.collect.reading import EngineReading

INTERVALS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
COMPACT_WIDTH = 120  # below this the detail's plots go one per row
# Below this size the engine's charts shrink to sparklines under the table (80x24 over ssh)
CHARTS_MIN_SIZE = (100, 30)
GRID2_SIZE = (120, 45)  # narrower and at least this tall: the small charts two by two
GPU_MIN_PERIOD_S = 2.0  # NVML reads are costly (gpustat#54); no need to go faster
TTY_CHECK_S = 2.0
TERMINAL_GONE_GRACE_S = 3.0  # then the process ends even if shutting down hangs
RECORD_FLUSH_S = 5.0  # a crash loses at most this much of a recording
LEAK_NOTIFY_S = {"leak": 30.0, "watch": 15.0}  # how long a leak alert stays up
FIRST_DATA_S = 0.05  # a host's first numbers show this soon; 500 first scrapes, a few draws

class Tracker(Protocol):
    """What the app needs of a tracker (:class:`TargetTracker` in production)."""

    state: TargetState
    history: dict[EngineKey, deque[EngineStats]]

    def update(self, scrape: Scrape) -> TargetState: ...

    @property
    def readings(self) -> dict[EngineKey, EngineReading]: ...


def _poller(config: AppConfig) -> ScrapeSource:
    from kvtop.collect.poller import Poller

    return Poller(config.targets, interval_s=config.interval_s, insecure=config.insecure,
                  narrow=not config.full_metrics)


@dataclass
class AppConfig:
    targets: list[Target]
    interval_s: float = 1.0
    no_gpu: bool = False
    snapshot_dir: Path = field(default_factory=Path.cwd)
    low_bandwidth: bool = False  # no charts, slower redraw
    insecure: bool = False  # passed to the default poller (self-signed TLS)
    full_metrics: bool = False  # the default poller reads every family, not only kvtop's
    history_s: float = 300.0  # span of the detail plots and of the snapshot's history
    source_factory: Callable[[AppConfig], ScrapeSource] = _poller
    tracker_factory: Callable[[Target], Tracker] = TargetTracker
    gpu_reader: GpuReader | None = None  # default: NVML
    clock: Callable[[], float] = time.time  # wall clock for ages; fixed in snapshot tests
    watch_tty: bool = True  # exit when the terminal goes away (ignored when headless)
    record: Path | None = None  # write every scrape to this recording while running
    record_max_bytes: int | None = DEFAULT_MAX_BYTES  # the recording stops there
    baseline: BaselineOverlay | None = None  # drawn in the panes and the Δ column
    alerts: AlertSettings = field(default_factory=AlertSettings)  # bell, command on LEAK/STALL


class KvtopApp(App[None]):
    CSS_PATH = "kvtop.tcss"
    TITLE = "kvtop"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [  # noqa: RUF012 - Textual's class-level binding list
        # The footer shows the few keys a newcomer needs at 80 columns; F1 lists them all.
        # htop's keys work too: F1 help, F3 search, F5 groups, F6 sort, F10 quit.
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),  # at once, as htop
        Binding("q", "quit", "Quit"),
        Binding("f10", "quit", "Quit", show=False),
        Binding("f1", "help", "Help", key_display="F1"),
        Binding("question_mark", "help", "Help", key_display="?", show=False),
        Binding("slash", "filter", "Search", key_display="/"),
        Binding("f3", "filter", "Search", show=False),
        Binding("f5", "group", "Groups", key_display="F5"),
        Binding("f6", "sort_menu", "Sort", key_display="F6"),
        Binding("o", "sort", "Sort", show=False),
        Binding("s", "snapshot", "Snapshot"),
        Binding("p", "pause", "Pause"),
        Binding("enter", "detail", "Detail", show=False),  # from the GPU pane too
        Binding("g", "toggle_gpu", "GPU", show=False),
        Binding("tab", "focus_next", "Pane", priority=True, show=False),
        Binding("plus,equals_sign", "interval(1)", "Interval+", key_display="+", show=False),
        Binding("minus", "interval(-1)", "Interval-", key_display="-", show=False),
        Binding("escape", "close_filter", show=False),
    ]
    HELP_KEYS = KEYS

    def __init__(self, config: AppConfig) -> None:
        super().__init__()
        self.config = config
        self.trackers = self._new_trackers()
        self.overlay = config.baseline if config.baseline else None
        self.source: ScrapeSource | None = None  # made in the worker: the poller's HTTP
        # stack takes a third of a second to import, after the first frame, not before it
        self._recorder = (
            RecordingWriter(config.record, interval_s=config.interval_s, targets=config.targets,
                            max_bytes=config.record_max_bytes)
            if config.record is not None
            else None
        )  # opened here so an unwritable path fails before the screen is taken over
        self._record_told = (False, False, False)  # recording trouble already notified
        self._leak_seen: dict[str, str] = {}  # row key -> last leak state told to the user
        self._stall_seen: dict[str, str] = {}  # row key -> last stall state
        self.interval_s = config.interval_s
        self.gpus: list[GpuReading] = []  # local, from NVML
        self.gpu_unavailable: str | None = None
        self._nvml_failed = False  # NVML there but broken, not merely absent
        self._gpu_reader = config.gpu_reader or NvmlReader()
        # Every GPU (NVML and exporters) with its owners, and what each server's GPUs use
        self.gpu_views: list[GpuView] = []
        self.owned_gpu_memory: dict[str, tuple[int | None, int | None]] = {}
        self._gpu_history = GpuMemoryHistory(config.history_s)
        self._failed_gpu_sources: list[GpuSource] = []
        self._pid_owners: dict[int, str] = {}  # local GPU process -> server URL
        self._port_owners = PortOwners()  # used by the GPU worker thread only
        self._gpus_changed = True  # the first frame already shows exporters' GPUs
        self._servers_changed = True  # a new server or exporter: owners at once
        self._gpus_refreshed = float("-inf")  # monotonic time of the last refresh
        self._nvml_answered = config.no_gpu  # until then "no GPU found" would be a guess
        self._stop = asyncio.Event()
        self._paused = False
        self.crash_line: str | None = None  # set by _fatal_error: what went wrong, and where
        self._sort_key = "name"
        self._sort_reverse = False
        self._sort_chosen = False  # until a sort is chosen, the fleet's size picks the order
        self._group_mode = NONE
        self._collapsed: set[str] = set()  # aggregate rows' keys of closed groups
        self._gpu_wanted = True  # `g` hides the GPU pane
        self._gpu_trails = GpuTrails(config.history_s)
        self._alerts = AlertRunner(config.alerts)
        self._row_cache = RowCache()
        self._filter = ""
        self._draw_timer_armed = False
        self._soon_armed = False
        self._last_draw = float("-inf")
        self._parent_pid = os.getppid()
        self.exit_deadline_s: float | None = None  # set by run_app: see _exit_soon

    # -- layout ---------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        self._lay_out(*self.size)  # before the widgets exist: they are styled once, not twice
        yield SummaryBar(id="summary")
        with Vertical(id="body"):
            yield FleetTable(id="fleet")
            yield EnginePanel(id="engine")  # small terminals: sparklines
            yield EnginePanes(GpuPane(id="gpu"), id="panes")  # the charts
        yield Input(placeholder="search: words that every row shown must contain", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        # Held, not queried: app queries look at the active screen, which may be the detail.
        self.table = self.query_one(FleetTable)
        self.summary = self.query_one(SummaryBar)
        self.gpu_pane = self.query_one(GpuPane)
        self.engine_panel = self.query_one(EnginePanel)
        self.panes = self.query_one(EnginePanes)
        self.filter_box = self.query_one("#filter", Input)
        self.gpu_pane.display = False  # until some GPU is known
        self.table.focus()
        self._draw()
        self.call_after_refresh(self._collect)  # the first frame (the hosts) is painted first
        self._tick()
        if not self.config.no_gpu:
            self._read_gpus(self._local_ports())
        if self.config.watch_tty and not self.is_headless:
            self._watch_terminal()
        if self._recorder is not None:
            self.set_interval(RECORD_FLUSH_S, self._flush_recording, name="record-flush")

    def on_resize(self, event: Resize) -> None:
        self._lay_out(event.size.width, event.size.height)

    def _lay_out(self, width: int, height: int) -> None:
        """Charts where they fit, sparklines under the table where they don't; whichever
        is shown now is drawn now (a chart takes its new size at once by itself)."""
        min_w, min_h = CHARTS_MIN_SIZE
        sparks = width < min_w or height < min_h or self.config.low_bandwidth
        changed = not self.has_class("-sparks" if sparks else "-charts")
        self.update_classes({  # one restyle of the screen for them all
            "compact": width < COMPACT_WIDTH, "-sparks": sparks, "-charts": not sparks,
            "-grid2": width < GRID2_SIZE[0] and height >= GRID2_SIZE[1]})
        if changed and hasattr(self, "table"):
            self.call_after_refresh(self._redraw_panel)

    @property
    def charts_shown(self) -> bool:
        return not self.has_class("-sparks")

    @property
    def redraw_s(self) -> float:
        """Numbers follow the poll interval; --low-bandwidth redraws at most every 2 s."""
        if self.config.low_bandwidth:
            return max(2.0, 2 * self.interval_s)
        return self.interval_s

    # -- collection ---------------------------------------------------------------------

    def _new_trackers(self) -> dict[str, Tracker]:
        return {t.url: self.config.tracker_factory(t) for t in self.config.targets}

    def reset_trackers(self) -> None:
        """Start every tracker afresh (a replay rewound): history, rates and leak evidence
        are then rebuilt from the re-delivered scrapes by the same code as live."""
        self.trackers = self._new_trackers()
        self._leak_seen.clear()
        if self.overlay is not None:
            self.overlay.clear()
        self._stall_seen.clear()

    @work(group="collect", exit_on_error=False)
    async def _collect(self) -> None:
        source = self.source = self.config.source_factory(self.config)
        source.interval_s = self.interval_s  # `+`/`-` may have come first
        if hasattr(source, "__aenter__"):
            async with source:  # type: ignore[attr-defined]
                await source.run(self.on_scrape, stop=self._stop)
        else:
            await source.run(self.on_scrape, stop=self._stop)

    def on_scrape(self, scrape: Scrape) -> None:
        """Fold a scrape into its tracker now (even when paused); draw later, coalesced."""
        tracker = self.trackers.get(scrape.target.url)
        if tracker is None:  # a server the source discovered after start (Prometheus)
            tracker = self.trackers[scrape.target.url] = self.config.tracker_factory(
                scrape.target)
        first = tracker.state.status == "pending"
        state = tracker.update(scrape)  # drops a scrape older than one already folded
        if self.overlay is not None and scrape.ok and state.last_good_t == scrape.t:
            self.overlay.observe(scrape.target.url, scrape.t, state.engines, tracker.readings)
        if first:
            self._servers_changed = True  # a new server to own GPUs, or new GPUs
        elif tracker.state.kind in GPU_EXPORTER_KINDS:
            self._gpus_changed = True
        if self._recorder is not None:
            self._recorder.write(scrape)  # never raises: trouble shows in the status line
            self._tell_recording_trouble()
        if first and not self._paused:
            self._draw_soon()
        else:
            self._request_draw()

    def _local_ports(self) -> dict[int, str]:
        return local_ports(tracker.state.target for tracker in self.trackers.values())

    @work(thread=True, group="gpu", exclusive=True, exit_on_error=False)
    def _read_gpus(self, ports: dict[int, str]) -> None:
        """NVML, and which server each GPU process belongs to (/proc, cached), in a thread:
        a slow driver call never freezes the screen."""
        try:
            gpus = self._gpu_reader.read()
        except NvmlUnavailable as exc:
            self.call_from_thread(self._gpu_failed, exc.reason)
            return
        except Exception as exc:  # a driver error must not take the app down
            self.call_from_thread(self._gpu_failed, f"{type(exc).__name__}: {exc}", True)
            return
        pids = [process.pid for gpu in gpus for process in gpu.processes]
        try:
            owners = self._port_owners.owners(pids, ports) if pids else {}
        except Exception:  # /proc surprises cost the owner column, never the GPU pane
            owners = {}
        self.call_from_thread(self._gpus_read, gpus, owners)

    def _gpus_read(self, gpus: list[GpuReading], owners: dict[int, str] | None = None) -> None:
        self.gpus = gpus
        self._pid_owners = owners or {}
        self._nvml_answered = True
        self._refresh_gpus()
        # One read at a time, re-armed after each (dolphie's pattern): reads never pile up.
        self.set_timer(max(GPU_MIN_PERIOD_S, self.interval_s),
                       lambda: self._read_gpus(self._local_ports()))

    def _gpu_failed(self, reason: str, failed: bool = False) -> None:
        self.gpu_unavailable = reason
        self._nvml_failed = failed
        self._nvml_answered = True
        self._refresh_gpus()

    def _refresh_gpus(self) -> None:
        """Work out every GPU's owners again (new GPU readings or servers), remember what
        each server's GPUs use, and show it."""
        self._gpus_changed = self._servers_changed = False
        self._gpus_refreshed = time.monotonic()
        if not self._on_screen():
            return
        states = self.states()
        owners_before = self.owned_gpu_memory.keys()
        self.gpu_views = gpu_views(self.gpus, self._pid_owners, states)
        self.owned_gpu_memory = owned_memory(self.gpu_views)
        self._gpu_history.record(self.config.clock(), self.owned_gpu_memory)
        self._gpu_trails.record(self.config.clock(), self.gpu_views)
        self._failed_gpu_sources = failed_sources(exporter_sources(states))
        if not self._paused:
            self._show_gpu_pane()
            if self.owned_gpu_memory.keys() != owners_before:
                self._draw_soon()  # a server's GPU column and line appear now, not next tick

    def _show_gpu_pane(self) -> None:
        """Beside the KV chart while some GPU is known (NVML's absence is a note in the
        header, not a pane)."""
        pane = self.gpu_pane
        pane.display = bool(self.gpu_views or self._failed_gpu_sources) and self._gpu_wanted
        if pane.display:
            views, failed, now = self.gpu_views, self._failed_gpu_sources, self.config.clock()
            pane.show(lambda cells: pane_lines(views, None, failed, trails=self._gpu_trails,
                                               now=now, cells=cells))

    # -- recording ------------------------------------------------------------------------

    def _flush_recording(self) -> None:
        if self._recorder is not None:
            self._recorder.flush()
            self._tell_recording_trouble()

    def _tell_recording_trouble(self) -> None:
        """A toast when writing starts failing, the size limit is reached or the end is
        lost; the status line then shows it for as long as the app runs."""
        recorder = self._recorder
        assert recorder is not None
        now = (recorder.failing, recorder.full, recorder.end_lost)
        if any(new and not old for new, old in zip(now, self._record_told, strict=True)):
            self.notify(display_text(f"{recorder.path}: {recorder.status()}"),
                        title="Recording", severity="error", timeout=10, markup=False)
            self._request_draw()
        self._record_told = now

    def recording_status(self) -> str | None:
        """None when not recording, "" while all is well, else what went wrong."""
        if self._recorder is None:
            return None
        return self._recorder.status() or ""

    # -- drawing --------------------------------------------------------------------------

    def _request_draw(self) -> None:
        """Draw now if the last draw is a period old, else once when the period ends."""
        if self._draw_timer_armed:
            return
        wait = self._last_draw + self.redraw_s - time.monotonic()
        if wait <= 0:
            self._draw()
            return
        self._draw_timer_armed = True
        self.set_timer(wait, self._timed_draw)

    def _draw_soon(self) -> None:
        """A host's first data is shown at once, with the other first scrapes that come
        in the same moment (a big fleet's start would otherwise draw once per host)."""
        if not self._soon_armed:
            self._soon_armed = True
            self.set_timer(FIRST_DATA_S, self._soon_draw)

    def _soon_draw(self) -> None:
        self._soon_armed = False
        if not self._paused:
            self._draw()

    def _tick(self) -> None:
        """Redraw each period even without scrapes, so ages ("stale 12s") keep counting."""
        self._request_draw()
        self.set_timer(self.redraw_s, self._tick)

    def _timed_draw(self) -> None:
        self._draw_timer_armed = False
        self._draw()

    def states(self) -> list[TargetState]:
        return [t.state for t in self.trackers.values()]

    def _on_screen(self) -> bool:
        """False once the app is shutting down: a scrape or GPU read that lands then must
        not paint widgets already taken off the screen."""
        return bool(self.screen_stack) and self.summary.is_attached

    def _draw(self, *, force: bool = False) -> None:
        if not self._on_screen():
            return
        states = self.states()
        self._tell_leak_changes(states)  # alerts are not display: they come even when paused
        gpus_due = time.monotonic() - self._gpus_refreshed >= GPU_MIN_PERIOD_S
        if self._servers_changed or (self._gpus_changed and gpus_due):
            self._refresh_gpus()  # GPU memory history is collection too: even when paused
        if self._paused and not force:
            return
        self._last_draw = time.monotonic()
        now = self.config.clock()
        rows = self._row_cache.rows(states, now)
        if not self._sort_chosen:
            self._sort_key = "worst" if len(rows) > LARGE_FLEET else "name"
        rows = filter_rows(rows, self._filter)  # the header counts what is shown
        self._set_gpu_cells(rows)
        self._set_delta_cells(rows)
        ordered = order_rows(rows, self._sort_key, self._sort_reverse)
        self.table.show(group_rows(ordered, self._group_mode, self._collapsed, self._sort_key,
                                   self._sort_reverse))
        self.table.show_sort(self._sort_column(),
                             (self._sort_key in TEXT_SORTS) != self._sort_reverse)
        self._show_panel(self.table.selected_row, now)
        self.summary.show(
            summarise(rows),
            interval_s=self.interval_s,
            sort_label=self._sort_label(),
            filter_text=self._filter,
            paused=self._paused,
            recording=self.recording_status(),
            group_label="" if self._group_mode == NONE else mode_label(self._group_mode),
            gpu_note=None if self.config.no_gpu else gpu_note(
                self.gpu_unavailable, self._failed_gpu_sources, bool(self.gpu_views)),
        )
        if isinstance(self.screen, DetailScreen):
            self.screen.show(now)

    def _sort_column(self) -> str:
        return next((c for c, k in COLUMN_SORT.items() if k == self._sort_key), self._sort_key)

    def _sort_label(self) -> str:
        natural = "A-Z" if self._sort_key in TEXT_SORTS else "↓"
        turned = "Z-A" if self._sort_key in TEXT_SORTS else "↑"
        return f"{SORT_LABELS[self._sort_key]} {turned if self._sort_reverse else natural}"

    def _set_gpu_cells(self, rows: list[FleetRow]) -> None:
        """The GPU column: shown once some server owns a GPU."""
        owned = self.owned_gpu_memory
        if owned or self.table.columns_with_gpu:
            for row in rows:
                row.set_gpu(owned_cell(owned.get(row.url)))
        self.table.show_gpu_column(bool(owned))

    def _set_delta_cells(self, rows: list[FleetRow]) -> None:
        """The Δ column: the last minutes against each engine's baseline (--baseline)."""
        overlay = self.overlay
        self.table.show_delta_column(overlay is not None)
        if overlay is not None:
            for row in rows:
                if row.engine is not None:
                    row.set_delta(delta_cell(overlay.delta(row.url, row.engine)))

    def _band(self, url: str, engine: EngineKey | None) -> Band | None:
        if self.overlay is None or engine is None:
            return None
        return self.overlay.band(url, engine)

    def _history(self, row: FleetRow | None) -> list[EngineStats]:
        """The row's engine's history; a server down long enough to lose its engines
        keeps showing the history it had."""
        tracker = self.trackers.get(row.url) if row is not None else None
        if tracker is None or row is None:
            return []
        key = row.engine if row.engine is not None else next(iter(tracker.history), None)
        return list(tracker.history.get(key, ())) if key is not None else []

    def _show_panel(self, row: FleetRow | None, now: float) -> None:
        group = row if isinstance(row, GroupRow) else None
        if group is not None:  # a group shows its worst member's panes
            row = max(group.members, key=lambda m: m.sort_value("worst") or -1.0)
        tracker = self.trackers.get(row.url) if row is not None else None
        url = row.url if row is not None else ""
        charts = self.charts_shown
        view = engine_view(row, tracker.state if tracker else None, self._history(row), now,
                           self.config.history_s, gpu=self.owned_gpu_memory.get(url),
                           with_gpu=charts and bool(self.gpu_views),
                           band=self._band(url, row.engine if row is not None else None))
        if group is not None:
            view = group_view(group, view)
        if charts:
            self.panes.show(view)
            return
        self.engine_panel.show(view, gpu_series=self._gpu_history.series(url),
                               gpu_owned=self.owned_gpu_memory.get(url), now=now,
                               span_s=self.config.history_s,
                               charts=not self.config.low_bandwidth)

    def _redraw_panel(self) -> None:
        if self._on_screen():
            self._show_panel(self.table.selected_row, self.config.clock())
            self._show_gpu_pane()

    @on(FleetTable.RowHighlighted, "#fleet")
    def _row_highlighted(self, event: FleetTable.RowHighlighted) -> None:
        if type(event) is FleetTable.RowHighlighted and not self._paused:
            self._show_panel(self.table.selected_row, self.config.clock())

    @on(FleetTable.HeaderClicked, "#fleet")
    def _header_clicked(self, event: FleetTable.HeaderClicked) -> None:
        key = COLUMN_SORT.get(event.column, event.column)
        if key in SORT_LABELS:
            self.sort_by(key)

    @on(FleetTable.GroupToggled, "#fleet")
    def _group_toggled(self, event: FleetTable.GroupToggled) -> None:
        closed = event.key in self._collapsed
        if event.open is None or event.open == closed:
            self._collapsed.symmetric_difference_update({event.key})
            self._draw(force=True)

    def sort_by(self, key: str, reverse: bool | None = None) -> None:
        """Sort by ``key``; the key already sorted by again turns the order round."""
        if reverse is None:
            reverse = not self._sort_reverse if key == self._sort_key else False
        self._sort_key, self._sort_reverse, self._sort_chosen = key, reverse, True
        self._draw(force=True)

    def _tell_leak_changes(self, states: list[TargetState]) -> None:
        changes, self._leak_seen = leak_changes(states, self._leak_seen)
        for change in changes:
            self._notify_leak(change)
        entered = [change for change in changes if change.verdict.state == "leak"]
        events = [self._leak_event(change, states) for change in entered]
        stalled, self._stall_seen = stall_entries(states, self._stall_seen)
        for entry in stalled:
            assert entry.stats.stall is not None
            self.notify(f"{entry.name}: {display_text(entry.stats.stall.reason)}", title="STALLED",
                        severity="error", timeout=LEAK_NOTIFY_S["leak"], markup=False)
            events.append(AlertEvent("stall", entry.key, entry.name, entry.state, entry.stats,
                                     self.config.clock()))
        if events:
            self._alert(events)

    def _leak_event(self, change: LeakChange, states: list[TargetState]) -> AlertEvent:
        state, stats = next((state, stats) for state in states for stats in state.engines
                            if stats.leak is change.verdict)
        return AlertEvent("leak", change.key, change.name, state, stats, self.config.clock())

    def _alert(self, events: list[AlertEvent]) -> None:
        """A bell for the lot, and the configured command for each (rate-limited)."""
        if self.config.alerts.bell:
            self.bell()
        for event in events:
            if self._alerts.due(event):
                self._run_alert(event)

    @work(group="alerts", exit_on_error=False)
    async def _run_alert(self, event: AlertEvent) -> None:
        try:
            failure = await self._alerts.run(event)
        except Exception as exc:  # an alert command must never take the app down
            failure = display_text(f"alert command: {type(exc).__name__}: {exc}", 300)
        if failure is not None:
            self.notify(failure, title="Alert command failed", severity="error", timeout=10,
                        markup=False)

    def _notify_leak(self, change: LeakChange) -> None:
        verdict = change.verdict
        state = verdict.state
        if state in ("leak", "watch"):
            slope = verdict.slope_blocks_per_hour
            trend = f" ({fmt.slope(slope)})" if slope else ""
            self.notify(f"{change.name}: {verdict.reason}{trend}",
                        title=f"KV {state.upper()}",
                        severity="error" if state == "leak" else "warning",
                        timeout=LEAK_NOTIFY_S[state], markup=False)
        else:
            self.notify(f"{change.name}: {verdict.reason}", title="KV leak indicator cleared",
                        markup=False)  # the name is a row's (safe) text, not markup

    # -- actions ------------------------------------------------------------------------

    def action_pause(self) -> None:
        self._paused = not self._paused
        self._draw(force=True)  # shows PAUSED, or catches up on resume
        if not self._paused:
            self._show_gpu_pane()

    def action_sort(self) -> None:
        """`o`: the next of the usual sort keys."""
        cycle = SORT_CYCLE
        index = cycle.index(self._sort_key) if self._sort_key in cycle else -1
        self.sort_by(cycle[(index + 1) % len(cycle)], reverse=False)

    def action_sort_menu(self) -> None:
        if not isinstance(self.screen, SortMenu):
            self.push_screen(SortMenu(self._sort_key, self._sort_reverse), self._sort_chosen_in)

    def _sort_chosen_in(self, key: str | None) -> None:
        if key is not None:
            self.sort_by(key)

    def action_group(self) -> None:
        """F5: no groups, config group, model, then each Prometheus label, like htop's tree."""
        modes = group_modes(self.table.rows if self._group_mode == NONE else
                            self._row_cache.rows(self.states(), self.config.clock()))
        index = modes.index(self._group_mode) if self._group_mode in modes else -1
        self._group_mode = modes[(index + 1) % len(modes)]
        label = "off" if self._group_mode == NONE else f"by {mode_label(self._group_mode)}"
        self.notify(f"groups {label}", timeout=2)
        self._draw(force=True)

    def action_filter(self) -> None:
        box = self.filter_box
        box.display = True
        box.value = self._filter
        box.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self._filter = event.value.strip()
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
        elif self._filter:
            self._filter = ""
            self._draw(force=True)

    def action_toggle_gpu(self) -> None:
        if self.config.no_gpu:
            self.notify("GPU pane off (--no-gpu)")
            return
        self._gpu_wanted = not self._gpu_wanted
        self._show_gpu_pane()
        if not self.charts_shown:
            self.notify("the GPU pane is beside the KV chart: a terminal of at least "
                        f"{CHARTS_MIN_SIZE[0]}x{CHARTS_MIN_SIZE[1]}", timeout=4)

    def action_interval(self, step: int) -> None:
        position = min(range(len(INTERVALS)), key=lambda i: abs(INTERVALS[i] - self.interval_s))
        new = INTERVALS[min(max(position + step, 0), len(INTERVALS) - 1)]
        self.interval_s = new
        if self.source is not None:
            self.source.interval_s = new
        self.notify(f"polling every {new:g}s", timeout=2)
        self._draw(force=True)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.HELP_KEYS))

    @on(FleetTable.RowSelected, "#fleet")
    def action_detail(self) -> None:
        row = self.table.selected_row
        if row is None or row.is_group or isinstance(self.screen, DetailScreen):
            return

        def source() -> tuple[TargetState, list[EngineStats], EngineKey | None]:
            tracker = self.trackers[row.url]  # looked up each time: a rewind replaces it
            state = tracker.state
            key = row.engine
            if key is None and state.engines:  # chosen while pending or down: show what came
                key = (state.engines[0].model, state.engines[0].engine)
            if key is None:  # down long enough to lose its engines: its history stays
                key = next(iter(tracker.history), None)
            history = list(tracker.history.get(key, ())) if key else []
            return state, history, key

        self.push_screen(DetailScreen(
            source, clock=self.config.clock, span_s=self.config.history_s,
            charts=not self.config.low_bandwidth, band=lambda: self._band(row.url, source()[2]),
        ))

    # -- snapshot -------------------------------------------------------------------------

    def action_snapshot(self) -> None:
        """Gather everything on the UI thread (consistent), write it in a thread."""
        from kvtop.report.snapshot import snapshot_document

        now = self.config.clock()
        taken_at = datetime.fromtimestamp(now, tz=timezone.utc)
        states = self.states()
        history = {
            url: {
                key: [s for s in series if now - s.t <= self.config.history_s]
                for key, series in tracker.history.items()
            }
            for url, tracker in self.trackers.items()
        }
        sources = exporter_sources(states)
        if not self.config.no_gpu:
            sources.insert(0, nvml_source(len(self.gpus), self.gpu_unavailable,
                                          failed=self._nvml_failed))
        document = snapshot_document(
            states, [view_json(view) for view in self.gpu_views], taken_at=taken_at,
            history=history, gpu_sources=[source_json(source) for source in sources],
        )
        bodies = [(s.target.label, s.last_body) for s in states if s.last_body is not None]
        svg = self.export_screenshot(title=f"kvtop {stamp(taken_at)}")
        self._write_snapshot(SnapshotFiles(taken_at, document, bodies, svg))

    @work(thread=True, group="snapshot", exit_on_error=False)
    def _write_snapshot(self, files: SnapshotFiles) -> None:
        folder = self.config.snapshot_dir
        try:
            path = write_snapshot(folder, files)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            self.call_from_thread(
                self.notify,
                display_text(f"Snapshot not written: {folder} ({reason})"),
                severity="error",
                timeout=8,
                markup=False,
            )
            return
        self.call_from_thread(self.notify, display_text(f"Snapshot saved to {path}"),
                              timeout=6, markup=False)

    # -- terminal going away --------------------------------------------------------------

    def _watch_terminal(self) -> None:
        """Exit on SIGHUP or a lost TTY instead of spinning as an orphan (dolphie#101)."""
        loop = asyncio.get_running_loop()

        def hung_up(signum: int, frame: object) -> None:
            # a plain handler, not the loop's: it runs at once even when thousands of
            # targets keep the loop busy, and the exit deadline starts now
            self._exit_soon()
            loop.call_soon_threadsafe(self._terminal_gone)

        with contextlib.suppress(ValueError):  # not the main thread (tests)
            signal.signal(signal.SIGHUP, hung_up)
        self.set_interval(TTY_CHECK_S, self._check_terminal, name="tty-watchdog")

    def _check_terminal(self) -> None:
        try:
            attached = sys.stdin.isatty()
        except (ValueError, OSError):  # stdin closed
            attached = False
        if not attached or os.getppid() != self._parent_pid:
            self._terminal_gone()

    def _terminal_gone(self) -> None:
        if self._recorder is not None:
            self._recorder.flush()
        self._exit_soon()
        self.exit()

    def _exit_soon(self) -> None:
        """When this app owns the process (run_app), end it in ``exit_deadline_s`` whatever
        happens: with the terminal gone, Textual's shutdown writes to it, and that write
        could block for good (seen with 10,000 targets in tmux). A normal exit before then
        ends the process as usual."""
        if self.exit_deadline_s is not None:
            force = threading.Timer(self.exit_deadline_s, os._exit, (0,))
            force.daemon = True
            force.start()

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
        recorder, self._recorder = self._recorder, None  # a late scrape must not write
        if recorder is not None:
            recorder.close()


def run_app(config: AppConfig) -> int:
    """Run the terminal app until the user quits or the terminal goes away.

    Returns 0, 2 when the recording (``config.record``) can't be created, or 70 after a crash.
    """
    try:
        app = KvtopApp(config)
    except OSError as exc:
        warn(f"kvtop: can't record to {config.record}: {exc.strerror or exc}")
        return EXIT_USAGE
    app.exit_deadline_s = TERMINAL_GONE_GRACE_S
    app.run()
    return app_exit_code(app)


def app_exit_code(app: App[object]) -> int:
    """0 when the user quit; 70 when Textual stopped the app on an unhandled exception (it
    prints the traceback itself once the terminal is restored)."""
    if app.return_code:
        line = getattr(app, "crash_line", None) or "traceback above"
        print(f"kvtop: the app stopped on an internal error, a bug: {line}", file=sys.stderr)
        return EXIT_INTERNAL
    return EXIT_OK

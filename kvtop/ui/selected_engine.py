"""The engine the table's cursor is on, shown under the table: its charts (sparklines on a
small terminal) with its baseline band and what its server's GPUs use; a group's row shows
its worst member (what needs a look). The detail screen follows the same engine. A server
down long enough to lose its engines keeps showing the history it had."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from kvtop.ui.screens.detail import DetailScreen, DetailSource
from kvtop.view.engine import engine_view, group_view, no_match_view
from kvtop.view.groups import GroupRow

if TYPE_CHECKING:
    from kvtop.baseline.overlay import Band, BaselineOverlay
    from kvtop.derive.stats import EngineStats
    from kvtop.derive.tracker import EngineKey, TargetState
    from kvtop.ui.gpu_watch import GpuWatch
    from kvtop.ui.widgets.engine_panel import EnginePanel
    from kvtop.ui.widgets.panes import EnginePanes
    from kvtop.view.fleet import FleetRow


class Followed(Protocol):
    """What the panes need of a tracker."""

    @property
    def state(self) -> TargetState: ...

    @property
    def history(self) -> Mapping[EngineKey, Sequence[EngineStats]]: ...


class SelectedEngine:
    def __init__(self, trackers: Callable[[], Mapping[str, Followed]], gpu_watch: GpuWatch,
                 overlay: BaselineOverlay | None, *, clock: Callable[[], float], span_s: float,
                 charts: bool, interval_s: Callable[[], float]) -> None:
        """``trackers`` is asked each time (a replay's rewind replaces them); ``charts``:
        False with --low-bandwidth (numbers and verdicts, no sparklines nor plots)."""
        self._trackers = trackers
        self._interval_s = interval_s
        self._gpus = gpu_watch
        self._overlay = overlay
        self._clock = clock
        self._span_s = span_s
        self._charts = charts
        self._panes: EnginePanes | None = None
        self._panel: EnginePanel | None = None

    def attach(self, panes: EnginePanes, panel: EnginePanel) -> None:
        """Where to draw: the charts, or the small terminal's panel."""
        self._panes, self._panel = panes, panel

    def show(self, row: FleetRow | None, now: float, *, charts: bool, search: str = "") -> None:
        """``search``: the search now (a search that leaves no row says so)."""
        group = row if isinstance(row, GroupRow) else None
        if group is not None:
            row = max(group.members, key=lambda m: m.sort_value("worst") or -1.0)
        tracker = self._trackers().get(row.url) if row is not None else None
        url = row.url if row is not None else ""
        owned = self._gpus.owned.get(url)
        view = engine_view(row, tracker.state if tracker else None, self._history(row), now,
                           self._span_s, gpu=owned, with_gpu=charts and bool(self._gpus.views),
                           band=self.band(url, row.engine if row is not None else None),
                           interval_s=self._interval_s())
        if group is not None:
            view = group_view(group, view)
        elif row is None and search:
            view = no_match_view(search)
        if charts:
            assert self._panes is not None
            self._panes.show(view)
            return
        assert self._panel is not None
        self._panel.show(view, gpu_series=self._gpus.history.series(url), gpu_owned=owned,
                         now=now, span_s=self._span_s, charts=self._charts)

    def band(self, url: str, engine: EngineKey | None) -> Band | None:
        """The engine's baseline (--baseline), drawn in its KV chart."""
        if self._overlay is None or engine is None:
            return None
        return self._overlay.band(url, engine)

    def detail_screen(self, row: FleetRow) -> DetailScreen:
        """The detail screen of ``row``'s engine, which follows it at each redraw."""
        source = self._detail_source(row)
        return DetailScreen(source, clock=self._clock, span_s=self._span_s, charts=self._charts,
                            band=lambda: self.band(row.url, source()[2]))

    def _detail_source(self, row: FleetRow) -> DetailSource:
        def source() -> tuple[TargetState, list[EngineStats], EngineKey | None]:
            tracker = self._trackers()[row.url]  # looked up each time: a rewind replaces it
            state = tracker.state
            key = row.engine
            if key is None and state.engines:  # chosen while pending or down: show what came
                key = (state.engines[0].model, state.engines[0].engine)
            if key is None:  # down long enough to lose its engines: its history stays
                key = next(iter(tracker.history), None)
            history = list(tracker.history.get(key, ())) if key else []
            return state, history, key

        return source

    def _history(self, row: FleetRow | None) -> list[EngineStats]:
        tracker = self._trackers().get(row.url) if row is not None else None
        if tracker is None or row is None:
            return []
        key = row.engine if row.engine is not None else next(iter(tracker.history), None)
        return list(tracker.history.get(key, ())) if key is not None else []

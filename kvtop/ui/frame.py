"""One frame of the main screen, painted from what the app holds: the rows the view state
asks for (searched, sorted, grouped) with their GPU and baseline cells, the header's sums
over the whole fleet (a search says how many rows it shows, never narrows the header), the
selected engine's panes, and the GPU pane. When to paint is the
draw clock's business; the painter only reads what it is given and feeds the widgets."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtop.view.cells import delta_cell
from kvtop.view.fleet import FleetRow, RowCache
from kvtop.view.fleet_summary import summarise
from kvtop.view.gpus import owned_cell, pane_lines

if TYPE_CHECKING:
    from kvtop.baseline.overlay import BaselineOverlay
    from kvtop.derive.tracker import TargetState
    from kvtop.ui.gpu_watch import GpuWatch
    from kvtop.ui.selected_engine import SelectedEngine
    from kvtop.ui.widgets.fleet_table import FleetTable
    from kvtop.ui.widgets.gpu_pane import GpuPane
    from kvtop.ui.widgets.summary import SummaryBar
    from kvtop.view.view_state import ViewState


class FramePainter:
    def __init__(self, view: ViewState, gpu_watch: GpuWatch, selected: SelectedEngine,
                 overlay: BaselineOverlay | None) -> None:
        self._view = view
        self._gpus = gpu_watch
        self._selected = selected
        self._overlay = overlay
        self._row_cache = RowCache()
        self._table: FleetTable | None = None
        self._summary: SummaryBar | None = None
        self._gpu_pane: GpuPane | None = None

    def attach(self, table: FleetTable, summary: SummaryBar, gpu_pane: GpuPane) -> None:
        self._table, self._summary, self._gpu_pane = table, summary, gpu_pane

    def rows(self, states: list[TargetState], now: float) -> list[FleetRow]:
        """Every row, before the search (rebuilt only for targets scraped since)."""
        return self._row_cache.rows(states, now)

    def paint(self, states: list[TargetState], now: float, *, charts: bool, interval_s: float,
              recording: str | None) -> None:
        """``charts``: the selected engine as charts (else sparklines); ``recording``: the
        recording's status for the header (None: not recording)."""
        assert self._table is not None and self._summary is not None
        view, table = self._view, self._table
        every = self.rows(states, now)
        rows = view.shown(every)
        self._set_gpu_cells(table, rows)
        self._set_delta_cells(table, rows)
        table.show(view.arrange(rows))
        table.show_sort(view.sort_column, view.ascending)
        self._selected.show(table.selected_row, now, charts=charts, search=view.filter_text)
        self._summary.show(
            summarise(every), interval_s=interval_s, sort_label=view.sort_label,
            filter_text=view.filter_text, shown=(len(rows), len(every)), paused=view.paused,
            recording=recording, group_label=view.group_label, gpu_note=self._gpus.note())

    def show_gpu_pane(self, now: float) -> None:
        """Beside the KV chart while some GPU is known (NVML's absence is a note in the
        header, not a pane)."""
        assert self._gpu_pane is not None
        pane, watch = self._gpu_pane, self._gpus
        pane.display = bool(watch.views or watch.failed_sources) and self._view.gpu_wanted
        if pane.display:
            views, failed = watch.views, watch.failed_sources
            pane.show(lambda cells: pane_lines(views, failed, trails=watch.trails,
                                               now=now, cells=cells))

    def _set_gpu_cells(self, table: FleetTable, rows: list[FleetRow]) -> None:
        """The GPU column: shown once some server owns a GPU."""
        owned = self._gpus.owned
        if owned or table.columns_with_gpu:
            for row in rows:
                row.set_gpu(owned_cell(owned.get(row.url)))
        table.show_gpu_column(bool(owned))

    def _set_delta_cells(self, table: FleetTable, rows: list[FleetRow]) -> None:
        """The Δ column: the last minutes against each engine's baseline (--baseline)."""
        overlay = self._overlay
        table.show_delta_column(overlay is not None)
        if overlay is not None:
            for row in rows:
                if row.engine is not None:
                    row.set_delta(delta_cell(overlay.delta(row.url, row.engine)))
